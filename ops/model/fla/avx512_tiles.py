"""The jitted side of `avx512`: its tiles as LLVM IR (Numba intrinsics) and the product that
runs them over a column range's panels (`avx512` says what they compute and why).

    product(a, panels, out, first, cols)   # out[:, first:first+cols] = a @ the panels' columns
"""

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

__all__ = ["MR", "product"]

MR = 8  # rows of a tile (its columns: `avx512.NR`, passed in, three vectors of 16 at most)
ROW_BLOCK = 128  # rows whose input stays in L2 while every panel passes

_F32 = ir.FloatType()
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_V16F = ir.VectorType(_F32, 16)
_V16I = ir.VectorType(_I32, 16)


def _index(i: int) -> ir.Constant:
    return ir.Constant(_I64, i)


def _tile_intrinsic(mr: int, vectors: int, bf16: bool) -> Any:
    """The tile of mr rows by `vectors` × 16 columns as an intrinsic: (a, lda, b, c, ldc, steps)
    with a the rows' steps (bfloat16 pairs as uint32, or float32 values) [≥ mr, ≥ steps] (row
    stride lda), b a panel [steps, vectors × 16] of the same, c float32 (row stride ldc; the
    tile's columns written from its first element)."""

    @intrinsic
    def tile(typingctx, a, lda, b, c, ldc, pairs):
        sig = types.void(a, lda, b, c, ldc, pairs)

        def codegen(context, builder, signature, args):
            a_arr, lda_v, b_arr, c_arr, ldc_v, pairs_v = args
            arr_a = context.make_array(signature.args[0])(context, builder, a_arr)
            arr_b = context.make_array(signature.args[2])(context, builder, b_arr)
            arr_c = context.make_array(signature.args[3])(context, builder, c_arr)
            vec = _V16I if bf16 else _V16F
            fnty = ir.FunctionType(_V16F, [_V16F, vec, vec] if bf16 else [vec, vec, _V16F])
            name = "llvm.x86.avx512bf16.dpbf16ps.512" if bf16 else "llvm.fma.v16f32"
            dot = cgutils.get_or_insert_function(builder.module, fnty, name)
            a_ptr = arr_a.data
            b_ptr = builder.bitcast(arr_b.data, vec.as_pointer())
            c_ptr = arr_c.data
            lda64 = builder.sext(lda_v, _I64) if lda_v.type.width < 64 else lda_v
            ldc64 = builder.sext(ldc_v, _I64) if ldc_v.type.width < 64 else ldc_v
            n = builder.sext(pairs_v, _I64) if pairs_v.type.width < 64 else pairs_v
            zero = ir.Constant(_V16F, [0.0] * 16)
            acc = [
                [cgutils.alloca_once_value(builder, zero) for _ in range(vectors)]
                for _ in range(mr)
            ]
            undef = ir.Constant(vec, None)
            spread = ir.Constant(_V16I, [0] * 16)
            with cgutils.for_range(builder, n) as loop:
                p = loop.index
                base = builder.mul(p, _index(vectors))
                at_b = [builder.add(base, _index(j)) for j in range(vectors)]
                bv = [builder.load(builder.gep(b_ptr, [at]), align=4) for at in at_b]
                for i in range(mr):
                    at = builder.add(builder.mul(_index(i), lda64), p)
                    pair = builder.load(builder.gep(a_ptr, [at]), align=4)
                    wide = builder.insert_element(undef, pair, ir.Constant(_I32, 0))
                    wide = builder.shuffle_vector(wide, undef, spread)
                    for j in range(vectors):
                        s = builder.load(acc[i][j])
                        total = builder.call(dot, [s, wide, bv[j]] if bf16 else [wide, bv[j], s])
                        builder.store(total, acc[i][j])
            for i in range(mr):
                for j in range(vectors):
                    at = builder.add(builder.mul(_index(i), ldc64), _index(16 * j))
                    ptr = builder.bitcast(builder.gep(c_ptr, [at]), _V16F.as_pointer())
                    builder.store(builder.load(acc[i][j]), ptr, align=4)
            return context.get_dummy_value()

        return sig, codegen

    return tile


def _tile(a, lda, b, c, ldc, steps, mr, vectors):
    """One tile (`_tile_intrinsic`) of mr (8, 4, 2 or 1) rows by 3, 2 or 1 vectors, bfloat16
    pairs for uint32 operands and float32 values for float32 ones (the jitted callers' only
    entry: an overload, compiled into them, so that their cache entries hold it)."""
    raise NotImplementedError  # jitted code only


@overload(_tile, jit_options={"nogil": True})
def _tile_overload(a, lda, b, c, ldc, steps, mr, vectors):
    bf16 = a.dtype == types.uint32
    t83, t43, t23, t13 = (_tile_intrinsic(rows, 3, bf16) for rows in (8, 4, 2, 1))
    t82, t42, t22, t12 = (_tile_intrinsic(rows, 2, bf16) for rows in (8, 4, 2, 1))
    t81, t41, t21, t11 = (_tile_intrinsic(rows, 1, bf16) for rows in (8, 4, 2, 1))

    def impl(a, lda, b, c, ldc, steps, mr, vectors):  # pragma: no cover - compiled
        if vectors == 3:
            if mr == 8:
                t83(a, lda, b, c, ldc, steps)
            elif mr == 4:
                t43(a, lda, b, c, ldc, steps)
            elif mr == 2:
                t23(a, lda, b, c, ldc, steps)
            else:
                t13(a, lda, b, c, ldc, steps)
        elif vectors == 2:
            if mr == 8:
                t82(a, lda, b, c, ldc, steps)
            elif mr == 4:
                t42(a, lda, b, c, ldc, steps)
            elif mr == 2:
                t22(a, lda, b, c, ldc, steps)
            else:
                t12(a, lda, b, c, ldc, steps)
        elif mr == 8:
            t81(a, lda, b, c, ldc, steps)
        elif mr == 4:
            t41(a, lda, b, c, ldc, steps)
        elif mr == 2:
            t21(a, lda, b, c, ldc, steps)
        else:
            t11(a, lda, b, c, ldc, steps)

    return impl


@njit(nogil=True, cache=True)
def product(a, panels, out, first, cols, nr):  # pragma: no cover
    """out[:, first:first + cols] = the product of a's rows ([m, steps]: bfloat16 pairs as
    uint32, or float32) by the panels (`avx512._panels`: [steps, nr] each, nr ≤ 48, the last
    [steps, 16 × its vectors], one flat array)."""
    m, steps = a.shape
    lda = a.strides[0] // 4
    ldc = out.strides[0] // 4
    scratch = np.empty((MR, nr), np.float32)
    for r0 in range(0, m, ROW_BLOCK):
        r1 = min(r0 + ROW_BLOCK, m)
        for c0 in range(0, cols, nr):
            width = min(nr, cols - c0)
            vectors = (width + 15) // 16
            panel = panels[c0 * steps : (c0 + 16 * vectors) * steps]
            r = r0
            while r < r1:
                mr = 8 if r1 - r >= 8 else (4 if r1 - r >= 4 else (2 if r1 - r >= 2 else 1))
                if width == 16 * vectors:
                    _tile(a[r:], lda, panel, out[r:, first + c0 :], ldc, steps, mr, vectors)
                else:  # the columns past the range's end go to the scratch tile
                    _tile(a[r:], lda, panel, scratch, nr, steps, mr, vectors)
                    for i in range(mr):
                        for j in range(width):
                            out[r + i, first + c0 + j] = scratch[i, j]
                r += mr
