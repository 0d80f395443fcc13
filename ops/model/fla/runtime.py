"""The streaming runtime of an fla checkpoint: one chunk at a time, carried per-layer state, no
torch.

    model = load_model("path/to/folder")              # linstream.ops.model.fla.load_model
    states = model.initial_states()                   # L × LayerState, float64 zeros
    emb, states = model.embed_chunk(tokens, states)   # emb [T, hidden]: the final-norm output

The blocks are the family's (`block.Block`; fla's standard block by default: RMSNorm → token
mixer → residual add → RMSNorm → SwiGLU MLP → residual add), each chunk's forward handing one
`carry` dict through them in order; the family's final norm follows the last block.
`hidden_states` gives every layer's output as fla's `output_hidden_states` does (the
embeddings, the outputs of blocks 0..L−2, the final-norm output of block L−1), and
`embed_chunk(..., layer=N)` one of them.
Embedding a sequence chunk by chunk gives the same outputs as in one piece, for any split: the
states carry everything the past contributes (the recurrent states, the short convolutions' last
inputs, the position).  Products are `dense.Dense` in the compute mode (float32 by default,
float64, or bfloat16: weights held in 16 bits, float32 activations; `dense`, `bf16`), with BLAS
held at one thread and a long chunk's rows in ranges
fixed by its length, run on the process's threads (`linstream.ops.model.blas`, shared with the
built-in model: the bits do not depend on the thread count, and on a shared machine no call
waits for a thread that is not running); the recurrences are the Numba CPU kernels of
`linstream.ops`.  With backend "cupy" (or "auto" where a CUDA device is usable) the same blocks,
built a second time on the device at its first forward there, run the CuPy kernels and cuBLAS
products (`device`, `compute`); states in and out stay host `LayerState`s, so a sequence moves
between host and device from one chunk to the next.  Without a device, "cupy" raises
`BackendUnavailableError` saying why.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from linstream.ops.backend import resolve_backend
from linstream.ops.model.blas import _thread_layout
from linstream.ops.model.protocol import check_token_ids

from .block import Block, Norm, held_arrays
from .config import FlaConfig, ModelFolderError
from .dense import split_rows
from .state import LayerState, StateSpec, stack_states, stacked_layout, unstack_states

__all__ = ["FlaModel", "LoadReport"]

HOST_BACKENDS = ("numba", "numpy")
BACKENDS = ("auto", "numba", "numpy", "cupy")

#: The loader's closure: a factory -> the model's (embedding table, blocks, final norm) built
#: through it (the device's weights are built so, `device`).
Rebuild = Callable[[Any], tuple[Any, Sequence[Block], Norm]]
_DEVICE_LOCK = threading.Lock()


@dataclass(frozen=True)
class LoadReport:
    """What a load read and holds.  `held_bytes`: the weights as the runtime holds them
    (`mapped_bytes` of it the file's own pages, mapped, not copied); `transient_bytes` bounds
    what the load held beyond them at any moment (one layer's tensors that were converted);
    `peak_rss_bytes` is the process's high-water mark after the load (the OS's); `products`:
    how the compute mode forms its matrix products (the bfloat16 mode's engine line)."""

    source: str
    family: str
    parameters: int
    files: int
    disk_bytes: int
    disk_dtypes: tuple[str, ...]
    held_bytes: int
    compute_dtype: str
    transient_bytes: int
    peak_rss_bytes: int
    seconds: float
    mapped_bytes: int = 0
    products: str = ""

    def __str__(self) -> str:
        mib = 1 << 20
        mapped = f", {self.mapped_bytes / mib:.1f} MiB of it mapped" if self.mapped_bytes else ""
        return (
            f"{self.source}: {self.family} model, {self.parameters / 1e6:.1f}M parameters from "
            f"{self.files} file(s) ({self.disk_bytes / mib:.1f} MiB of "
            f"{'/'.join(self.disk_dtypes)}), "
            f"held as {self.held_bytes / mib:.1f} MiB for {self.compute_dtype} compute{mapped}; "
            f"at most {self.transient_bytes / mib:.1f} MiB more during the load (one layer at a "
            f"time); process peak RSS {self.peak_rss_bytes / mib:.0f} MiB; {self.seconds:.1f} s"
            + (f"; {self.products}" if self.products else "")
        )


class FlaModel:
    """A loaded fla checkpoint that embeds one chunk of token ids at a time.

    config: the parsed FlaConfig; fingerprint: hex sha256 over the architecture (everything in
    the config that shapes the forward) and every used tensor's bytes; state_specs: each layer's
    named state arrays; tokenizer_path: the folder's tokenizer.json (or None, see
    `tokenizer_file`); load_report: what the load read and holds.
    """

    def __init__(
        self,
        config: FlaConfig,
        embed: np.ndarray,
        blocks: Sequence[Block],
        final_norm: Norm,
        *,
        fingerprint: str,
        source: str,
        tokenizer_path: str | None = None,
        tokenizer_problem: str | None = None,
        load_report: LoadReport | None = None,
        compute_mode: str | None = None,
        rebuild: Rebuild | None = None,
    ) -> None:
        self.config = config
        #: "float32", "float64" or "bfloat16" (load_model's compute_dtype)
        self.compute_mode = compute_mode or np.dtype(embed.dtype).name
        #: the dtype of the activations and outputs (float32 in the bfloat16 mode)
        self.compute_dtype = np.dtype(np.float64 if self.compute_mode == "float64" else np.float32)
        self.source = source
        self.fingerprint = fingerprint
        self.tokenizer_path = tokenizer_path
        self._tokenizer_problem = tokenizer_problem
        self.load_report = load_report
        self._embed = embed
        self._blocks = list(blocks)
        self._final = final_norm
        self.state_specs: list[StateSpec] = [b.state_spec for b in self._blocks]
        self._rebuild = rebuild
        self._device_models: dict[Any, Any] = {}  # device key -> device.DeviceModel

    def __repr__(self) -> str:
        c = self.config.common
        return (
            f"FlaModel({self.source!r}, {c.family}, hidden={c.hidden_size}, layers={c.num_layers}, "
            f"{self.compute_mode}, fingerprint={self.fingerprint[:12]})"
        )

    @property
    def d_model(self) -> int:
        return self.config.common.hidden_size

    @property
    def num_layers(self) -> int:
        return self.config.common.num_layers

    def held_arrays(self) -> list[np.ndarray]:
        """The weights the runtime holds (the embedding, the final norm's, every block's)."""
        return [self._embed, *held_arrays(self._final), *held_arrays(self._blocks)]

    def held_bytes(self) -> int:
        """Bytes of the weights the runtime holds (as held: float32, float64 or bfloat16)."""
        return sum(int(a.nbytes) for a in self.held_arrays())

    def tokenizer_file(self) -> str:
        """The folder's tokenizer.json, or ModelFolderError saying what to add."""
        if self.tokenizer_path is None:
            raise ModelFolderError(self._tokenizer_problem or f"{self.source}: no tokenizer.json")
        return self.tokenizer_path

    # -- state ------------------------------------------------------------------------------
    def initial_states(self, dtype: npt.DTypeLike = np.float64) -> list[LayerState]:
        """Zero state for every layer (float64 by default, float32 selectable)."""
        dt = np.dtype(dtype)
        if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
            msg = f"state dtype must be float32 or float64, got {dt}"
            raise TypeError(msg)
        return [spec.zeros(dt) for spec in self.state_specs]

    def state_layout(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """The carried state as a checkpoint stores it: (name, (L, *shape)) per array, S first;
        the position is the sequence's own (see `stack_states`)."""
        return stacked_layout(self.state_specs)

    def stack_states(self, states: Sequence[LayerState], position: int) -> dict[str, np.ndarray]:
        """The states as one array per name, layers first (`state.stack_states`)."""
        return stack_states(self.check_states(states), position)

    def unstack_states(self, arrays: Mapping[str, np.ndarray], position: int) -> list[LayerState]:
        """Per-layer states from `stack_states`' arrays, at `position` (`state.unstack_states`)."""
        return unstack_states(self.state_specs, arrays, position)

    def state_nbytes(self, dtype: npt.DTypeLike = np.float64) -> int:
        """Bytes of one sequence's carried state (every layer), whatever its length."""
        return sum(spec.nbytes(np.dtype(dtype)) for spec in self.state_specs)

    def check_states(self, states: Any) -> list[LayerState]:
        n = len(self.state_specs)
        if not isinstance(states, Sequence):
            msg = f"states must be a list of {n} LayerState, got {type(states).__name__}"
            raise TypeError(msg)
        if len(states) != n:
            msg = f"states must hold one LayerState per layer ({n}), got {len(states)}"
            raise ValueError(msg)
        for i, (st, spec) in enumerate(zip(states, self.state_specs, strict=True)):
            if not isinstance(st, LayerState):
                msg = f"states[{i}] must be a LayerState, got {type(st).__name__}"
                raise TypeError(msg)
            shapes = {k: tuple(a.shape) for k, a in st.items()}
            if shapes != dict(spec.shapes):
                msg = f"states[{i}] holds {shapes}, expected {dict(spec.shapes)}"
                raise ValueError(msg)
            if st.dtype not in (np.dtype(np.float32), np.dtype(np.float64)) or any(
                a.dtype != (np.int64 if k == "position" else st.dtype) for k, a in st.items()
            ):
                msg = (
                    f"states[{i}]: expected float32 or float64 arrays (position int64), got {st!r}"
                )
                raise TypeError(msg)
        return list(states)

    # -- inputs -----------------------------------------------------------------------------
    def check_inputs(self, tokens: Any) -> None:
        """Raise what `embed_chunk` would raise for these token ids, without computing."""
        self._prepare(tokens)

    def _prepare(self, tokens: Any) -> np.ndarray:
        if not hasattr(tokens, "dtype") or not hasattr(tokens, "shape"):
            msg = f"token ids must be a NumPy array, got {type(tokens).__name__}"
            raise TypeError(msg)
        return check_token_ids(np.asarray(tokens), self.config.common.vocab_size)

    # -- forward ----------------------------------------------------------------------------
    def hidden_states(
        self, tokens: Any, states: Sequence[LayerState] | None, *, backend: str = "auto"
    ) -> tuple[list[np.ndarray], list[LayerState]]:
        """Every layer's output for one chunk, as fla's output_hidden_states gives them: L + 1
        arrays [T, hidden] in the compute dtype (index 0 the embeddings, N the output of block
        N−1, L the final norm of the last block's output), and the new states."""
        return self._forward(tokens, states, backend, None)

    def embed_chunk(
        self,
        tokens: Any,
        states: Sequence[LayerState] | None,
        *,
        backend: str = "auto",
        layer: int | None = None,
    ) -> tuple[np.ndarray, list[LayerState]]:
        """Embed one chunk of token ids [T], continuing from `states` (None: a sequence's start).

        Returns (emb [T, hidden] in the compute dtype, the new states in the given states'
        dtype); emb is the final-norm output, or hidden state `layer` (0..L, as `hidden_states`
        numbers them) when given.  Neither tokens nor states are modified."""
        n = self.config.common.num_layers
        if layer is not None and not (isinstance(layer, int) and 0 <= layer <= n):
            msg = (
                f"layer must be an integer from 0 to {n} (the embeddings to the final norm), "
                f"got {layer!r}"
            )
            raise ValueError(msg)
        hs, new = self._forward(tokens, states, backend, n if layer is None else layer)
        return hs[0], new

    def embed(self, tokens: Any, *, chunk_size: int | None = None) -> np.ndarray:
        """Embed a whole sequence from the zero state, in chunks of `chunk_size` if given."""
        x = np.asarray(tokens)
        step = x.shape[0] if not chunk_size else int(chunk_size)
        states = None
        parts = []
        for s in range(0, max(x.shape[0], 1), max(step, 1)):
            e, states = self.embed_chunk(x[s : s + step], states)
            parts.append(e)
        return np.concatenate(parts, axis=0)

    def _forward(
        self, tokens: Any, states: Sequence[LayerState] | None, backend: str, keep: int | None
    ) -> tuple[list[np.ndarray], list[LayerState]]:
        if backend not in BACKENDS:
            msg = f"expected backend 'auto', 'numba', 'numpy' or 'cupy', got {backend!r}"
            raise ValueError(msg)
        on_device = backend not in HOST_BACKENDS and resolve_backend(backend) == "cupy"
        if on_device:
            from linstream.ops.model.device import _cupy_device

            return self._forward_on(_cupy_device(), tokens, states, keep)
        ids = self._prepare(tokens)
        st = self.initial_states() if states is None else self.check_states(states)
        n = len(self._blocks)
        x = self._embed[ids].astype(self.compute_dtype, copy=False)
        out = [x] if keep in (None, 0) else []
        new = []
        carry: dict[str, Any] = {}  # what a block hands later blocks within this chunk
        blas, split = _thread_layout()
        with blas, split_rows(split):
            for i, (b, s) in enumerate(zip(self._blocks, st, strict=True)):
                x, s_new = b.forward(x, s, carry)
                new.append(_as_state_dtype(s_new, s.dtype))
                if i < n - 1 and keep in (None, i + 1):
                    out.append(x)
            if keep in (None, n):
                out.append(self._final(x))
        return out, new

    def _forward_on(
        self, dev: Any, tokens: Any, states: Sequence[LayerState] | None, keep: int | None
    ) -> tuple[list[np.ndarray], list[LayerState]]:
        """The forward on a device (`linstream.ops.model.device._CupyDevice`; the CPU tests
        pass one over the CUDA emulator's launcher): host tokens and states in, host hidden
        states and states out."""
        ids = self._prepare(tokens)
        st = self.initial_states() if states is None else self.check_states(states)
        out, new = self._device_model(dev).forward(dev, ids, st, keep, self.compute_dtype)
        return out, new

    def _device_model(self, dev: Any) -> Any:
        """This model's blocks on dev, built on first use there (`device`) and cached."""
        from .device import DeviceModel, DeviceWeights

        key = dev.cache_key()
        m = self._device_models.get(key)
        if m is None:
            with _DEVICE_LOCK:
                m = self._device_models.get(key)
                if m is None:
                    if self._rebuild is None:
                        msg = (
                            f"{self.source}: this model was not loaded from a folder "
                            "(load_model), so it has no device path"
                        )
                        raise ValueError(msg)
                    weights = DeviceWeights(self.compute_mode, dev.launcher)
                    embed, blocks, final = self._rebuild(weights)
                    m = DeviceModel(weights.ops, embed, blocks, final)
                    self._device_models[key] = m
        return m


def _as_state_dtype(st: LayerState, dtype: np.dtype) -> LayerState:
    if all(a.dtype == dtype or k == "position" for k, a in st.items()):
        return st
    return LayerState({k: (a if k == "position" else a.astype(dtype)) for k, a in st.items()})
