"""The fla runtime's compute backends: where a family's pieces and recurrences run, one object
per place, reached through the load's factory (`weights.ops`, `dense.Weights`).

    ops = weights.ops                      # HOST, or a device's Compute(launcher)
    y = ops.rms_norm(x, w, eps)            # every piece of `pieces`, in ops.xp's arrays
    o = ops.vector_gated_chunks(qh, kh, vh, gh, s)   # the recurrences, as the Numba kernels
    st = ops.state({"S": s, ...})          # the layer's new state in this backend's form

`HOST` is today's CPU runtime, bit for bit: xp = NumPy, the pieces with their fused Numba
passes (`pieces`, `fused`), the Numba recurrence kernels (`ops/decay/numba.py`,
`ops/decay/vector_numba.py`, `ops/delta/numba.py`, `ops/ssd/numba.py`, `ops/dplr/numba.py`),
states as `state.LayerState`.  `Compute(launcher)` is a device (`linstream.ops.cuda.Launcher`:
CuPy's on a GPU, the tests' CPU emulator of the CUDA kernels): xp = the launcher's namespace,
the pieces as the same array expressions in that namespace (never a Numba pass), the CuPy
kernel wrappers (the `cupy.py` beside each of those Numba kernels) with that launcher, called
with the Numba kernels' signatures, and states as plain dicts of device arrays (a `LayerState`
holds NumPy arrays only; the runtime converts at the model's boundary, `device`).  Rotary tables
are formed on the host in float64 (`pieces.rotary_tables`) and uploaded.  Numba is imported at
the host's first call, never by a device's: the device path runs where Numba is not installed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from linstream.ops.cuda import Launcher
from linstream.ops.decay import cupy as decay_cupy
from linstream.ops.decay import vector_cupy
from linstream.ops.delta import cupy as delta_cupy
from linstream.ops.dplr import cupy as dplr_cupy
from linstream.ops.ssd import cupy as ssd_cupy

from . import pieces
from .state import LayerState

__all__ = ["HOST", "Compute", "widen_bits"]


def widen_bits(bits: Any, xp: Any) -> Any:
    """bfloat16 held as its 16 bits (uint16) -> float32 (exact: the bits are the top half)."""
    return (bits.astype(xp.uint32) << 16).view(xp.float32)


class Compute:
    """The pieces and recurrences of one place (see the module docstring); launcher None: the
    host."""

    def __init__(self, launcher: Launcher | None = None) -> None:
        self.launcher = launcher
        self.device = launcher is not None
        self.xp: Any = np if launcher is None else launcher.xp
        self._xp = None if launcher is None else launcher.xp  # pieces' "host" marker is None
        self._kernels: dict[str, Callable[..., Any]] = {}
        if launcher is not None:
            self._kernels = {
                "decay_chunks": functools.partial(decay_cupy.decay_chunks, launcher=launcher),
                "vector_gated_chunks": functools.partial(
                    vector_cupy.vector_gated_chunks, launcher=launcher
                ),
                "delta_chunks": functools.partial(delta_cupy.delta_chunks, launcher=launcher),
                "ssd_chunks": functools.partial(ssd_cupy.ssd_chunks, launcher=launcher),
                "dplr_chunks": functools.partial(dplr_cupy.dplr_chunks, launcher=launcher),
            }

    def __repr__(self) -> str:
        return "Compute(host)" if self.launcher is None else f"Compute({self.launcher!r})"

    # -- recurrences (the Numba kernels' signatures) ---------------------------------------
    def _kernel(self, name: str) -> Callable[..., Any]:
        k = self._kernels.get(name)
        if k is None:  # the host's Numba kernels, imported at first use (a device needs none)
            from linstream.ops.decay import numba as decay_numba
            from linstream.ops.decay import vector_numba
            from linstream.ops.delta import numba as delta_numba
            from linstream.ops.dplr import numba as dplr_numba
            from linstream.ops.ssd import numba as ssd_numba

            self._kernels = {
                "decay_chunks": decay_numba.decay_chunks,
                "vector_gated_chunks": vector_numba.vector_gated_chunks,
                "delta_chunks": delta_numba.delta_chunks,
                "ssd_chunks": ssd_numba.ssd_chunks,
                "dplr_chunks": dplr_numba.dplr_chunks,
            }
            k = self._kernels[name]
        return k

    def decay_chunks(self, *args: Any, **kwargs: Any) -> Any:
        """`ops/decay/numba.py`'s decay_chunks (a device: `ops/decay/cupy.py`'s)."""
        return self._kernel("decay_chunks")(*args, **kwargs)

    def vector_gated_chunks(self, *args: Any, **kwargs: Any) -> Any:
        """`ops/decay/vector_numba.py`'s (a device: `ops/decay/vector_cupy.py`'s)."""
        return self._kernel("vector_gated_chunks")(*args, **kwargs)

    def delta_chunks(self, *args: Any, **kwargs: Any) -> Any:
        """`ops/delta/numba.py`'s delta_chunks (a device: `ops/delta/cupy.py`'s)."""
        return self._kernel("delta_chunks")(*args, **kwargs)

    def ssd_chunks(self, *args: Any, **kwargs: Any) -> Any:
        """`ops/ssd/numba.py`'s ssd_chunks (a device: `ops/ssd/cupy.py`'s; Mamba-2)."""
        return self._kernel("ssd_chunks")(*args, **kwargs)

    def dplr_chunks(self, *args: Any, **kwargs: Any) -> Any:
        """`ops/dplr/numba.py`'s dplr_chunks (a device: `ops/dplr/cupy.py`'s; RWKV-7)."""
        return self._kernel("dplr_chunks")(*args, **kwargs)

    # -- pieces (`pieces`, in this backend's namespace) -----------------------------------
    def rms_norm(self, x: Any, w: Any, eps: float) -> Any:
        return pieces.rms_norm(x, w, eps, xp=self._xp)

    def add_rms_norm(
        self, x: Any, a: Any, w: Any, eps: float, rounded: bool = False
    ) -> tuple[Any, Any]:
        return pieces.add_rms_norm(x, a, w, eps, xp=self._xp, rounded=rounded)

    def layer_norm(self, x: Any, w: Any, b: Any, eps: float) -> Any:
        return pieces.layer_norm(x, w, b, eps, xp=self._xp)

    def head_norm(self, o: Any, w: Any, eps: float, gate: Any = None, act: str = "swish") -> Any:
        return pieces.head_norm(o, w, eps, gate, act, xp=self._xp)

    def swiglu(self, gate: Any, up: Any, rounded: bool = False) -> Any:
        return pieces.swiglu(gate, up, xp=self._xp, rounded=rounded)

    def silu(self, x: Any) -> Any:
        return pieces.silu(x, xp=self._xp)

    def sigmoid(self, x: Any) -> Any:
        return pieces.sigmoid(x, xp=self._xp)

    def logsigmoid(self, x: Any) -> Any:
        return pieces.logsigmoid(x, xp=self._xp)

    def softplus(self, x: Any) -> Any:
        return pieces.softplus(x, xp=self._xp)

    def activation(self, name: str, x: Any) -> Any:
        """`pieces.ACTIVATIONS[name](x)`."""
        return pieces.ACTIVATIONS[name](x, xp=self._xp)

    def l2_norm(self, x: Any) -> Any:
        return pieces.l2_norm(x, xp=self._xp)

    def l2_heads(self, x: Any, d: int, scale: float = 1.0) -> Any:
        return pieces.l2_heads(x, d, scale, xp=self._xp)

    def sum_norm(self, x: Any) -> Any:
        return pieces.sum_norm(x, xp=self._xp)

    def log_gate(
        self, z: Any, b: Any, normalizer: float, clamp: float | None, d: int, repeat: int = 1
    ) -> Any:
        return pieces.log_gate(z, b, normalizer, clamp, d, repeat, xp=self._xp)

    def head_major(self, x: Any, d: int, repeat: int = 1) -> Any:
        return pieces.head_major(x, d, repeat, xp=self._xp)

    def short_conv(
        self,
        x: Any,
        tail: Any,
        w: Any,
        silu_after: bool,
        heads: int | None = None,
        l2_scale: float | None = None,
    ) -> tuple[Any, Any]:
        return pieces.short_conv(x, tail, w, silu_after, heads, l2_scale, xp=self._xp)

    def rotary(self, x: Any, cos: Any, sin: Any) -> Any:
        return pieces.rotary(x, cos, sin, xp=self._xp)

    def rotary_heads(
        self, x: Any, cos: Any, sin: Any, d: int, scale: float | None = None, repeat: int = 1
    ) -> Any:
        return pieces.rotary_heads(x, cos, sin, d, scale, repeat, xp=self._xp)

    def rotary_tables(self, dim: int, start: int, t: int, dtype: Any) -> tuple[Any, Any]:
        """`pieces.rotary_tables`, formed on the host in float64, in this backend's arrays."""
        cos, sin = pieces.rotary_tables(dim, start, t, dtype)
        return (cos, sin) if self._xp is None else (self.xp.asarray(cos), self.xp.asarray(sin))

    # -- arrays and states ----------------------------------------------------------------
    def copy(self, a: Any) -> Any:
        """A new array of this backend with a's values (a state the kernels update in place)."""
        return self.xp.array(a, copy=True)

    def state(self, arrays: Mapping[str, Any]) -> Any:
        """A layer's new state: a LayerState on the host, a dict of device arrays on a device."""
        return LayerState(arrays) if self._xp is None else dict(arrays)

    def gather(self, table: Any, ids: Any, dtype: np.dtype) -> Any:
        """Rows `ids` of the embedding table, in the compute dtype (bfloat16 held as its bits
        on a device: widened here, after the gather)."""
        rows = table[ids]
        if self._xp is not None and rows.dtype == np.uint16:
            rows = widen_bits(rows, self.xp)
        return rows.astype(dtype, copy=False)


#: The host backend: NumPy, the fused Numba passes and the Numba recurrence kernels.
HOST = Compute()
