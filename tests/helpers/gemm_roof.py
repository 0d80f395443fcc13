"""The GEMM roofs of the fla roof benchmark (tests/bench/test_bench_fla_roof.py): per product
shape of a model's chunk, the fastest float32 and bfloat16 products the machine has, each timed
once after a warm call.

    gemms = float32_gemms(shapes)     # shapes: {(rows, in, out): count in a chunk}
    gemms_bf16 = bfloat16_gemms(shapes)   # [] on a CPU without native bfloat16 products
    seconds = roof_seconds(gemms)     # one sample: the chunk's products at the fastest rates
"""

from __future__ import annotations

import functools
import time
from typing import Any

import numpy as np

__all__ = ["bfloat16_gemms", "cpu_flags", "float32_gemms", "roof_seconds", "rows_of"]


def cpu_flags() -> list[str]:
    """The CPU's feature flags, as /proc/cpuinfo lists them."""
    with open("/proc/cpuinfo") as f:
        return next((line for line in f if line.startswith("flags")), "").split()


def rows_of(product, x: np.ndarray, out: np.ndarray, r: slice) -> None:
    """One thread's rows of a product (`row_split`'s call): product(x[r], out=out[r])."""
    product(x[r], out=out[r])


def _on_packed(packed: Any, x: np.ndarray, out: np.ndarray, halves: Any) -> list:
    """A weight packed once (one column range), multiplied at 1 thread and as two threads of
    half the rows (the runtime's row ranges): two GEMMs, (threads for BLAS, the call)."""
    rows = functools.partial(rows_of, functools.partial(packed.rows, j=0), x, out)
    return [
        (1, functools.partial(packed.rows, x, 0, out)),
        (1, functools.partial(halves, rows, x.shape[0])),
    ]


def float32_gemms(shapes: dict[tuple[int, int, int], int]) -> list[tuple[float, int, list]]:
    """Per distinct product shape (t, k, n): its FLOPs, its count in a chunk, and the float32
    GEMMs that form it (operands made once): NumPy's BLAS at 2 threads and at 1; where MKL is
    found, MKL's SGEMM at 1 thread, at 2 of its own where its library runs them (PyTorch's
    copy), as two threads each running half the rows (the runtime's row ranges), and the same
    two on the weight packed once where MKL packs; where the CPU has AVX-512, linstream's
    float32 kernel on the weight packed once, at 1 thread and as two threads of half the rows
    (the float32 mode's own products, by CPU).  Each GEMM
    is (threads for BLAS, the call)."""
    from linstream.ops.model.fla import avx512, mkl
    from linstream.ops.model.threads import row_split

    try:
        mkl.library()
        have_mkl = True
    except mkl.MKLUnavailable:
        have_mkl = False
    halves = row_split(2)
    rng = np.random.default_rng(0)
    out_list = []
    for (t, k, n), count in shapes.items():
        x = rng.standard_normal((t, k), dtype=np.float32)
        w = rng.standard_normal((n, k), dtype=np.float32)
        out = np.empty((t, n), np.float32)
        gemms = [(threads, functools.partial(np.matmul, x, w.T, out=out)) for threads in (2, 1)]
        if have_mkl:
            gemms += [
                (1, functools.partial(mkl.sgemm_rows, x, w, out, threads)) for threads in (2, 1)
            ]
            rows = functools.partial(rows_of, functools.partial(mkl.sgemm_rows, w=w), x, out)
            gemms.append((1, functools.partial(halves, rows, t)))
            if mkl.can_pack(np.float32):
                gemms += _on_packed(mkl.Packed(w, [slice(0, n)]), x, out, halves)
        if avx512.reason_unavailable("float32") is None:  # linstream's kernel, packed once
            gemms += _on_packed(avx512.Packed(w, [slice(0, n)]), x, out, halves)
        out_list.append((2.0 * t * k * n, count, gemms))
    return out_list


def bfloat16_gemms(shapes: dict[tuple[int, int, int], int]) -> list[tuple[float, int, list]]:
    """As `float32_gemms`, the bfloat16 products (bfloat16 inputs, float32 accumulation) the
    machine has, on the input rounded once: linstream's AVX512-BF16 kernel and MKL's bfloat16
    product where MKL packs bfloat16, each on the weight packed once, at 1 thread and as two
    threads of half the rows; PyTorch's bfloat16 matmul (oneDNN; it writes bfloat16, not
    float32, into an output it allocates), one intra-op thread each, as two threads of half the
    rows only.  Empty where none has the instructions natively (the bfloat16 rows are then read
    against the float32 roof)."""
    from linstream.ops.model.fla import avx512, mkl
    from linstream.ops.model.fla.bf16 import BF16
    from linstream.ops.model.threads import row_split

    kernel = avx512.reason_unavailable("bfloat16") is None
    try:
        mkl.library()
        native = {"avx512_bf16", "amx_bf16"} & set(cpu_flags())
        have_mkl = mkl.can_pack("bfloat16") and bool(native)  # else MKL emulates them
    except mkl.MKLUnavailable:
        have_mkl = False
    if not (kernel or have_mkl):
        return []
    import torch

    halves = row_split(2)
    rng = np.random.default_rng(0)
    out_list = []
    for (t, k, n), count in shapes.items():
        x = rng.standard_normal((t, k), dtype=np.float32).astype(BF16)
        w = rng.standard_normal((n, k), dtype=np.float32).astype(BF16)
        out = np.empty((t, n), np.float32)
        gemms = []
        for packed in (
            *([avx512.Packed(w, [slice(0, n)])] if kernel else []),
            *([mkl.Packed(w, [slice(0, n)])] if have_mkl else []),
        ):
            gemms += _on_packed(packed, x, out, halves)
        xt = torch.from_numpy(x.view(np.uint16).astype(np.int32) << 16).view(torch.float32)
        wt = torch.from_numpy(w.view(np.uint16).astype(np.int32) << 16).view(torch.float32)
        xt, wt = xt.bfloat16(), wt.bfloat16()  # the same values, exactly

        def linear(r: slice, xt=xt, wt=wt) -> None:
            torch.nn.functional.linear(xt[r], wt)

        gemms.append((1, functools.partial(_one_torch_thread_each, halves, linear, t)))
        out_list.append((2.0 * t * k * n, count, gemms))
    return out_list


def _one_torch_thread_each(halves: Any, linear: Any, t: int) -> None:
    """halves(linear, t) with PyTorch at one intra-op thread (each half on its own thread),
    its thread count as it was afterwards (the process's other products keep theirs)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        halves(linear, t)
    finally:
        torch.set_num_threads(before)


def roof_seconds(gemms: list[tuple[float, int, list]]) -> float:
    """The seconds a chunk's products take at the fastest of each shape's GEMMs, each timed
    once after a warm call (one round's sample of the roof)."""
    from threadpoolctl import threadpool_limits

    seconds = 0.0
    for _, count, calls in gemms:
        best = float("inf")
        for threads, gemm in calls:
            with threadpool_limits(threads, user_api="blas"):
                gemm()
                t0 = time.perf_counter()
                gemm()
                best = min(best, time.perf_counter() - t0)
        seconds += best * count
    return seconds
