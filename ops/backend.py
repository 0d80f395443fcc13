"""Backend choice: "numpy", "numba", "cupy", or "auto" (LINSTREAM_BACKEND overrides auto).

    resolve_backend("auto")    cupy if a usable CUDA device, else numba, else numpy;
                               LINSTREAM_BACKEND=numpy|numba|cupy overrides it
    resolve_backend("cupy")    BackendUnavailableError (saying why) where there is no device
    resolve_backend("cupy", allow_fallback=True)
                               the best CPU backend instead, with a logged warning

Nothing falls back silently: an explicit request either runs, raises, or logs why it did not.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import sys

__all__ = [
    "BACKENDS",
    "ENV_VAR",
    "BackendUnavailableError",
    "cupy_available",
    "cupy_unavailable_reason",
    "numba_available",
    "resolve_backend",
]

log = logging.getLogger(__name__)

BACKENDS = ("numpy", "numba", "cupy")
ENV_VAR = "LINSTREAM_BACKEND"


class BackendUnavailableError(RuntimeError):
    """The requested backend cannot run here (library missing or no device)."""


def _no_cuda_driver() -> bool:
    """On Linux: whether the CUDA driver library (libcuda.so.1) cannot be loaded, so that no
    device can be usable.  Knowing it this way takes a millisecond; importing CuPy to ask it
    took 0.6-3 s of every `linstream` process's start on a machine without a GPU."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return True
    return False


@functools.cache
def cupy_unavailable_reason() -> str | None:
    """None when CuPy imports and sees a usable CUDA device, else why not (for messages)."""
    if importlib.util.find_spec("cupy") is None:
        return "cupy is not installed (pip install 'linstream[gpu]', i.e. cupy-cuda12x)"
    if _no_cuda_driver():
        return (
            "cupy is installed but sees no usable CUDA device (no CUDA driver here: "
            "libcuda.so.1 does not load)"
        )
    try:
        import cupy

        if cupy.is_available():
            return None
        return "cupy is installed but sees no usable CUDA device (cupy.is_available() is False)"
    except Exception as ex:  # a broken CUDA install must not break CPU users
        log.debug("cupy present but unusable", exc_info=True)
        return f"cupy is installed but failed to initialise CUDA: {type(ex).__name__}: {ex}"


def cupy_available() -> bool:
    """True when CuPy imports and sees a usable CUDA device (import alone is not enough)."""
    return cupy_unavailable_reason() is None


@functools.cache
def numba_available() -> bool:
    return importlib.util.find_spec("numba") is not None


def _cpu_backend() -> str:
    return "numba" if numba_available() else "numpy"


def _unavailable(name: str) -> str | None:
    if name == "cupy":
        reason = cupy_unavailable_reason()
        return None if reason is None else f"{reason}; use backend='numba' on CPU machines"
    if name == "numba" and not numba_available():
        return "numba is not installed (pip install numba); backend='numpy' needs nothing"
    return None


def resolve_backend(name: str = "auto", *, allow_fallback: bool = False) -> str:
    """Map a requested backend to one that can run here.

    "auto" reads LINSTREAM_BACKEND first; with neither set it picks cupy when a CUDA device is
    usable, else numba, else numpy.  A backend asked for by name (or by the variable) that cannot
    run raises BackendUnavailableError saying why, or, with allow_fallback=True, logs a warning
    and returns the best CPU backend.
    """
    source = "backend argument"
    if name == "auto":
        env = os.environ.get(ENV_VAR, "").strip().lower()
        if env and env != "auto":
            name, source = env, f"environment variable {ENV_VAR}"
        else:
            if cupy_available():
                return "cupy"
            return _cpu_backend()
    if name not in BACKENDS:
        msg = f"unknown backend {name!r} (from the {source}); expected 'auto' or one of {BACKENDS}"
        raise ValueError(msg)
    reason = _unavailable(name)
    if reason is None:
        return name
    if allow_fallback:
        fallback = _cpu_backend()
        log.warning(
            "backend %r (from the %s) cannot run here: %s; falling back to %r",
            name,
            source,
            reason,
            fallback,
        )
        return fallback
    msg = f"backend {name!r} was requested (from the {source}) but cannot run here: {reason}"
    raise BackendUnavailableError(msg)
