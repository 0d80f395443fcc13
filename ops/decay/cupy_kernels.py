"""CUDA source of the decaying rules' chunkwise kernel (decay, gated), and the pieces every rule
kernel shares: types, loads, shared-memory carving and `chunk_end`.

    decay_chunks   one block per (value-column tile, head), the chunk loop inside: the same
                   algorithm, chunk boundaries and float64 gate sums as ops/decay/numba.py

Launch geometry (all rule kernels): blocks of NT = 256 threads (one dimension), grid
(ceil(DV / VALUE_TILE), H).  Block (x, h) owns value columns [x·VALUE_TILE, x·VALUE_TILE + nc)
of head h (nc ≤ VALUE_TILE: the last tile may be narrower) and walks the head's chunks in
order; the columns of V evolve independently under every rule here, so the tiles need no
communication.  Each block recomputes what all columns share (QKᵀ, the gates): that
redundancy is the price of one kernel and no inter-block traffic.  Work inside a phase is spread
over the block's threads by a flat loop (e = threadIdx.x; e < count; e += blockDim.x); phases
are separated by __syncthreads(), and every barrier sits in block-uniform code.

For decay_chunks, per chunk of n ≤ C tokens (C the chunk length; z rides as column DV of V):
    chunk_end                  n: the chunk ends early before a non-finite key or value or an
                               erasing gate (as the Numba kernels' `chunk_end`)
    1. load                    q, k [n, F], this block's V columns and the ones column, the state
                               tile in real_t, the gate sums g_i (float64, thread 0, in order)
    2. factors, A              e^{la0+g_i}, e^{g_n-g_i}; A_ij = (q_i·k_j) e^{g_i-g_j} for j ≤ i
    3. num | den, state        nd_i = e^{la0+g_i} q_iᵀS_0 + Σ_{j≤i} A_ij [v_j | 1] into shared;
                               S ← e^{la0+g_n} S + Σ_i e^{g_n-g_i} k_i v_iᵀ (in state_t)
    4. out                     nd / (den + eps_t) in float64 (or nd without normalize)
The value columns of S are updated in place in global memory (each block owns its columns);
z, which every tile needs, is kept per block in shared memory (state_t), read from a copy the
wrapper makes before the launch and written back by the block of tile 0 at its end.

Shared memory, `decay_shared_bytes` (each array rounded up to 16 bytes): g [C] float64,
z [F] state_t, q, k [C, F], v [C, VALUE_TILE + 1], state [F, VALUE_TILE + 1], nd
[C, VALUE_TILE + 1], A [C, C], two factors [C] in real_t, and an int.  At C = 64, F = 64,
float32: 62 KiB (above the 48 KiB default, so the wrapper opts in).
"""

from __future__ import annotations

from linstream.ops.cuda import IN_TYPES, REAL_TYPES
from linstream.ops.decay.constants import ERASING_GATE, LOG_GATE_FLOOR

__all__ = [
    "NT",
    "VALUE_TILE",
    "carve_bytes",
    "chunk_end_source",
    "decay_shared_bytes",
    "decay_source",
    "prelude",
]

NT = 256  # threads per block, every rule kernel
VALUE_TILE = 16  # value columns per block
_ALIGN = 16


def prelude(in_kind: str, real_dtype: str, state_dtype: str) -> str:
    """Types, loads and helpers at the top of every rule kernel's source."""
    in_t, load = IN_TYPES[in_kind]
    real = REAL_TYPES[real_dtype]
    return f"""
typedef {in_t} in_t;          // q, k, v as stored ({in_kind})
typedef {real} real_t;        // chunk math
typedef {REAL_TYPES[state_dtype]} state_t;  // the carried state
#define LOAD(v_) {load}
#define REXP(x_) {"expf" if real == "float" else "exp"}(x_)
#define ERASING_GATE ({ERASING_GATE!r})
#define LOG_GATE_FLOOR ({LOG_GATE_FLOOR!r})
#define NT {NT}
// carve dynamic shared memory: each array starts 16-byte aligned (see carve_bytes)
#define CARVE(type_, name_, count_) \\
    type_* name_ = reinterpret_cast<type_*>(smem_p); \\
    smem_p += ((long long)(count_) * (long long)sizeof(type_) + 15) / 16 * 16;
"""


def carve_bytes(*arrays: tuple[int, int]) -> int:
    """Shared bytes of arrays carved in turn by CARVE: (count, itemsize) each."""
    return sum(-(-n * size // _ALIGN) * _ALIGN for n, size in arrays)


def chunk_end_source(gate_t: str, gate_value: str) -> str:
    """`chunk_end` for a gate array of type gate_t read as `gate_value` (of x_), GW per token."""
    return f"""
// The end (exclusive, <= stop) of the chunk that starts at token c0: before the first later
// token whose key (kr [T, F]) or value (vr [T, W]) holds an Inf or NaN, or one of whose GW
// gates (gr [T, GW]) is below ERASING_GATE.  Block-wide (every thread calls it and gets the
// same n); each thread checks a strided share of the (token, element) pairs.
__device__ int chunk_end(const in_t* __restrict__ kr, const in_t* __restrict__ vr,
                         const {gate_t}* __restrict__ gr, const long long c0,
                         const long long stop, const int F, const int W, const int GW,
                         int* s_end) {{
    if (threadIdx.x == 0) *s_end = (int)(stop - c0);
    __syncthreads();
    const long long per = F + W + GW;
    const long long total = (stop - c0 - 1) * per;
    for (long long e = threadIdx.x; e < total; e += blockDim.x) {{
        const long long i = c0 + 1 + e / per;
        const long long x = e % per;
        bool bad;
        if (x < F) {{
            bad = !isfinite(LOAD(kr[i * F + x]));
        }} else if (x < F + W) {{
            bad = !isfinite(LOAD(vr[i * W + (x - F)]));
        }} else {{
            const {gate_t} x_ = gr[i * GW + (x - F - W)];
            bad = ({gate_value}) < ERASING_GATE;
        }}
        if (bad) atomicMin(s_end, (int)(i - c0));
    }}
    __syncthreads();
    const int n = *s_end;
    __syncthreads();  // every thread has read s_end before the next chunk's thread 0 resets it
    return n;
}}
"""


def decay_shared_bytes(c: int, f: int, real_size: int, state_size: int) -> int:
    """Dynamic shared memory of one decay_chunks block (the CARVEs in its source, in order)."""
    sj = VALUE_TILE + 1
    return carve_bytes(
        (c, 8),  # g
        (f, state_size),  # z
        (c * f, real_size),  # q
        (c * f, real_size),  # k
        (c * sj, real_size),  # v
        (f * sj, real_size),  # state tile
        (c * sj, real_size),  # nd
        (c * c, real_size),  # A
        (c, real_size),  # e^{la0+g_i}
        (c, real_size),  # e^{g_n-g_i}
        (1, 4),  # chunk_end's n
    )


def decay_source(in_kind: str, real_dtype: str, state_dtype: str) -> str:
    """Source of `decay_chunks` for one input kind, compute dtype and state dtype."""
    return (
        prelude(in_kind, real_dtype, state_dtype) + chunk_end_source("double", "x_") + _DECAY_BODY
    )


_DECAY_BODY = """
// q, k [H, T, F], v [H, T, DV + 1] (last column ones), s [H, F, DV + 1] (z last), updated in
// place; z0 [H, F] a copy of z before the call (every tile starts from it: s's z column is
// written by tile 0 at its end, which may come before another tile's start); log_a (floored),
// eps_t [H, T] float64; out [H, T, DV].  Grid (ceil(DV / TILE), H).
extern "C" __global__ void __launch_bounds__(NT)
decay_chunks(const in_t* __restrict__ q, const in_t* __restrict__ k, const in_t* __restrict__ v,
             state_t* __restrict__ s, const state_t* __restrict__ z0,
             const double* __restrict__ log_a,
             const double* __restrict__ eps_t, real_t* __restrict__ out, const long long T,
             const int F, const int DV, const int C, const int TILE, const int normalize) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char* smem_p = smem_raw;
    const int SJ = TILE + 1;  // row stride of the column tiles
    CARVE(double, sg, C)
    CARVE(state_t, sz, F)
    CARVE(real_t, sq, C * F)
    CARVE(real_t, sk, C * F)
    CARVE(real_t, sv, C * SJ)
    CARVE(real_t, ss, F * SJ)
    CARVE(real_t, snd, C * SJ)
    CARVE(real_t, sa, C * C)
    CARVE(real_t, seg, C)
    CARVE(real_t, sek, C)
    CARVE(int, s_end, 1)

    const int tid = threadIdx.x;
    const long long h = blockIdx.y;
    const int j0 = blockIdx.x * TILE;
    const int nc = min(TILE, DV - j0);  // value columns of this block; tile column nc is z
    const int NJ = nc + 1;
    const int W = DV + 1;
    const in_t* qh = q + h * T * F;
    const in_t* kh = k + h * T * F;
    const in_t* vh = v + h * T * W;
    state_t* sh = s + h * F * W;
    const double* lah = log_a + h * T;
    const double* eph = eps_t + h * T;
    real_t* oh = out + h * T * DV;

    for (int p = tid; p < F; p += blockDim.x) sz[p] = z0[h * F + p];
    __syncthreads();

    for (long long c0 = 0; c0 < T;) {
        const int n = chunk_end(kh, vh, lah, c0, min(c0 + C, T), F, W, 1, s_end);
        // 1. load
        if (tid == 0) {  // g_i = sum of the gates after the chunk's first, in order (float64)
            double acc = 0.0;
            sg[0] = acc;
            for (int i = 1; i < n; ++i) {
                acc += lah[c0 + i];
                sg[i] = acc;
            }
        }
        for (int e = tid; e < n * F; e += blockDim.x) {
            const long long g = c0 * F + e;
            sq[e] = LOAD(qh[g]);
            sk[e] = LOAD(kh[g]);
        }
        for (int e = tid; e < n * NJ; e += blockDim.x) {
            const int i = e / NJ, jj = e % NJ;
            const int col = jj < nc ? j0 + jj : DV;
            sv[i * SJ + jj] = LOAD(vh[(c0 + i) * W + col]);
        }
        for (int e = tid; e < F * NJ; e += blockDim.x) {
            const int p = e / NJ, jj = e % NJ;
            ss[p * SJ + jj] = (real_t)(jj < nc ? sh[(long long)p * W + j0 + jj] : sz[p]);
        }
        __syncthreads();
        // 2. factors and A (every exponent <= 0)
        const double la0 = lah[c0];
        const double gn = sg[n - 1];
        for (int i = tid; i < n; i += blockDim.x) {
            seg[i] = (real_t)exp(la0 + sg[i]);
            sek[i] = (real_t)exp(gn - sg[i]);
        }
        for (int e = tid; e < n * n; e += blockDim.x) {
            const int i = e / n, j = e % n;
            real_t a = (real_t)0;
            if (j <= i) {
                for (int p = 0; p < F; ++p) a += sq[i * F + p] * sk[j * F + p];
                a *= REXP((real_t)(sg[i] - sg[j]));
            }
            sa[i * C + j] = a;
        }
        __syncthreads();
        // 3. numerator | denominator rows, and the state
        for (int e = tid; e < n * NJ; e += blockDim.x) {
            const int i = e / NJ, jj = e % NJ;
            real_t inter = (real_t)0;
            for (int p = 0; p < F; ++p) inter += sq[i * F + p] * ss[p * SJ + jj];
            real_t intra = (real_t)0;
            for (int j = 0; j <= i; ++j) intra += sa[i * C + j] * sv[j * SJ + jj];
            snd[i * SJ + jj] = seg[i] * inter + intra;
        }
        const double egn = exp(la0 + gn);
        for (int e = tid; e < F * NJ; e += blockDim.x) {
            const int p = e / NJ, jj = e % NJ;
            real_t u = (real_t)0;
            for (int i = 0; i < n; ++i) u += sk[i * F + p] * sek[i] * sv[i * SJ + jj];
            if (jj < nc) {
                state_t* sp = sh + (long long)p * W + j0 + jj;
                *sp = (state_t)((double)*sp * egn + (double)u);
            } else {
                sz[p] = (state_t)((double)sz[p] * egn + (double)u);
            }
        }
        __syncthreads();
        // 4. outputs
        for (int e = tid; e < n * nc; e += blockDim.x) {
            const int i = e / nc, jj = e % nc;
            const real_t nd = snd[i * SJ + jj];
            real_t y = nd;
            if (normalize) y = (real_t)((double)nd / ((double)snd[i * SJ + nc] + eph[c0 + i]));
            oh[(c0 + i) * DV + j0 + jj] = y;
        }
        c0 += n;
        __syncthreads();  // the tiles are reloaded next chunk
    }
    if (blockIdx.x == 0) {
        for (int p = tid; p < F; p += blockDim.x) sh[(long long)p * W + DV] = sz[p];
    }
}
"""
