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

A thread other than the main one allocates from its own arena, a chain of heaps of at most
64 MiB each (glibc's HEAP_MAX_SIZE on 64-bit), and free() unmaps a heap of that chain as soon as
it is wholly free, whatever the trim threshold: a chunk's temporaries spanning several heaps
then come back as fresh pages at the next chunk.  A Beam worker runs the forward on such a
thread: in `linstream embed` (~110M GLA, 2,048-token chunks, Xeon) every other chunk faulted
in ~110 MiB and ran 6% slower than the same loop on the main thread.  glibc keeps a heap whose
deletion would leave less than the top pad free below it, so a top pad of a whole heap
(TOP_PAD = 64 MiB) keeps them: the faults went away and the job ran at the loop's rate.  The
top pad also rounds up each growth of the main heap by that much (address space, paged in only
when used).

What it costs: up to TRIM_THRESHOLD of freed memory stays with the main heap between chunks,
and a thread's arena keeps the heaps its largest chunk needed (the same process reuses them at
the next chunk).  It is not set where the environment already sets glibc's
MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_ or MALLOC_TOP_PAD_ (the user's choice), where
LINSTREAM_KEEP_HEAP=0, or off glibc.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys

__all__ = ["MMAP_THRESHOLD", "TOP_PAD", "TRIM_THRESHOLD", "keep_heap"]

ENV = "LINSTREAM_KEEP_HEAP"
MMAP_THRESHOLD = 32 << 20  # glibc's largest (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit)
TRIM_THRESHOLD = 256 << 20
TOP_PAD = 64 << 20  # a thread arena's largest heap (HEAP_MAX_SIZE on 64-bit)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3  # malloc.h
_USERS_OWN = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


@functools.cache
def keep_heap() -> bool:
    """Set glibc's mmap and trim thresholds and its top pad once (see the module docstring);
    whether it did."""
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
    settings = ((_M_MMAP_THRESHOLD, MMAP_THRESHOLD), (_M_TRIM_THRESHOLD, TRIM_THRESHOLD),
                (_M_TOP_PAD, TOP_PAD))  # fmt: skip
    return all([bool(mallopt(option, value)) for option, value in settings])
