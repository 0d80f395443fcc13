"""Numba's OpenMP threads wait passively between kernels, even where PyTorch was imported first.

    import linstream.ops              # sets OMP_WAIT_POLICY=PASSIVE, unless the process set it
    bind_numba_openmp()               # numba_tools, at its import: before any kernel runs

Numba runs a kernel's `prange` loops on GNU OpenMP's threads (libgomp).  By default those threads
spin for a while after each parallel region, waiting for the next one.  The model runtime runs
its products on threads of its own (`linstream.ops.model.threads`) between two kernels, so on a
2-core machine a spinning OpenMP thread takes the core that a product's second thread needs.
With OMP_WAIT_POLICY=PASSIVE the OpenMP threads sleep instead.  (A PyTorch imported after
linstream runs its own OpenMP threads passively too.)

GNU OpenMP reads the variable once, when the library loads.  Numba's OpenMP layer needs the
system's libgomp.so.1.0.0 (it loads with the layer, at the first parallel kernel) and calls its
functions by name, looked up first in the process's global scope.  PyTorch's wheels put a copy of
their own there (libgomp.so.1), loaded at `import torch`: without more, Numba's parallel regions
would run on that copy, initialized without the variable.  Measured on a 2-vCPU Zen 4, 2,048-token
float32 chunks (tests/bench/test_bench_import_order.py, two runs): RWKV-7 141M and Mamba-2 129M
then ran at 0.85-0.89 of their speed in a process that imported linstream first; with the
binding below, at 0.98-1.04.

So where a libgomp was loaded before this module set the variable, `bind_numba_openmp` loads
Numba's OpenMP layer (its library, with ctypes) before any kernel of linstream runs, with
RTLD_DEEPBIND: its calls go to the libgomp it needs, loaded then, after the variable, not to the
copy in the global scope, which PyTorch keeps.  Where Numba's threads still run on a libgomp
loaded before the variable, one warning line says so and what to do: the layer was loaded
already (a parallel Numba kernel ran before linstream was imported), or the libgomp it needs
was (another library loaded the system's), or binding is not done (no RTLD_DEEPBIND off glibc;
LD_PRELOAD set: a preloaded allocator or sanitizer is not to be bypassed).  Nothing is rebound or
said where the process set the variable itself (ACTIVE included), where Numba is set to another
threading layer, where the layer cannot load (Numba then takes another), or without /proc to
tell what was loaded.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import re
import sys
import threading

__all__ = ["VARIABLE", "bind_numba_openmp", "loaded_libgomps"]

VARIABLE = "OMP_WAIT_POLICY"
# what Numba's kernels can end up on: the system's libgomp.so.1.0.0 (the name Numba's OpenMP layer
# needs) or PyTorch's libgomp.so.1 (its functions in the global scope).  A copy renamed with a
# hash (scikit-learn's), loaded for its own module only, is not matched.
_NAME = re.compile(r"libgomp\.so(\.\d+)*$")
_NUMBA_OPENMP = "numba.np.ufunc.omppool"  # Numba's OpenMP threading layer (a C extension)
# Numba's threading layer settings under which it may pick its OpenMP layer
_MAY_PICK_OPENMP = ("default", "omp", "threadsafe", "forksafe")

_log = logging.getLogger(__name__)


def loaded_libgomps(maps: str = "/proc/self/maps") -> set[str]:
    """The paths of the GNU OpenMP libraries (`_NAME`) this process has loaded (empty: none, or
    no /proc to tell)."""
    found: set[str] = set()
    try:
        with open(maps, encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and _NAME.match(os.path.basename(parts[5].strip())):
                    found.add(parts[5].strip())
    except OSError:
        return set()
    return found


#: the libgomps loaded before this module could set the variable (the process set none)
_LOADED_FIRST: set[str] = set()
if VARIABLE not in os.environ:
    _LOADED_FIRST = loaded_libgomps()
    os.environ[VARIABLE] = "PASSIVE"
_lock = threading.Lock()
_decided = False


def bind_numba_openmp() -> None:
    """Where a libgomp was loaded before the variable was set: load Numba's OpenMP layer bound to
    a libgomp loaded after it, or log the one line that says Numba's threads will spin (see the
    module docstring).  Once a process; Numba imported (`numba_tools` calls it at its import)."""
    global _decided
    with _lock:
        if _decided:
            return
        _decided = True
        if not _LOADED_FIRST:
            return
        import numba

        if str(getattr(numba.config, "THREADING_LAYER", "default")) not in _MAY_PICK_OPENMP:
            return
        deep = getattr(os, "RTLD_DEEPBIND", None)
        if (
            _NUMBA_OPENMP not in sys.modules
            and deep is not None
            and not os.environ.get("LD_PRELOAD")
        ):
            spec = importlib.util.find_spec(_NUMBA_OPENMP)
            if spec is None or spec.origin is None:
                return
            try:  # the import then finds the library loaded, its calls bound here
                ctypes.CDLL(spec.origin, mode=os.RTLD_NOW | deep)
            except OSError:  # no libgomp for it: Numba takes another threading layer
                return
            if loaded_libgomps() - _LOADED_FIRST:  # its libgomp loaded now, after the variable
                return
        # else: its calls went, or will go, to a libgomp loaded before the variable
        first = ", ".join(sorted(_LOADED_FIRST))
        _log.warning(
            "Numba's OpenMP threads run on GNU OpenMP loaded before linstream set %s=PASSIVE "
            "(%s): they spin between kernels, which slows the model on few cores; import "
            "linstream first, or set %s=PASSIVE before Python starts",
            VARIABLE, first, VARIABLE,
        )  # fmt: skip
