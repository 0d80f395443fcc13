"""Backend choice: "numpy", "numba", "cupy", or "auto" (LINSTREAM_BACKEND overrides auto)."""

from __future__ import annotations

import functools
import importlib.util
import logging
import os

__all__ = ["BACKENDS", "BackendUnavailableError", "cupy_available", "resolve_backend"]

log = logging.getLogger(__name__)

BACKENDS = ("numpy", "numba", "cupy")
ENV_VAR = "LINSTREAM_BACKEND"


class BackendUnavailableError(RuntimeError):
    """The requested backend cannot run here (library missing or no device)."""


@functools.cache
def cupy_available() -> bool:
    """True when CuPy imports and sees a usable CUDA device (import alone is not enough)."""
    if importlib.util.find_spec("cupy") is None:
        return False
    try:
        import cupy

        return bool(cupy.is_available())
    except Exception:  # a broken CUDA install must not break CPU users
        log.debug("cupy present but unusable", exc_info=True)
        return False


@functools.cache
def numba_available() -> bool:
    return importlib.util.find_spec("numba") is not None


def resolve_backend(name: str = "auto") -> str:
    """Map a requested backend to one that can run here, or raise BackendUnavailableError."""
    if name == "auto":
        name = os.environ.get(ENV_VAR, "auto") or "auto"
        if name == "auto":
            if cupy_available():
                return "cupy"
            return "numba" if numba_available() else "numpy"
    if name not in BACKENDS:
        msg = f"unknown backend {name!r}; expected 'auto' or one of {BACKENDS}"
        raise ValueError(msg)
    if name == "cupy" and not cupy_available():
        msg = (
            "backend 'cupy' was requested but no usable CUDA device was found "
            "(install linstream[gpu] and run on a GPU machine, or use backend='numba')"
        )
        raise BackendUnavailableError(msg)
    if name == "numba" and not numba_available():
        msg = "backend 'numba' was requested but numba is not installed"
        raise BackendUnavailableError(msg)
    return name
