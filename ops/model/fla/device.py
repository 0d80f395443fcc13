"""The fla runtime on a device (`embed_chunk(..., backend="cupy")`): the device's weights, built
by the families themselves, and the forward's crossings between host and device.

    weights = DeviceWeights("float32", launcher)      # a factory whose arrays live on the device
    embed, blocks, final = rebuild(weights)           # the loader's closure (`folder`)
    model = DeviceModel(weights.ops, embed, blocks, final)
    hidden, states = model.forward(dev, ids, states, keep, dtype)

How device blocks are made: the loader keeps a closure that reads the folder's tensors again
(memory-mapped for a local folder, read again for a URL) and hands them, with a `DeviceWeights`
factory, to the family's own `build_block` / `build`, exactly as the host load does.  So a
family has one implementation: it computes through `weights.ops` (`compute.Compute(launcher)`:
the pieces as array expressions of the launcher's xp, the CuPy kernel wrappers) and makes arrays
with `weights.xp`.  The rebuild checks every tensor's sha256 against the load's: a folder changed
since the load is refused (`ModelFolderError`), never run as a different model.  The runtime
builds a device's model once, at its first forward there, and caches it per device
(`_CupyDevice.cache_key`).

Weights on the device: products' weights and the embedding in the held dtype (float32 or
float64; in the bfloat16 mode as their 16 bits, uint16, each product widening its weight to
float32 for one cuBLAS call (`DeviceDense`), the embedding's gathered rows widened after the
gather); everything else (`weights.array`) in the compute dtype or the dtype asked.  The
products are xp.matmul (cuBLAS on CuPy), float32 (float64) activations.

The carried state stays the host's at the model's boundary: `LayerState`s of NumPy arrays in
and out (float64 or float32), so a sequence moves between CPU and GPU workers freely.  Each
chunk uploads the states (the position stays on the host: RetNet reads it to form its rotary
tables there) and downloads the new ones and the hidden states asked for, the states of every
layer in one transfer each way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from linstream.ops.cuda import Launcher
from linstream.ops.model.device import move_arrays

from .bf16 import BF16
from .block import Block, Norm
from .compute import Compute, widen_bits
from .dense import Dense, FusedProjection, Weights, compute_mode
from .state import POSITION, LayerState

__all__ = ["DeviceDense", "DeviceModel", "DeviceWeights"]


class DeviceDense(Dense):
    """A projection on a device: x [T, in] @ Wᵀ by xp.matmul, W [out, in] held on the device
    in the compute dtype, or as bfloat16's bits (uint16) widened to float32 for each product."""

    __slots__ = ("xp",)

    def __init__(self, weight: Any, xp: Any) -> None:  # not Dense.__init__: no host checks
        self.weight = weight
        self.shape = (int(weight.shape[0]), int(weight.shape[1]))
        self.xp = xp
        self.engine = None
        self.packed = None
        self.split = False

    def __call__(self, x: Any) -> Any:
        w: Any = self.weight
        if w.dtype == np.uint16:
            w = widen_bits(w, self.xp)
        return self.xp.matmul(x, w.T)


class DeviceWeights(Weights):
    """`dense.Weights` for a device: the same factory calls, arrays of the launcher's xp."""

    def __init__(self, mode: npt.DTypeLike | str, launcher: Launcher) -> None:
        self.mode = compute_mode(mode)
        self.dtype = np.dtype(np.float64 if self.mode == "float64" else np.float32)
        self.held = BF16 if self.mode == "bfloat16" else self.dtype
        self.engine = None
        self.f32 = None  # the device's products are xp.matmul's
        self.converted_bytes = 0
        self.ops = Compute(launcher)

    def _upload(self, a: np.ndarray) -> Any:
        return self.ops.xp.asarray(a)

    def array(self, tensor: Any, dtype: npt.DTypeLike | None = None) -> Any:
        """A tensor as a new device array in `dtype` (default: the compute dtype)."""
        dt = self.dtype if dtype is None else dtype
        return self._upload(np.array(tensor, dtype=dt, copy=True))

    def held_array(self, tensor: Any) -> Any:
        """A tensor on the device in the held dtype (bfloat16: its bits, uint16)."""
        a = np.ascontiguousarray(tensor, dtype=self.held)
        if self.held == BF16:
            a = a.view(np.uint16)
        return self._upload(np.array(a, copy=True))

    def table(self, tensor: Any) -> Any:
        return self.held_array(tensor)

    def dense(self, tensor: Any, *, split: bool = True, columns: bool = True) -> Dense:
        return DeviceDense(self.held_array(tensor), self.ops.xp)

    def fused(self, parts: Sequence[tuple[str, Any]]) -> FusedProjection:
        return FusedProjection({name: self.dense(w) for name, w in parts})


class DeviceModel:
    """One device's copy of a model's weights (as blocks) and its forward over a chunk."""

    def __init__(self, ops: Compute, embed: Any, blocks: Sequence[Block], final: Norm) -> None:
        self.ops, self.embed, self.blocks, self.final = ops, embed, list(blocks), final

    def forward(
        self,
        dev: Any,
        ids: np.ndarray,
        states: Sequence[LayerState],
        keep: int | None,
        dtype: np.dtype,
    ) -> tuple[list[np.ndarray], list[LayerState]]:
        """Hidden states (all, or number `keep`) and the new states, on the host; `dev` is the
        device's `_CupyDevice` (its to_device / to_host)."""
        n = len(self.blocks)
        x = self.ops.gather(self.embed, dev.to_device(ids), dtype)
        out = [x] if keep in (None, 0) else []
        new = []
        carry: dict[str, Any] = {}
        for i, (b, s) in enumerate(zip(self.blocks, upload_states(states, dev), strict=True)):
            x, s_new = b.forward(x, s, carry)  # type: ignore[arg-type]  # a device dict
            new.append(s_new)
            if i < n - 1 and keep in (None, i + 1):
                out.append(x)
        if keep in (None, n):
            out.append(self.final(x))
        dtypes = [s.dtype for s in states]
        return [dev.to_host(o) for o in out], download_states(new, dev, dtypes)


def _packed(states: Sequence[Mapping[str, Any]]) -> list[tuple[int, str]]:
    """(layer, name) of every float array of the states, in order (the position stays apart)."""
    return [(i, k) for i, st in enumerate(states) for k in st if k != POSITION]


def upload_states(states: Sequence[LayerState], dev: Any) -> list[dict[str, Any]]:
    """Host LayerStates as the device's dicts, in one transfer when they share a dtype
    (`linstream.ops.model.device.move_arrays`); the position stays a host array."""
    order = _packed(states)
    moved = move_arrays([states[i][k] for i, k in order], np, dev.to_device)
    out: list[dict[str, Any]] = [{} for _ in states]
    for (i, k), a in zip(order, moved, strict=True):
        out[i][k] = a
    for i, st in enumerate(states):
        if POSITION in st:
            out[i][POSITION] = np.array(st[POSITION])
    return out


def download_states(
    states: Sequence[Mapping[str, Any]], dev: Any, dtypes: Sequence[np.dtype]
) -> list[LayerState]:
    """The device's new states as host LayerStates (layer i in dtypes[i], the position int64),
    in one transfer when they share a dtype (`move_arrays`)."""
    order = _packed(states)
    moved = move_arrays([states[i][k] for i, k in order], dev.xp, dev.to_host)
    parts: list[dict[str, np.ndarray]] = [{} for _ in states]
    for (i, k), a in zip(order, moved, strict=True):
        parts[i][k] = np.asarray(a).astype(dtypes[i])
    for i, st in enumerate(states):
        if POSITION in st:
            parts[i][POSITION] = np.asarray(st[POSITION], np.int64)
    return [LayerState({k: p[k] for k in st}) for p, st in zip(parts, states, strict=True)]
