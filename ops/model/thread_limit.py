"""The process's compute threads bounded to N (`linstream embed --threads N`, `threads=`).

    limit_threads(4)                     # the kernels (Numba), BLAS and the row split: 4 threads
    thread_counts()                      # (Numba's threads, BLAS's threads), as they report them

As llama.cpp's ``-t`` and PyTorch's ``torch.set_num_threads`` do.  The row ranges of a chunk
stay those of its length (`threads.row_ranges`), and BLAS stays at one thread while a chunk's
products run (`blas`), so the bits of a forward do not change with N.
"""

from __future__ import annotations

import os
import sys

__all__ = ["limit_threads", "thread_counts"]

#: What each library reads, when it loads, for its thread count (Numba's pool; OpenMP, OpenBLAS
#: and MKL's BLAS): set by `limit_threads` for this process and the worker processes it starts.
_THREAD_VARIABLES = (
    "NUMBA_NUM_THREADS",
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
)


def limit_threads(n: int) -> None:
    """Bound this process's compute threads to ``n``: Numba's pool (the kernels' ``prange``
    loops), BLAS's (NumPy's and SciPy's, the libraries `blas` finds) and the model runtime's
    row split (as many threads as BLAS has outside a chunk).  Worker processes started
    afterwards inherit the bound (the environment variables each library reads when it loads).
    Numba sizes its pool when it is first imported: call this before anything loads a model
    (once Numba is imported, only the calling thread's share can still be bounded)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        msg = f"threads: expected a whole number >= 1, got {n!r}"
        raise ValueError(msg)
    for name in _THREAD_VARIABLES:
        os.environ[name] = str(n)
    if "numba" in sys.modules:
        import numba

        pool = int(getattr(numba.config, "NUMBA_NUM_THREADS", n))  # its size, set at import
        numba.set_num_threads(min(n, pool))
    if "numpy" in sys.modules:  # its BLAS is loaded: bound it now (else the variables do)
        from .blas import _blas_libraries, _set_threads, _single_threaded_blas

        for lib in _blas_libraries():
            _set_threads(lib, n)
        _single_threaded_blas._threads = None  # the row split reads BLAS's count again


def thread_counts() -> tuple[int, int]:
    """(Numba's threads, BLAS's threads) in this process, as the libraries report them."""
    import numba

    from .blas import _blas_libraries

    blas = [int(lib.get_num_threads()) for lib in _blas_libraries()]
    return int(numba.get_num_threads()), max([1, *blas])
