"""The C heap kept for the host forward's large temporaries (glibc's malloc, set once a process).

    keep_heap()       # at the first host forward (`blas._thread_layout`); True if it was set

A forward allocates and frees arrays of megabytes per layer (a 2,048-token chunk's projections
and MLP activations are 3-32 MiB each).  glibc's malloc serves large blocks with a fresh mmap
until a freed one raises its threshold, and returns the top of its heap to the system as soon
as 128 KiB are free there: the next chunk's arrays come back as new pages, which the kernel
zeroes and faults in one by one.  Measured on the ~110M GLA and DeltaNet at 2,048 tokens (three
chunks, 2 threads, AMX machine): with the mmap threshold at glibc's largest (32 MiB) and the trim
threshold at 256 MiB, the bfloat16 mode ran 9-20% faster and the float32 mode 0-10%; either
setting alone was slower than none (setting one turns glibc's dynamic threshold off).

What it costs: up to TRIM_THRESHOLD of freed memory stays with the process between chunks
(the same process reuses it at the next chunk).  It is not set where the environment already
sets glibc's MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_ (the user's choice), where
LINSTREAM_KEEP_HEAP=0, or off glibc.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "keep_heap"]

ENV = "LINSTREAM_KEEP_HEAP"
MMAP_THRESHOLD = 32 << 20  # glibc's largest (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit)
TRIM_THRESHOLD = 256 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # malloc.h
_USERS_OWN = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


@functools.cache
def keep_heap() -> bool:
    """Set glibc's mmap and trim thresholds once (see the module docstring); whether it did."""
    if os.environ.get(ENV, "1").strip() == "0" or any(k in os.environ for k in _USERS_OWN):
        return False
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018  (glibc's: musl's mallopt does nothing)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
