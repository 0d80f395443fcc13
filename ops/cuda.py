"""How linstream's CUDA kernels are compiled and launched: the CuPy launcher, the interface a CPU
emulator implements in the tests, and the input dtypes the kernels read.

A kernel module's Python wrapper never names CuPy: it takes a `Launcher` (by default
`cupy_launcher()`, the current device) and uses its array namespace `xp` and
`kernel(source, name)`, which returns an object called as `cupy.RawKernel` is,
`kern(grid, block, args, shared_mem=n)`.  The tests pass a launcher whose kernels are the same
CUDA source compiled as C++ and run over emulated blocks and threads (tests/helpers/cuda_emu.py),
so the wrapper's grid, arguments and shared-memory sizes are exercised without a device.

Inputs may be float32, float64, or bfloat16: an array whose dtype is named 'bfloat16'
(ml_dtypes) or `Bfloat16Bits` (the raw uint16 bits, for callers without a bfloat16 dtype).  The
kernels read bfloat16 as its 16 bits and widen it in registers (`IN_TYPES`: a shift, exact).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import numpy as np

from .backend import BackendUnavailableError, cupy_available, cupy_unavailable_reason

__all__ = [
    "DEFAULT_SHARED_BYTES",
    "IN_TYPES",
    "REAL_TYPES",
    "Bfloat16Bits",
    "CupyLauncher",
    "Launcher",
    "common_kind",
    "compute_dtype",
    "cupy_launcher",
    "finish",
    "fit_chunk",
    "input_kind",
    "is_cupy_array",
    "on_launcher",
    "put_state_back",
    "raw_array",
    "set_shared_bytes",
    "state_dtype",
    "xp_cupy",
]

# Dynamic shared memory a block may use without opting in (cudaFuncSetAttribute).
DEFAULT_SHARED_BYTES = 48 * 1024

# CUDA type of one input element, and how it becomes real_t.  bf16 arrives as its raw 16 bits
# (uint16): the float32 with the same top half is exact, so the cast on the device is a shift.
IN_TYPES: dict[str, tuple[str, str]] = {
    "float32": ("float", "(real_t)(v_)"),
    "float64": ("double", "(real_t)(v_)"),
    "bfloat16": ("unsigned short", "(real_t)__uint_as_float(((unsigned int)(v_)) << 16)"),
}
REAL_TYPES = {"float32": "float", "float64": "double"}


class Launcher(Protocol):
    """Where kernels run: an array namespace and compiled kernels called as cupy.RawKernel."""

    xp: Any

    def kernel(self, source: str, name: str) -> Any:
        """The kernel `name` of `source`, compiled once."""
        ...

    def max_shared_bytes(self) -> int:
        """The most dynamic shared memory one block may opt into."""
        ...

    def to_host(self, a: Any) -> np.ndarray:
        """A NumPy copy (or view) of an array of xp."""
        ...


def xp_cupy() -> Any:
    """The cupy module, or BackendUnavailableError saying why it cannot run here."""
    if not cupy_available():
        msg = f"the cupy backend cannot run here: {cupy_unavailable_reason()}"
        raise BackendUnavailableError(msg)
    import cupy

    return cupy


class CupyLauncher:
    """The current CUDA device through CuPy (kernels compiled by NVRTC, cached per source)."""

    def __init__(self) -> None:
        self.xp = xp_cupy()

    @functools.cache  # noqa: B019 - one launcher per process (`cupy_launcher`)
    def kernel(self, source: str, name: str) -> Any:
        return self.xp.RawKernel(source, name)

    @functools.cache  # noqa: B019
    def max_shared_bytes(self) -> int:
        rt = self.xp.cuda.runtime
        attr = rt.cudaDevAttrMaxSharedMemoryPerBlockOptin
        return int(rt.deviceGetAttribute(attr, self.xp.cuda.Device().id))

    def to_host(self, a: Any) -> np.ndarray:
        return np.asarray(self.xp.asnumpy(a))


@functools.cache
def cupy_launcher() -> CupyLauncher:
    """The launcher of the current device (BackendUnavailableError where there is none)."""
    return CupyLauncher()


def fit_chunk(c: int, shared_bytes: Callable[[int], int], limit: int, what: str) -> int:
    """The chunk length to launch with: c, halved until a block's shared memory fits `limit`
    (a shorter chunk changes only the rounding, never the result's math)."""
    c = max(1, int(c))
    while c > 1 and shared_bytes(c) > limit:
        c = (c + 1) // 2
    if shared_bytes(c) > limit:
        msg = (
            f"{what}: one block needs {shared_bytes(c)} bytes of shared memory even with "
            f"1-token chunks; this device allows {limit}"
        )
        raise ValueError(msg)
    return c


def set_shared_bytes(kern: Any, nbytes: int) -> None:
    """Opt a kernel into `nbytes` of dynamic shared memory where that is above the default."""
    if nbytes > DEFAULT_SHARED_BYTES and kern.max_dynamic_shared_size_bytes < nbytes:
        kern.max_dynamic_shared_size_bytes = nbytes


class Bfloat16Bits(NamedTuple):
    """A bfloat16 array given as its raw bits (uint16, NumPy or CuPy), for callers without a
    bfloat16 dtype.  Arrays whose dtype is named 'bfloat16' (ml_dtypes) are accepted directly."""

    bits: Any

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.bits.shape)


def input_kind(name: str, x: Any) -> str:
    """'float32', 'float64', 'bfloat16' (raw bits) or 'float16', with a message naming what came."""
    if isinstance(x, Bfloat16Bits):
        if np.dtype(x.bits.dtype) != np.uint16:
            msg = f"{name}: Bfloat16Bits needs uint16 bits, got dtype {x.bits.dtype}"
            raise TypeError(msg)
        return "bfloat16"
    dt = np.dtype(x.dtype)
    if dt.name == "bfloat16":
        return "bfloat16"
    if dt in (np.float32, np.float64):
        return dt.name
    if dt == np.float16:
        return "float16"
    msg = f"{name} must be float32, float64 or bfloat16, got dtype {dt}"
    raise TypeError(msg)


def raw_array(x: Any, kind: str) -> Any:
    """The array whose elements a kernel reads (bfloat16 as its uint16 bits)."""
    if isinstance(x, Bfloat16Bits):
        return x.bits
    if kind == "bfloat16":
        return x.view(np.uint16)
    return x


def compute_dtype(kinds: tuple[str, ...]) -> np.dtype:
    """float64 when every input is float64, else float32 (bfloat16 widens to float32)."""
    return np.dtype(np.float64 if all(k == "float64" for k in kinds) else np.float32)


def common_kind(arrays: dict[str, Any], *, allow_float16: bool = False) -> str:
    """The one input kind the arrays share ('float32', 'float64', 'bfloat16'), or TypeError."""
    kinds = {name: input_kind(name, a) for name, a in arrays.items()}
    found = set(kinds.values())
    if len(found) != 1:
        said = ", ".join(f"{n} {k}" for n, k in kinds.items())
        msg = f"the inputs must share one dtype, got {said}"
        raise TypeError(msg)
    kind = found.pop()
    if kind == "float16" and not allow_float16:
        msg = f"expected float32, float64 or bfloat16 inputs, got float16 ({', '.join(kinds)})"
        raise TypeError(msg)
    return kind


def on_launcher(launcher: Launcher, x: Any, kind: str | None = None, dtype: Any = None) -> Any:
    """x (NumPy or the launcher's array; bfloat16 as its bits) as a C-contiguous array of the
    launcher's namespace, converted to dtype when given; copied only where needed."""
    xp = launcher.xp
    a = raw_array(x, kind) if kind is not None else x
    return xp.ascontiguousarray(xp.asarray(a), dtype=dtype)


def state_dtype(name: str, s: Any) -> np.dtype:
    """The state's dtype, float32 or float64, or TypeError naming what came."""
    dt = np.dtype(s.dtype)
    if dt not in (np.float32, np.float64):
        msg = f"{name} must be float32 or float64, got dtype {dt}"
        raise TypeError(msg)
    return dt


def put_state_back(launcher: Launcher, given: Any, used: Any) -> None:
    """Copy the state the kernel updated into the caller's array, unless it was that array."""
    if used is given:
        return
    if isinstance(given, launcher.xp.ndarray):
        given[...] = used
    else:
        given[...] = launcher.to_host(used)


def finish(launcher: Launcher, like: Any, out: Any) -> Any:
    """out where the caller's input `like` lives: on the host for a NumPy input."""
    if isinstance(raw_array(like, ""), launcher.xp.ndarray):
        return out
    return launcher.to_host(out)


def is_cupy_array(x: Any) -> bool:
    """A CuPy array (checked by its type's module: CuPy need not be importable)."""
    return type(x).__module__.split(".")[0] == "cupy"
