"""Atomic operations on int64 arrays and a spin-wait hint, for jitted code that threads share
without the GIL (Numba has none of its own).

    load_acquire(a, i)            # a[i], read after every write another thread released before
    store_release(a, i, v)        # a[i] = v, after every earlier write of this thread
    compare_exchange(a, i, old, new)  # a[i] = new if a[i] == old; whether it did (a full barrier)
    spin_pause()                  # the CPU's spin-wait hint (x86 `pause`; nothing elsewhere)

Each takes a 1-D int64 array (any stride) and an index, and compiles to one LLVM atomic
instruction: a plain load in a spin loop may be read once and hoisted out of it.  On x86 the
acquire load and the release store are ordinary moves (its memory order already gives them);
`compare_exchange` is `lock cmpxchg`, which also orders an earlier store before a later load
(what a "going to sleep" flag checked against a "work published" counter needs).
"""

from __future__ import annotations

import platform
from typing import Any

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

__all__ = ["compare_exchange", "load_acquire", "spin_pause", "store_release"]

_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


def _item(context: Any, builder: Any, aryty: Any, ary: Any, i: Any) -> Any:
    a = context.make_array(aryty)(context, builder, ary)
    return cgutils.get_item_pointer(context, builder, aryty, a, [i])


def _int64_vector(arr: Any) -> bool:
    return isinstance(arr, types.Array) and arr.ndim == 1 and arr.dtype == types.int64


def _load_acquire(typingctx: Any, arr: Any, i: Any) -> Any:
    if not (_int64_vector(arr) and isinstance(i, types.Integer)):
        return None
    sig = types.int64(arr, types.intp)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        ptr = _item(context, builder, sig.args[0], args[0], args[1])
        return builder.load_atomic(ptr, "acquire", 8)

    return sig, codegen


def _store_release(typingctx: Any, arr: Any, i: Any, v: Any) -> Any:
    if not (_int64_vector(arr) and isinstance(i, types.Integer) and isinstance(v, types.Integer)):
        return None
    sig = types.void(arr, types.intp, types.int64)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        ptr = _item(context, builder, sig.args[0], args[0], args[1])
        builder.store_atomic(args[2], ptr, "release", 8)
        return context.get_dummy_value()

    return sig, codegen


def _compare_exchange(typingctx: Any, arr: Any, i: Any, old: Any, new: Any) -> Any:
    ints = all(isinstance(x, types.Integer) for x in (i, old, new))
    if not (_int64_vector(arr) and ints):
        return None
    sig = types.boolean(arr, types.intp, types.int64, types.int64)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        ptr = _item(context, builder, sig.args[0], args[0], args[1])
        pair = builder.cmpxchg(ptr, args[2], args[3], "seq_cst", "seq_cst")
        return builder.extract_value(pair, 1)

    return sig, codegen


def _spin_pause(typingctx: Any) -> Any:
    sig = types.void()

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        if _X86:  # Numba's JIT has no inline assembly: the intrinsic LLVM maps to `pause`
            fnty = ir.FunctionType(ir.VoidType(), [])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.sse2.pause")
            builder.call(fn, [])
        return context.get_dummy_value()

    return sig, codegen


# jitted code calls these (typingctx is implicit there); to mypy they are Any
load_acquire: Any = intrinsic(_load_acquire)
store_release: Any = intrinsic(_store_release)
compare_exchange: Any = intrinsic(_compare_exchange)
spin_pause: Any = intrinsic(_spin_pause)
