"""Numba's OpenMP threads wait passively between kernels, and one line where they cannot.

    import linstream.ops              # sets OMP_WAIT_POLICY=PASSIVE, unless the process set it
    spinning_line()                   # None, or why the threads spin and what to do about it

Numba runs a kernel's `prange` loops on GNU OpenMP's threads (libgomp).  By default those threads
spin for a while after each parallel region, waiting for the next one.  The model runtime runs
its products on threads of its own (`linstream.ops.model.threads`) between two kernels, so on a
2-core machine a spinning OpenMP thread takes the core that a product's second thread needs.
With OMP_WAIT_POLICY=PASSIVE the OpenMP threads sleep instead.

GNU OpenMP reads the variable once, when the library loads.  Numba's OpenMP layer needs the
system's libgomp.so.1.0.0 (loading it at its first parallel kernel, unless it is loaded already)
and calls its functions by name, found first in the process's global scope.  PyTorch's wheels
load a copy of their own there (libgomp.so.1, with the process's global symbols): after
`import torch`, Numba's parallel regions run on that copy, initialized without the variable.
Nothing changes its waiting afterwards.  Measured on a 2-vCPU Zen 4, 2,048-token
float32 chunks (tests/bench/test_bench_import_order.py): RWKV-7 141M and Mamba-2 129M ran at
0.86 and 0.87 of their speed with torch imported first.  `spinning_line` gives the line the
runtime logs once at its first forward (`model.blas`): import linstream first, or set the
variable before Python starts.  A setting of the user's own (ACTIVE included) is never changed
and never warned about.
"""

from __future__ import annotations

import os
import re

__all__ = ["VARIABLE", "loaded_libgomp", "spinning_line"]

VARIABLE = "OMP_WAIT_POLICY"
# what Numba's kernels would run on if it is loaded first: the system's libgomp.so.1.0.0 (the
# name Numba's OpenMP layer needs) or PyTorch's libgomp.so.1 (its functions in the global scope).
# A copy renamed with a hash (scikit-learn's), loaded for its own module only, is not matched.
_SHARED_NAME = re.compile(r"libgomp\.so(\.\d+)*$")


def loaded_libgomp(maps: str = "/proc/self/maps") -> str | None:
    """The path of a GNU OpenMP library (`_SHARED_NAME`) this process has loaded, or None (none
    loaded, or no /proc to tell)."""
    try:
        with open(maps, encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and _SHARED_NAME.match(os.path.basename(parts[5].strip())):
                    return parts[5].strip()
    except OSError:
        return None
    return None


#: the libgomp loaded before this module could set the variable (its path), else None
_LOADED_FIRST: str | None = None
if VARIABLE not in os.environ:
    _LOADED_FIRST = loaded_libgomp()
    os.environ[VARIABLE] = "PASSIVE"


def spinning_line() -> str | None:
    """Where GNU OpenMP loaded before linstream could ask its threads to wait passively (the
    process did not set OMP_WAIT_POLICY itself): the one line that says so; else None."""
    if _LOADED_FIRST is None:
        return None
    return (
        f"GNU OpenMP ({_LOADED_FIRST}) was loaded before linstream could set "
        f"{VARIABLE}=PASSIVE (PyTorch imported first?): its threads spin between the model's "
        "kernels and slow the products on a machine with few cores (13-14% on 2 cores); "
        f"import linstream before torch, or set {VARIABLE}=PASSIVE before starting Python"
    )
