"""CuPy (CUDA) backend: every chunk of a call at once, with the state's prefix over chunks.

For chunks n = 0..N-1 of C tokens (Q̃ = φ(Q), K̃ = φ(K), V̂ = [V | 1], the ones column carries z):

    ΔS_n = K̃_nᵀ V̂_n                       one batched cuBLAS product for all chunks and heads
    S_n  = S_0 + Σ_(m<n) ΔS_m              prefix over chunks, summed in float64 (`state_scan`)
    out  = (Q̃_n S_n + tril(Q̃_n K̃_nᵀ) V̂_n) split into numerator | denominator, then divided

Q̃_n S_n and Q̃_n K̃_nᵀ are batched cuBLAS products; the masked intra-chunk product and the
normalization are one fused kernel (`cupy_kernels.intra_norm`) that writes out [T, H, d_v]
directly; `prep` applies the feature map, casts (bfloat16 bits -> float32 on the device) and
lays q/k/v out head-major with zero padding to whole chunks; `state_scan` walks the chunks of
every state entry in float64 registers (the same additions, in the same order, as adding each
chunk's float32 contribution to a float64 state).  The state stays on
the device for the whole call; it is copied to the host only when the caller gave a host state.

`scan_causal` is the algorithm against an array namespace and a kernel set: `NumpyKernels` (the
three kernels as array code, for NumPy or CuPy) or `CupyKernels` (the CUDA kernels, launched by
a `linstream.ops.cuda.Launcher`).  `cupy_causal` runs it with the current device's launcher; the
CPU tests give it the emulator's (tests/helpers/cuda_emu.py), which runs the same CUDA source
over emulated blocks and threads on NumPy arrays.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from linstream.ops.attention_state import AttentionState
from linstream.ops.cuda import (
    Bfloat16Bits,
    Launcher,
    cupy_launcher,
    input_kind,
    raw_array,
    set_shared_bytes,
    xp_cupy,
)
from linstream.ops.feature_maps import EluPlusOne, FeatureMap, Identity, Relu, get_feature_map

from . import cupy_kernels as ck

__all__ = [
    "Bfloat16Bits",
    "CupyKernels",
    "NumpyKernels",
    "cupy_causal",
    "scan_causal",
    "xp_cupy",
]

# Cap on the elements of one work array (per token: H · max(F, C, d_v + 1, F (d_v + 1) / C));
# longer calls run in blocks of whole chunks, the state carried between them (2**26 float32 =
# 256 MiB per array, about 1.5 GiB of work arrays in all).
MAX_BLOCK_ELEMENTS = 2**26

# Maps the prep kernel applies in-register (matched by exact type: a subclass may change
# `query`); any other map (FAVOR+) runs through its own array code on the device.
_FUSED_MAP_TYPES: dict[type, str] = {EluPlusOne: "elu+1", Relu: "relu", Identity: "identity"}


def _fused_name(fm: FeatureMap) -> str | None:
    return _FUSED_MAP_TYPES.get(type(fm))


# ---- kernel sets: how prep, state_scan and intra_norm run ---------------------------------


class NumpyKernels:
    """The three kernels in plain array code (works for NumPy and CuPy alike)."""

    def __init__(self, xp: Any = np) -> None:
        self.xp = xp

    def prep(self, x: Any, kind: str, fm: FeatureMap, cdt: Any, tp: int, role: str) -> Any:
        """x [T, H, D] -> [H, TP, W]: role "q" is mapped by fm.query, "k" by fm, "v" gets a
        ones column instead; rows T..TP-1 are zero."""
        xp = self.xp
        t, h, _d = (int(n) for n in x.shape)
        if kind == "bfloat16":
            xc = (x.astype(xp.uint32) << xp.uint32(16)).view(xp.float32).astype(cdt)
        else:
            xc = x.astype(cdt, copy=False)
        xc = xc.transpose(1, 0, 2)
        xf = fm.query(xc, xp=xp) if role == "q" else fm(xc, xp=xp) if role == "k" else xc
        ones_col = role == "v"
        w = int(xf.shape[2]) + int(ones_col)
        y = xp.zeros((h, tp, w), dtype=cdt)
        y[:, :t, : xf.shape[2]] = xf
        if ones_col:
            y[:, :t, -1] = 1
        return y

    def scan(self, ds: Any, sx: Any, cdt: Any) -> tuple[Any, Any]:
        """(state before each chunk [H, N, F, d_v+1] in cdt, state after the last, float64)."""
        xp = self.xp
        # S_0, S_0 + ΔS_0, ... summed left to right in float64, as state_scan does
        acc = xp.cumsum(xp.concatenate([sx[:, None], ds], axis=1), axis=1, dtype=np.float64)
        return acc[:, :-1].astype(cdt), xp.ascontiguousarray(acc[:, -1])

    def intra(self, a: Any, vx: Any, inter: Any, eps: float, t: int) -> Any:
        xp = self.xp
        h, nch, c, _ = a.shape
        dv = vx.shape[2] - 1
        am = a * xp.tril(xp.ones((c, c), dtype=a.dtype))
        nd = inter.reshape(h, nch, c, dv + 1) + xp.matmul(am, vx.reshape(h, nch, c, dv + 1))
        nd = nd.reshape(h, nch * c, dv + 1)[:, :t]
        return xp.ascontiguousarray((nd[..., :dv] / (nd[..., dv:] + eps)).transpose(1, 0, 2))


class CupyKernels(NumpyKernels):
    """The CUDA kernels, compiled and launched by a `Launcher` (by default the current device's
    CuPy; the tests pass the CPU emulator's)."""

    def __init__(self, launcher: Launcher | None = None) -> None:
        self.launcher = launcher if launcher is not None else cupy_launcher()
        super().__init__(self.launcher.xp)

    def _intra_kernel(self, c: int, dv: int, real: str) -> Any:
        kern = self.launcher.kernel(ck.intra_source(c, dv, real), "intra_norm")
        set_shared_bytes(kern, ck.intra_shared_bytes(c, dv, np.dtype(real).itemsize))
        return kern

    def prep(self, x: Any, kind: str, fm: FeatureMap, cdt: Any, tp: int, role: str) -> Any:
        name = "identity" if role == "v" else _fused_name(fm)
        if name is None or kind == "float16":
            return super().prep(x, kind, fm, cdt, tp, role)
        ones_col = role == "v"
        cp = self.xp
        x = cp.ascontiguousarray(x)
        t, h, d = (int(n) for n in x.shape)
        w = d + int(ones_col)
        y = cp.empty((h, tp, w), dtype=cdt)
        rows_per_block = ck.PREP_BLOCK[1]
        blocks = max(1, min((h * tp + rows_per_block - 1) // rows_per_block, 65535 * 16))
        kern = self.launcher.kernel(ck.prep_source(name, kind, np.dtype(cdt).name), "prep")
        args = (x, y, np.int64(t), np.int64(h), np.int64(d), np.int64(tp), np.int64(w))
        kern((blocks,), ck.PREP_BLOCK, (*args, np.int32(ones_col)))
        return y

    def scan(self, ds: Any, sx: Any, cdt: Any) -> tuple[Any, Any]:
        cp = self.xp
        h, nch, f, dvx = (int(n) for n in ds.shape)
        ds = cp.ascontiguousarray(ds)
        s0 = cp.ascontiguousarray(sx, dtype=cp.float64)
        pre = cp.empty(ds.shape, dtype=cdt)
        final = cp.empty((h, f, dvx), dtype=cp.float64)
        e = f * dvx
        blocks = (h * e + ck.SCAN_BLOCK - 1) // ck.SCAN_BLOCK
        kern = self.launcher.kernel(ck.scan_source(np.dtype(cdt).name), "state_scan")
        kern(
            (blocks,),
            (ck.SCAN_BLOCK,),
            (ds, s0, pre, final, np.int64(h), np.int64(nch), np.int64(e)),
        )
        return pre, final

    def intra(self, a: Any, vx: Any, inter: Any, eps: float, t: int) -> Any:
        cp = self.xp
        h, nch, c, _ = a.shape
        dv = vx.shape[2] - 1
        rdt = np.dtype(a.dtype)
        smem = ck.intra_shared_bytes(c, dv, rdt.itemsize)
        if smem > self.launcher.max_shared_bytes():  # tiles too large: the array code instead
            return super().intra(a, vx, inter, eps, t)
        a, vx, inter = (cp.ascontiguousarray(x) for x in (a, vx, inter))  # the kernel's layout
        out = cp.empty((t, h, dv), dtype=rdt)
        kern = self._intra_kernel(int(c), int(dv), rdt.name)
        args = (a, vx, inter, out, np.int64(t), np.int64(h), np.int64(vx.shape[1]))
        kern((nch, h), (ck.INTRA_BLOCK,), (*args, np.int64(nch), rdt.type(eps)), shared_mem=smem)
        return out


# ---- the algorithm, against an array namespace ---------------------------------------------


def scan_causal(
    q: Any,
    k: Any,
    v: Any,
    state: AttentionState,
    *,
    feature_map: FeatureMap,
    eps: float,
    chunk_size: int,
    dtype: Any,
    xp: Any,
    kernels: NumpyKernels,
    kinds: tuple[str, str, str] | None = None,
    max_block_elements: int = MAX_BLOCK_ELEMENTS,
) -> tuple[Any, AttentionState]:
    """Causal linear attention over q, k [T, H, d_k], v [T, H, d_v] (arrays of `xp`; bfloat16 as
    raw uint16 bits with kinds[i] == 'bfloat16') from `state` (arrays of `xp`, any float dtype).

    Returns (out [T, H, d_v] in `dtype`, state in the given state's dtype, arrays of `xp`).
    The prefix over chunks is summed in float64 whatever the state's dtype.
    """
    t, h, dk = (int(n) for n in q.shape)
    dv = int(v.shape[2])
    cdt = np.dtype(dtype)
    kq, kk, kv = kinds or (q.dtype.name, k.dtype.name, v.dtype.name)
    f = int(state.S.shape[1])
    c = max(1, int(chunk_size))
    sx = xp.empty((h, f, dv + 1), dtype=np.float64)
    sx[:, :, :dv] = state.S
    sx[:, :, dv] = state.z
    # Elements per token of the largest work array (the prefix holds F x (d_v + 1) per chunk).
    per_token = h * max(f, c, dv + 1, dk, -(-f * (dv + 1) // c))
    block = max(c, (max_block_elements // per_token) // c * c)
    outs = [xp.empty((0, h, dv), dtype=cdt)] if t == 0 else []
    for s in range(0, t, block):
        e = min(s + block, t)
        o, sx = _scan_block(
            q[s:e], k[s:e], v[s:e], sx, (kq, kk, kv), feature_map, eps, c, cdt, xp, kernels
        )
        outs.append(o)
    out = outs[0] if len(outs) == 1 else xp.concatenate(outs, axis=0)
    sdt = state.S.dtype
    new = AttentionState(
        xp.ascontiguousarray(sx[:, :, :dv]).astype(sdt, copy=False),
        xp.ascontiguousarray(sx[:, :, dv]).astype(sdt, copy=False),
    )
    return out, new


def _scan_block(
    q: Any,
    k: Any,
    v: Any,
    sx: Any,
    kinds: tuple[str, str, str],
    fm: FeatureMap,
    eps: float,
    c: int,
    cdt: np.dtype,
    xp: Any,
    kernels: NumpyKernels,
) -> tuple[Any, Any]:
    t, h, _ = (int(n) for n in q.shape)
    nch = -(-t // c)
    tp = nch * c
    qh = kernels.prep(q, kinds[0], fm, cdt, tp, "q")  # [H, TP, F]
    kh = kernels.prep(k, kinds[1], fm, cdt, tp, "k")
    vx = kernels.prep(v, kinds[2], fm, cdt, tp, "v")  # [H, TP, d_v + 1]
    f = int(qh.shape[2])
    if kh.shape != qh.shape or sx.shape[1] != f:
        msg = f"feature map gave q̃ {qh.shape}, k̃ {kh.shape}; the state expects F = {sx.shape[1]}"
        raise ValueError(msg)
    dvx = int(vx.shape[2])
    q4 = qh.reshape(h, nch, c, f)
    k4 = kh.reshape(h, nch, c, f)
    v4 = vx.reshape(h, nch, c, dvx)
    ds = xp.matmul(k4.swapaxes(2, 3), v4)  # [H, N, F, d_v + 1]  chunk contributions
    pre, final = kernels.scan(ds, sx, cdt)  # state before each chunk (cdt); after all (f64)
    inter = xp.matmul(q4, pre)  # [H, N, C, d_v + 1]
    a = xp.matmul(q4, k4.swapaxes(2, 3))  # [H, N, C, C]
    out = kernels.intra(a, vx, inter.reshape(h, tp, dvx), eps, t)
    return out, final


# ---- the public entry point ------------------------------------------------------------------


def cupy_causal(
    q: Any,
    k: Any,
    v: Any,
    state: AttentionState,
    *,
    feature_map: str | FeatureMap = "elu+1",
    eps: float = 1e-6,
    chunk_size: int = 64,
    dtype: Any = None,
    launcher: Launcher | None = None,
) -> tuple[Any, AttentionState]:
    """Causal linear attention on the GPU, continuing from `state`.

    q, k: [T, H, d_k], v: [T, H, d_v]: NumPy or CuPy arrays of float32, float64 or bfloat16
    (an ml_dtypes bfloat16 dtype, or `Bfloat16Bits`).  state: AttentionState(S [H, F, d_v],
    z [H, F]) of NumPy or CuPy arrays.  dtype: compute dtype (float32 unless given or an input
    is float64).  Returns (out [T, H, d_v] in the compute dtype, the new state in the given
    state's dtype): out is a CuPy array when q is one, else NumPy; the state likewise follows
    the given state, so a caller that keeps its state on the device never copies it to the host.
    launcher: where the kernels run (default: the current CUDA device through CuPy).
    """
    lau = launcher if launcher is not None else cupy_launcher()
    cp = lau.xp
    fm = get_feature_map(feature_map)
    kinds = (input_kind("q", q), input_kind("k", k), input_kind("v", v))
    if dtype is None:
        dtype = np.float64 if "float64" in kinds else np.float32
    cdt = np.dtype(dtype)
    if cdt not in (np.float32, np.float64):
        msg = f"compute dtype must be float32 or float64, got {cdt}"
        raise TypeError(msg)
    device_out = isinstance(raw_array(q, kinds[0]), cp.ndarray)
    device_state = isinstance(state.S, cp.ndarray)
    qd, kd, vd = (cp.asarray(raw_array(x, kd_)) for x, kd_ in zip((q, k, v), kinds, strict=True))
    st = AttentionState(cp.asarray(state.S), cp.asarray(state.z))
    t = int(qd.shape[0])
    if t == 0:
        out = cp.empty((0, qd.shape[1], vd.shape[2]), dtype=cdt)
        new = AttentionState(st.S.copy(), st.z.copy())
    else:
        out, new = scan_causal(
            qd,
            kd,
            vd,
            st,
            feature_map=fm,
            eps=float(eps),
            chunk_size=chunk_size,
            dtype=cdt,
            xp=cp,
            kernels=_cupy_kernels() if launcher is None else CupyKernels(lau),
            kinds=kinds,
        )
    if not device_out:
        out = lau.to_host(out)
    if not device_state:
        new = AttentionState(lau.to_host(new.S), lau.to_host(new.z))
    return out, new


@functools.cache
def _cupy_kernels() -> CupyKernels:
    return CupyKernels()
