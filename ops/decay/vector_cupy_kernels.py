"""CUDA source of the vector-gated rule's chunkwise kernel (a log gate per key dimension: GLA,
HGRN2), the same chunk boundaries, float64 gate sums and chunk math as ops/decay/vector_numba.py.

The Numba kernel forms A for its narrow key dimensions as one product and pairs only the rest;
here every pair is formed one by one (step 2).

    S_t = diag(exp(g_t)) S_{t-1} + k_t v_tᵀ        y_t = S_tᵀ q_t

Launch geometry as every rule kernel (ops/decay/cupy_kernels.py): NT = 256 threads, grid
(ceil(DV / VALUE_TILE), H), block (x, h) owning value columns [x·VALUE_TILE, +nc) of head h and
walking its chunks in order.  Per chunk of n ≤ C tokens, with G_ip the float64 sums of the
floored gates after the chunk's first token (la0_p, the first token's, kept out of them):
    chunk_end         n: before a non-finite key or value, or a token whose smallest gate erases
    1. load           q, k [n, F], this block's V columns, the state tile in real_t; the gate
                      sums G [n, F] (thread p sums column p in order) and la0 [F]
    2. A              A_ij = Σ_p q_ip k_jp e^{G_ip − G_jp} for j ≤ i (n²/2 · F exponentials)
    3. scale          q_ip ← q_ip e^{la0_p + G_ip},  k_ip ← k_ip e^{G_np − G_ip}, in place
    4. out, state     y_i = Σ_p q_ip S_0[p] + Σ_{j≤i} A_ij v_j (written to out);
                      S[p] ← e^{la0_p + G_np} S[p] + Σ_i k_ip v_i (state_t, in global memory)

Shared memory, `vector_shared_bytes` (each array rounded up to 16 bytes): G [C, F] and la0 [F]
float64, q, k [C, F], v [C, VALUE_TILE], state [F, VALUE_TILE], A [C, C] in real_t, an int.  At
C = 32, F = 64, float32: 43 KiB; at C = 64: 89 KiB.
"""

from __future__ import annotations

from .cupy_kernels import VALUE_TILE, carve_bytes, chunk_end_source, prelude

__all__ = ["vector_shared_bytes", "vector_source"]


def vector_shared_bytes(c: int, f: int, real_size: int) -> int:
    """Dynamic shared memory of one vector_gated_chunks block (its CARVEs, in order)."""
    return carve_bytes(
        (c * f, 8),  # G
        (f, 8),  # la0
        (c * f, real_size),  # q
        (c * f, real_size),  # k
        (c * VALUE_TILE, real_size),  # v
        (f * VALUE_TILE, real_size),  # state tile
        (c * c, real_size),  # A
        (1, 4),  # chunk_end's n
    )


def vector_source(in_kind: str, real_dtype: str, state_dtype: str) -> str:
    """Source of `vector_gated_chunks` for one input kind, compute dtype and state dtype."""
    return (
        prelude(in_kind, real_dtype, state_dtype)
        + chunk_end_source("in_t", "(double)LOAD(x_)")
        + _VECTOR_BODY
    )


_VECTOR_BODY = """
#define FLOOR_GATE(x_) ((x_) < LOG_GATE_FLOOR ? LOG_GATE_FLOOR : (x_))  // a NaN stays NaN

// q, k, g [H, T, F], v [H, T, DV]; s [H, F, DV] updated in place; out [H, T, DV].
// Grid (ceil(DV / TILE), H).
extern "C" __global__ void __launch_bounds__(NT)
vector_gated_chunks(const in_t* __restrict__ q, const in_t* __restrict__ k,
                    const in_t* __restrict__ v, const in_t* __restrict__ g,
                    state_t* __restrict__ s, real_t* __restrict__ out, const long long T,
                    const int F, const int DV, const int C, const int TILE) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char* smem_p = smem_raw;
    CARVE(double, sg, C * F)
    CARVE(double, sla0, F)
    CARVE(real_t, sq, C * F)
    CARVE(real_t, sk, C * F)
    CARVE(real_t, sv, C * TILE)
    CARVE(real_t, ss, F * TILE)
    CARVE(real_t, sa, C * C)
    CARVE(int, s_end, 1)

    const int tid = threadIdx.x;
    const long long h = blockIdx.y;
    const int j0 = blockIdx.x * TILE;
    const int nc = min(TILE, DV - j0);  // value columns of this block
    const in_t* qh = q + h * T * F;
    const in_t* kh = k + h * T * F;
    const in_t* gh = g + h * T * F;
    const in_t* vh = v + h * T * DV;
    state_t* sh = s + h * F * DV;
    real_t* oh = out + h * T * DV;

    for (long long c0 = 0; c0 < T;) {
        const int n = chunk_end(kh, vh, gh, c0, min(c0 + C, T), F, DV, F, s_end);
        // 1. load; thread p sums gate column p in token order (float64)
        for (int p = tid; p < F; p += blockDim.x) {
            const double first = (double)LOAD(gh[c0 * F + p]);
            sla0[p] = FLOOR_GATE(first);
            double acc = 0.0;
            sg[p] = acc;
            for (int i = 1; i < n; ++i) {
                const double x = (double)LOAD(gh[(c0 + i) * F + p]);
                acc += FLOOR_GATE(x);
                sg[i * F + p] = acc;
            }
        }
        for (int e = tid; e < n * F; e += blockDim.x) {
            sq[e] = LOAD(qh[c0 * F + e]);
            sk[e] = LOAD(kh[c0 * F + e]);
        }
        for (int e = tid; e < n * nc; e += blockDim.x) {
            const int i = e / nc, jj = e % nc;
            sv[i * TILE + jj] = LOAD(vh[(c0 + i) * DV + j0 + jj]);
        }
        for (int e = tid; e < F * nc; e += blockDim.x) {
            const int p = e / nc, jj = e % nc;
            ss[p * TILE + jj] = (real_t)sh[(long long)p * DV + j0 + jj];
        }
        __syncthreads();
        // 2. A, the gates differing per key dimension (every exponent <= 0)
        for (int e = tid; e < n * n; e += blockDim.x) {
            const int i = e / n, j = e % n;
            real_t a = (real_t)0;
            if (j <= i) {
                for (int p = 0; p < F; ++p) {
                    const real_t d = (real_t)(sg[i * F + p] - sg[j * F + p]);
                    a += sq[i * F + p] * sk[j * F + p] * REXP(d);
                }
            }
            sa[i * C + j] = a;
        }
        __syncthreads();
        // 3. q and k scaled by their gates, in place
        for (int e = tid; e < n * F; e += blockDim.x) {
            const int p = e % F;
            sq[e] *= REXP((real_t)(sla0[p] + sg[e]));
            sk[e] *= REXP((real_t)(sg[(n - 1) * F + p] - sg[e]));
        }
        __syncthreads();
        // 4. outputs and the state
        for (int e = tid; e < n * nc; e += blockDim.x) {
            const int i = e / nc, jj = e % nc;
            real_t y = (real_t)0;
            for (int p = 0; p < F; ++p) y += sq[i * F + p] * ss[p * TILE + jj];
            real_t intra = (real_t)0;
            for (int j = 0; j <= i; ++j) intra += sa[i * C + j] * sv[j * TILE + jj];
            oh[(c0 + i) * DV + j0 + jj] = y + intra;
        }
        for (int e = tid; e < F * nc; e += blockDim.x) {
            const int p = e / nc, jj = e % nc;
            real_t u = (real_t)0;
            for (int i = 0; i < n; ++i) u += sk[i * F + p] * sv[i * TILE + jj];
            const double decay = exp(sla0[p] + sg[(n - 1) * F + p]);
            state_t* sp = sh + (long long)p * DV + j0 + jj;
            *sp = (state_t)((double)*sp * decay + (double)u);
        }
        c0 += n;
        __syncthreads();  // the tiles are reloaded next chunk
    }
}
"""
