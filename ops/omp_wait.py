"""Numba's OpenMP threads wait passively between kernels, even where PyTorch was imported first.

    import linstream.ops              # sets OMP_WAIT_POLICY=PASSIVE, unless the process set it
    bind_numba_openmp()               # numba_tools, before any kernel: Numba's own libgomp
    spinning_line()                   # None, or why the threads spin and what to do about it

Numba runs a kernel's `prange` loops on GNU OpenMP's threads (libgomp).  By default those threads
spin for a while after each parallel region, waiting for the next one.  The model runtime runs
its products on threads of its own (`linstream.ops.model.threads`) between two kernels, so on a
2-core machine a spinning OpenMP thread takes the core that a product's second thread needs.
With OMP_WAIT_POLICY=PASSIVE the OpenMP threads sleep instead.

GNU OpenMP reads the variable once, when the library loads.  Numba's OpenMP layer needs the
system's libgomp.so.1.0.0 (it loads with Numba's layer at the first parallel kernel) and calls
its functions by name, looked up first in the process's global scope.  PyTorch's wheels put a
copy of their own there (libgomp.so.1), loaded at `import torch`: without more, Numba's parallel
regions would run on that copy, initialized without the variable.  Measured on a 2-vCPU Zen 4,
2,048-token float32 chunks (tests/bench/test_bench_import_order.py): RWKV-7 141M and Mamba-2 129M
then ran at 0.85 and 0.87 of their speed in a process that imported linstream first; with the
binding below, at 0.98 and 1.00.

So where a libgomp was loaded before this module set the variable, `bind_numba_openmp` loads
Numba's OpenMP layer before any kernel runs, with RTLD_DEEPBIND: its calls go to the libgomp it
needs (loaded then, after the variable), not to the copy in the global scope.  PyTorch keeps its
own.  Where that cannot be done (Numba's layer already loaded by a parallel kernel of the user's
own, the system's libgomp itself loaded before, no RTLD_DEEPBIND off glibc), `spinning_line`
gives the line the runtime logs once at its first forward (`model.blas`): import linstream first,
or set the variable before Python starts.  A setting of the user's own (ACTIVE included) is
never changed, and then nothing is rebound or said.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import threading

__all__ = ["VARIABLE", "bind_numba_openmp", "loaded_libgomps", "spinning_line"]

VARIABLE = "OMP_WAIT_POLICY"
# what Numba's kernels can end up on: the system's libgomp.so.1.0.0 (the name Numba's OpenMP layer
# needs) or PyTorch's libgomp.so.1 (its functions in the global scope).  A copy renamed with a
# hash (scikit-learn's), loaded for its own module only, is not matched.
_NAME = re.compile(r"libgomp\.so(\.\d+)*$")
_NUMBA_OPENMP = "numba.np.ufunc.omppool"  # Numba's OpenMP threading layer (a C extension)


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
_bound = False  # whether Numba's OpenMP layer was loaded on a libgomp of its own, here
# one caller at a time: the dlopen flags are the process's, set and restored around the import
_lock = threading.Lock()


def bind_numba_openmp() -> None:
    """Where a libgomp was loaded before the variable was set: load Numba's OpenMP layer now,
    deep-bound to a libgomp loaded after it (see the module docstring).  Once a process; Numba
    must be importable (called by `numba_tools` at its import)."""
    global _bound
    deep = getattr(os, "RTLD_DEEPBIND", None)
    with _lock:
        if not _LOADED_FIRST or _bound or _NUMBA_OPENMP in sys.modules or deep is None:
            return
        flags = sys.getdlopenflags()
        sys.setdlopenflags(flags | deep)
        try:
            importlib.import_module(_NUMBA_OPENMP)
        except (ImportError, OSError):  # no OpenMP layer here: Numba picks another
            return
        finally:
            sys.setdlopenflags(flags)
        # bound to a libgomp of its own only if one was loaded now (not one loaded before)
        _bound = bool(loaded_libgomps() - _LOADED_FIRST)


def spinning_line() -> str | None:
    """Where Numba's OpenMP threads run on a libgomp loaded before linstream could ask them to
    wait passively (`bind_numba_openmp`, tried first, could not give them one of their own): the
    one line that says so; else None."""
    bind_numba_openmp()
    if not _LOADED_FIRST or _bound:
        return None
    first = ", ".join(sorted(_LOADED_FIRST))
    return (
        f"GNU OpenMP ({first}) was loaded, and Numba's parallel kernels set up on it, before "
        f"linstream could set {VARIABLE}=PASSIVE: its threads spin between the model's kernels "
        "and slow the products on a machine with few cores (13-15% on 2 cores); import "
        "linstream before running parallel Numba code of your own (and before torch), or set "
        f"{VARIABLE}=PASSIVE before starting Python"
    )
