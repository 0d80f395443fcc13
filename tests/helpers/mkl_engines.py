"""What MKL can do here, for the tests that pick the products' engines: whether it packs a
dtype's weights, and an engine of each mode that keeps the weights as loaded (mapped)."""

from __future__ import annotations

from linstream.ops.model.fla import mkl

__all__ = ["can_pack", "intel_cpu", "mapping_engine"]


def can_pack(dtype: str = "bfloat16") -> bool:
    """Whether MKL is found and packs `dtype` ("bfloat16": Intel's package; "float32": either
    library) weights."""
    try:
        return mkl.can_pack(dtype)
    except mkl.MKLUnavailable:
        return False


def mapping_engine(mode: str = "bfloat16") -> str:
    """An engine of the mode that keeps the weights as loaded: MKL's unpacked products where
    the library is found (mkl-mapped), else the widening one (bfloat16) or NumPy's BLAS
    (float32)."""
    try:
        mkl.library()
    except mkl.MKLUnavailable:
        return "widen" if mode == "bfloat16" else "numpy"
    return "mkl-mapped"


def intel_cpu() -> bool:
    """Whether this CPU is Intel's (where the runtime picks MKL's float32 products)."""
    from linstream.ops.model.fla.f32 import _intel

    return _intel()
