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
inputs, the position).  Products are `dense.Dense` (BLAS) in the compute dtype (float32 by
default, float64 selectable), with BLAS held at one thread and a long chunk's rows in ranges
fixed by its length, run on the process's threads (`linstream.ops.model.blas`, shared with the
built-in model: the bits do not depend on the thread count, and on a shared machine no call
waits for a thread that is not running); the recurrences are the Numba CPU kernels of
`linstream.ops` (these models have no GPU path).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from linstream.ops.model.blas import _thread_layout
from linstream.ops.model.protocol import check_token_ids

from .block import Block, Norm, held_arrays
from .config import FlaConfig, ModelFolderError
from .dense import split_rows
from .state import LayerState, StateSpec, stack_states, stacked_layout, unstack_states

__all__ = ["FlaModel", "LoadReport"]

HOST_BACKENDS = ("auto", "numba", "numpy")


@dataclass(frozen=True)
class LoadReport:
    """What a load read and holds.  `transient_bytes` bounds what the load held beyond the
    weights at any moment (one layer's tensors before they are fused, plus one tensor's raw
    bytes); `peak_rss_bytes` is the process's high-water mark after the load (the OS's)."""

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

    def __str__(self) -> str:
        mib = 1 << 20
        return (
            f"{self.source}: {self.family} model, {self.parameters / 1e6:.1f}M parameters from "
            f"{self.files} file(s) ({self.disk_bytes / mib:.1f} MiB of "
            f"{'/'.join(self.disk_dtypes)}), "
            f"held as {self.held_bytes / mib:.1f} MiB of {self.compute_dtype}; at most "
            f"{self.transient_bytes / mib:.1f} MiB more during the load (one layer at a time); "
            f"process peak RSS {self.peak_rss_bytes / mib:.0f} MiB; {self.seconds:.1f} s"
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
    ) -> None:
        self.config = config
        self.compute_dtype = np.dtype(embed.dtype)
        self.source = source
        self.fingerprint = fingerprint
        self.tokenizer_path = tokenizer_path
        self._tokenizer_problem = tokenizer_problem
        self.load_report = load_report
        self._embed = embed
        self._blocks = list(blocks)
        self._final = final_norm
        self.state_specs: list[StateSpec] = [b.state_spec for b in self._blocks]

    def __repr__(self) -> str:
        c = self.config.common
        return (
            f"FlaModel({self.source!r}, {c.family}, hidden={c.hidden_size}, layers={c.num_layers}, "
            f"{self.compute_dtype}, fingerprint={self.fingerprint[:12]})"
        )

    @property
    def d_model(self) -> int:
        return self.config.common.hidden_size

    @property
    def num_layers(self) -> int:
        return self.config.common.num_layers

    def held_bytes(self) -> int:
        """Bytes of the weights the runtime holds (in the compute dtype)."""
        arrays = [self._embed, *held_arrays(self._final), *held_arrays(self._blocks)]
        return sum(int(a.nbytes) for a in arrays)

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
        return stack_states(self._check_states(states), position)

    def unstack_states(self, arrays: Mapping[str, np.ndarray], position: int) -> list[LayerState]:
        """Per-layer states from `stack_states`' arrays, at `position` (`state.unstack_states`)."""
        return unstack_states(self.state_specs, arrays, position)

    def state_nbytes(self, dtype: npt.DTypeLike = np.float64) -> int:
        """Bytes of one sequence's carried state (every layer), whatever its length."""
        return sum(spec.nbytes(np.dtype(dtype)) for spec in self.state_specs)

    def _check_states(self, states: Any) -> list[LayerState]:
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
        if backend not in HOST_BACKENDS:
            msg = (
                f"fla models run on the Numba CPU kernels: expected backend 'auto', 'numba' or "
                f"'numpy', got {backend!r}"
            )
            raise ValueError(msg)
        ids = self._prepare(tokens)
        st = self.initial_states() if states is None else self._check_states(states)
        n = len(self._blocks)
        x = self._embed[ids]
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


def _as_state_dtype(st: LayerState, dtype: np.dtype) -> LayerState:
    if all(a.dtype == dtype or k == "position" for k, a in st.items()):
        return st
    return LayerState({k: (a if k == "position" else a.astype(dtype)) for k, a in st.items()})
