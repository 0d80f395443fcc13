"""The CUDA kernels' own source run on the CPU: compiled as C++ with `cuda_emu.h` by g++ and
launched through ctypes on NumPy arrays, in place of `cupy.RawKernel` (tests only).

    launcher = EmuLauncher(schedule=1)          # 0 forward, 1 reverse, >= 2 seeded shuffles
    kern = launcher.kernel(source, "decay_chunks")
    kern((grid_x, grid_y), (256,), (q, k, ..., np.int64(t), ...), shared_mem=nbytes)

`EmuLauncher` has the interface of `linstream.ops.cuda.CupyLauncher` (`xp`, `kernel`,
`max_shared_bytes`), so a kernel's Python wrapper runs unchanged over it: the grid, the
arguments and the shared-memory size it computes are the ones a device would get.  Its `xp` is
NumPy with `empty`/`empty_like` filled with NaN (device memory is not zeroed).

A launch is checked as a device would refuse it, and more strictly than CuPy checks it:
- the argument list against the kernel's parameter types (read from the compiled kernel): an
  array where a scalar is expected, a float64 array for a `float*`, a Python int for a
  `long long`, a non-contiguous array (CuPy passes its data pointer regardless);
- block size (≤ 1,024 threads and ≤ the kernel's `__launch_bounds__`), grid limits, and dynamic
  shared memory (> 48 KiB needs `max_dynamic_shared_size_bytes` set, as on a device; never more
  than `max_shared`, by default an H100/H200's 227 KiB);
- global memory: each array is copied between guard zones of 0xFF bytes (NaN) and copied back
  after the launch; a write into a guard fails the launch, a read from one reads NaN; two array
  arguments that overlap are refused where the kernel may write one (its pointers are
  `__restrict__`, and a copy per argument could not show what the device would do).
The header's docstring says how threads and blocks run and what this cannot show.

Each source is built once (g++ -std=c++20 -O1, a few seconds) into
`$LINSTREAM_CUDA_EMU_CACHE` (default `~/.cache/linstream/cuda_emu`), named by the hash of the
source, the header and the compiler flags, written atomically so concurrent test workers share it.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import itertools
import os
import re
import shutil
import subprocess
import tempfile
import threading
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["EmuError", "EmuKernel", "EmuLauncher", "compiler_missing", "emu_xp"]

HEADER = Path(__file__).with_name("cuda_emu.h")
CXX = os.environ.get("CXX", "g++")
FLAGS = ["-std=c++20", "-O1", "-shared", "-fPIC", "-Wall", "-Wno-unknown-pragmas",
         "-Wno-unused-variable", "-Wno-unused-function", "-Werror=return-type"]  # fmt: skip
H200_MAX_SHARED = 227 * 1024  # cudaDevAttrMaxSharedMemoryPerBlockOptin on sm_90
DEFAULT_SHARED = 48 * 1024  # usable without opting in
GUARD = 4096  # bytes of 0xFF before and after every array argument
_LOCK = threading.Lock()  # one launch at a time: the header's shared memory is one buffer

_CODES = {"f": np.float32, "d": np.float64, "i": np.int32, "I": np.uint32, "q": np.int64,
          "Q": np.uint64, "H": np.uint16, "B": np.uint8}  # fmt: skip
_CTYPES = {"f": ctypes.c_float, "d": ctypes.c_double, "i": ctypes.c_int, "I": ctypes.c_uint,
           "q": ctypes.c_longlong, "Q": ctypes.c_ulonglong, "H": ctypes.c_ushort,
           "B": ctypes.c_ubyte}  # fmt: skip


class EmuError(RuntimeError):
    """A launch the emulator refused, or that failed while running (message says which)."""


def compiler_missing() -> str | None:
    """None when the C++ compiler runs, else why not (for a skip)."""
    if shutil.which(CXX) is None:
        return f"the CUDA emulator needs a C++20 compiler ({CXX} not found)"
    return None


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "linstream" / "cuda_emu"
    return Path(os.environ.get("LINSTREAM_CUDA_EMU_CACHE", default))


def _kernel_names(source: str) -> list[str]:
    return re.findall(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?(\w+)\s*\(", source)


def launch_bounds(source: str, name: str) -> int | None:
    m = re.search(rf"__launch_bounds__\(\s*(\d+)[^)]*\)\s*{name}\s*\(", source)
    return int(m.group(1)) if m else None


@functools.cache
def _compiler_id() -> str:
    out = subprocess.run([CXX, "--version"], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()[0]


def _check_source(source: str) -> None:
    for m in re.finditer(r"(\w+\s+)?__shared__", source):
        if (m.group(1) or "").strip() != "extern":
            msg = "the emulator supports dynamic shared memory only (extern __shared__)"
            raise EmuError(msg)


@functools.cache
def build(source: str) -> ctypes.CDLL:
    """The shared library of `source` with a launcher per kernel, built once (cached on disk)."""
    _check_source(source)
    names = _kernel_names(source)
    if not names:
        raise EmuError("no __global__ kernel in the source")
    shims = "\n".join(
        f'extern "C" int emu_launch_{n}(const unsigned* g, const unsigned* b, '
        f"unsigned long long smem, int sched, void** args) {{ return emu::launch(&{n}, g, b, "
        f"smem, sched, args); }}\n"
        f'extern "C" const char* emu_sig_{n}() {{ return emu::signature(&{n}); }}'
        for n in names
    )
    text = f'#include "{HEADER}"\n{source}\n{shims}\n'
    key = hashlib.sha256(
        "\0".join([text, HEADER.read_text(), " ".join(FLAGS), _compiler_id()]).encode()
    ).hexdigest()[:24]
    out = cache_dir() / f"{key}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            src = Path(tmp) / "kernel.cpp"
            src.write_text(text)
            lib = Path(tmp) / "kernel.so"
            proc = subprocess.run(
                [CXX, *FLAGS, "-o", str(lib), str(src)], capture_output=True, text=True
            )
            if proc.returncode != 0:
                raise EmuError(f"g++ failed on the kernel source:\n{proc.stderr[-6000:]}")
            os.replace(lib, out)  # atomic: a concurrent worker sees all of it or nothing
    return ctypes.CDLL(str(out))


def _nan_filled(shape: Any, dtype: Any = float, order: str = "C") -> np.ndarray:
    a = np.empty(shape, dtype=dtype, order=order)  # type: ignore[call-overload]
    a.view(np.uint8).fill(0xFF)  # NaN for floats, all ones for integers
    return a


def emu_xp() -> Any:
    """NumPy, with `empty` and `empty_like` giving NaN-filled arrays (device memory is garbage)."""
    xp = types.ModuleType("numpy_as_device")
    xp.__getattr__ = lambda name: getattr(np, name)  # type: ignore[method-assign]
    xp.empty = _nan_filled  # type: ignore[attr-defined]
    xp.empty_like = lambda a, dtype=None: _nan_filled(  # type: ignore[attr-defined]
        np.shape(a), dtype or np.asarray(a).dtype
    )
    xp.asnumpy = np.asarray  # type: ignore[attr-defined]
    return xp


class EmuKernel:
    """One kernel of a source, called as cupy.RawKernel is: kern(grid, block, args, shared_mem=)."""

    def __init__(self, source: str, name: str, launcher: EmuLauncher) -> None:
        lib = build(source)
        self.name = name
        self.launcher = launcher
        self._fn = getattr(lib, f"emu_launch_{name}")
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [ctypes.POINTER(ctypes.c_uint)] * 2 + [
            ctypes.c_ulonglong, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)
        ]  # fmt: skip
        sig = getattr(lib, f"emu_sig_{name}")
        sig.restype = ctypes.c_char_p
        self.signature = sig().decode().split(",")
        self._err = lib.emu_last_error
        self._err.restype = ctypes.c_char_p
        self.launch_bounds = launch_bounds(source, name)
        self.max_dynamic_shared_size_bytes = 0  # as cupy.RawKernel's attribute
        self.launches: list[dict[str, Any]] = []  # what each launch asked for (tests read it)

    def _fail(self, msg: str) -> None:
        raise EmuError(f"{self.name}: {msg}")

    def _check_geometry(self, grid: tuple[int, ...], block: tuple[int, ...], smem: int) -> None:
        g = (*grid, 1, 1)[:3]
        b = (*block, 1, 1)[:3]
        if min(g) < 1 or min(b) < 1:
            self._fail(f"empty launch: grid {g}, block {b}")
        if b[0] * b[1] * b[2] > 1024 or b[2] > 64:
            self._fail(f"block {b} exceeds the device's 1,024 threads (z ≤ 64)")
        if self.launch_bounds is not None and b[0] * b[1] * b[2] > self.launch_bounds:
            self._fail(f"block {b} exceeds the kernel's __launch_bounds__({self.launch_bounds})")
        if g[0] > 2**31 - 1 or g[1] > 65535 or g[2] > 65535:
            self._fail(f"grid {g} exceeds the device's limits (2^31 - 1, 65,535, 65,535)")
        if smem > DEFAULT_SHARED and smem > self.max_dynamic_shared_size_bytes:
            self._fail(
                f"shared_mem {smem} > 48 KiB needs max_dynamic_shared_size_bytes >= {smem} "
                f"(it is {self.max_dynamic_shared_size_bytes}): the launch fails on a device"
            )
        if smem > self.launcher.max_shared:
            self._fail(f"shared_mem {smem} > the device's {self.launcher.max_shared} bytes")

    def __call__(
        self, grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...], *,
        shared_mem: int = 0,
    ) -> None:  # fmt: skip
        grid, block = tuple(int(x) for x in grid), tuple(int(x) for x in block)
        self._check_geometry(grid, block, int(shared_mem))
        if len(args) != len(self.signature):
            self._fail(f"{len(args)} arguments for parameters {self.signature}")
        keep: list[Any] = []
        copies: list[tuple[int, np.ndarray, np.ndarray]] = []
        slots = (ctypes.c_void_p * len(args))()
        for i, (code, a) in enumerate(zip(self.signature, args, strict=True)):
            if code.startswith("*"):
                if not isinstance(a, np.ndarray):
                    self._fail(f"argument {i}: expected an array for {code}, got {type(a)}")
                want = np.dtype(_CODES[code[1]])
                if a.dtype != want:
                    self._fail(f"argument {i}: a {a.dtype} array for a {want} pointer")
                if not a.flags.c_contiguous:
                    self._fail(f"argument {i}: a non-contiguous array (strides {a.strides})")
                buf = np.full(a.nbytes + 2 * GUARD + 256, 0xFF, dtype=np.uint8)
                off = GUARD + (-(buf.ctypes.data + GUARD) % 256)  # 256-byte aligned, as cudaMalloc
                buf[off : off + a.nbytes] = a.reshape(-1).view(np.uint8)
                copies.append((i, a, buf[off - GUARD : off + a.nbytes + GUARD]))
                ptr = ctypes.c_void_p(buf.ctypes.data + off)
                keep += [buf, ptr]
                slots[i] = ctypes.addressof(ptr)
            else:
                if not isinstance(a, np.generic) or np.dtype(type(a)) != np.dtype(_CODES[code]):
                    self._fail(
                        f"argument {i}: expected a NumPy {np.dtype(_CODES[code])} scalar, got "
                        f"{type(a).__name__} (cupy.RawKernel would pass it with another type)"
                    )
                c = _CTYPES[code](a.item())
                keep.append(c)
                slots[i] = ctypes.addressof(c)
        arrays = [(i, a) for i, a in enumerate(args) if isinstance(a, np.ndarray)]
        for (i, a), (j, b) in itertools.combinations(arrays, 2):
            written = self.signature[i].endswith("w") or self.signature[j].endswith("w")
            if written and np.shares_memory(a, b):
                msg = (f"arguments {i} and {j} overlap in memory and the kernel may write one "
                       "(its pointers are __restrict__)")  # fmt: skip
                self._fail(msg)
        g = (ctypes.c_uint * 3)(*(*grid, 1, 1)[:3])
        b = (ctypes.c_uint * 3)(*(*block, 1, 1)[:3])
        with _LOCK:
            rc = self._fn(g, b, int(shared_mem), self.launcher.schedule, slots)
        if rc != 0:
            self._fail(self._err().decode())
        for i, a, region in copies:
            lo, hi = region[:GUARD], region[GUARD + a.nbytes :]
            if (lo != 0xFF).any() or (hi != 0xFF).any():
                self._fail(f"argument {i}: the kernel wrote outside the array")
            if a.flags.writeable:
                a.reshape(-1).view(np.uint8)[:] = region[GUARD : GUARD + a.nbytes]
        self.launches.append({"grid": grid, "block": block, "shared_mem": int(shared_mem)})


class EmuLauncher:
    """`CupyLauncher`'s interface over the emulator: NumPy arrays, kernels built by g++."""

    def __init__(
        self,
        schedule: int = 0,
        max_shared: int = H200_MAX_SHARED,
        mutate: Callable[[str], str] | None = None,
    ) -> None:
        """schedule: thread and block order (0 forward, 1 reverse, >= 2 seeded shuffles);
        max_shared: the device's opt-in limit; mutate: applied to every source before it is
        built (the tests' deliberately broken kernels)."""
        self.schedule = int(schedule)
        self.max_shared = int(max_shared)
        self.mutate = mutate
        self.xp = emu_xp()
        self._kernels: dict[tuple[str, str], EmuKernel] = {}

    def kernel(self, source: str, name: str) -> EmuKernel:
        if self.mutate is not None:
            source = self.mutate(source)
        key = (source, name)
        if key not in self._kernels:
            self._kernels[key] = EmuKernel(source, name, self)
        return self._kernels[key]

    def max_shared_bytes(self) -> int:
        return self.max_shared

    def to_host(self, a: Any) -> np.ndarray:
        return np.asarray(a)
