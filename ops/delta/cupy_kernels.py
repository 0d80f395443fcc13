"""CUDA source of the delta rules' chunkwise kernel (delta, gated_delta; WY / UT-transform form),
the same algorithm, chunk boundaries and float64 gate sums as ops/delta/numba.py.

With u_i = β_i (v_i − α_i S_{i−1}ᵀ k_i) every step is S_i = α_i S_{i−1} + k_i u_iᵀ, and over a
chunk from S_0 (G_i the gate sums from the chunk's start, e^{G} the diagonal of e^{G_i}):

    (I + L) U = B V − B e^{G} K S_0,     L_ij = β_i e^{G_i − G_j} k_i·k_j  (j < i)
    U = T R,  T = (I + L)^{−1},  R = B V − B e^{G} K S_0
    Y = e^{G} Q S_0 + (Q Kᵀ ⊙ D) U,      S_n = e^{G_n} S_0 + (e^{G_n − G} ⊙ K)ᵀ U

(the Numba kernel forms U as T(BV) − (T B e^{G} K) S_0: the same product, another rounding).
Column j of U, Y and S depends only on column j of V and S_0, so value-column tiles are
independent, as for the other rules.

Launch geometry as every rule kernel (ops/decay/cupy_kernels.py): NT = 256 threads, grid
(ceil(DV / VALUE_TILE), H), block (x, h) owning value columns [x·VALUE_TILE, +nc) of head h and
walking its chunks in order.  Per chunk of n ≤ C tokens:
    chunk_end        n: before a non-finite key or value, or an erasing gate
    1. load          q, k [n, F], this block's V columns, the state tile in real_t, g (thread 0)
    2. L, factors    L_ij for j < i; e^{la0+g_i}, β_i e^{la0+g_i}, e^{g_n−g_i}, β_i
    3. T, R          T by forward substitution, thread r computing column r (T's column r needs
                     only column r: no barrier inside); R in place of the V tile
    4. U, A          U = T R; A_ij = (q_i·k_j) e^{g_i−g_j} for j ≤ i, in L's place
    5. out, state    y_i = e^{la0+g_i} q_iᵀS_0 + Σ_{j≤i} A_ij u_j;
                     S ← e^{la0+g_n} S + Σ_i e^{g_n−g_i} k_i u_iᵀ (state_t, in global memory)

Shared memory, `delta_shared_bytes` (each array rounded up to 16 bytes): g [C] float64; q, k
[C, F]; V/R, U [C, VALUE_TILE]; state [F, VALUE_TILE]; L/A, T [C, C]; four factors [C] in real_t;
an int.  At C = 64, F = 64, float32: 78 KiB; at F = 128: 114 KiB.
"""

from __future__ import annotations

from linstream.ops.decay.cupy_kernels import VALUE_TILE, carve_bytes, chunk_end_source, prelude

__all__ = ["delta_shared_bytes", "delta_source"]


def delta_shared_bytes(c: int, f: int, real_size: int) -> int:
    """Dynamic shared memory of one delta_chunks block (its CARVEs, in order)."""
    return carve_bytes(
        (c, 8),  # g
        (c * f, real_size),  # q
        (c * f, real_size),  # k
        (c * VALUE_TILE, real_size),  # V, then R
        (c * VALUE_TILE, real_size),  # U
        (f * VALUE_TILE, real_size),  # state tile
        (c * c, real_size),  # L, then A
        (c * c, real_size),  # T
        (4 * c, real_size),  # factors
        (1, 4),  # chunk_end's n
    )


def delta_source(in_kind: str, real_dtype: str, state_dtype: str) -> str:
    """Source of `delta_chunks` for one input kind, compute dtype and state dtype."""
    return (
        prelude(in_kind, real_dtype, state_dtype) + chunk_end_source("double", "x_") + _DELTA_BODY
    )


_DELTA_BODY = """
// q, k [H, T, F] (k unit keys), v [H, T, DV]; s [H, F, DV] updated in place; log_a (floored),
// beta [H, T] float64; out [H, T, DV].  Grid (ceil(DV / TILE), H).
extern "C" __global__ void __launch_bounds__(NT)
delta_chunks(const in_t* __restrict__ q, const in_t* __restrict__ k, const in_t* __restrict__ v,
             state_t* __restrict__ s, const double* __restrict__ log_a,
             const double* __restrict__ beta, real_t* __restrict__ out, const long long T,
             const int F, const int DV, const int C, const int TILE) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char* smem_p = smem_raw;
    CARVE(double, sg, C)
    CARVE(real_t, sq, C * F)
    CARVE(real_t, sk, C * F)
    CARVE(real_t, sv, C * TILE)
    CARVE(real_t, su, C * TILE)
    CARVE(real_t, ss, F * TILE)
    CARVE(real_t, sl, C * C)
    CARVE(real_t, st, C * C)
    CARVE(real_t, sf, 4 * C)
    CARVE(int, s_end, 1)
    real_t* seg = sf;          // e^{la0+g_i}
    real_t* sebg = sf + C;     // beta_i e^{la0+g_i}
    real_t* sek = sf + 2 * C;  // e^{g_n-g_i}
    real_t* sb = sf + 3 * C;   // beta_i

    const int tid = threadIdx.x;
    const long long h = blockIdx.y;
    const int j0 = blockIdx.x * TILE;
    const int nc = min(TILE, DV - j0);  // value columns of this block
    const in_t* qh = q + h * T * F;
    const in_t* kh = k + h * T * F;
    const in_t* vh = v + h * T * DV;
    state_t* sh = s + h * F * DV;
    const double* lah = log_a + h * T;
    const double* bh = beta + h * T;
    real_t* oh = out + h * T * DV;

    for (long long c0 = 0; c0 < T;) {
        const int n = chunk_end(kh, vh, lah, c0, min(c0 + C, T), F, DV, 1, s_end);
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
        // 2. per-token factors and L (every exponent <= 0)
        const double la0 = lah[c0];
        const double gn = sg[n - 1];
        for (int i = tid; i < n; i += blockDim.x) {
            const double b = bh[c0 + i];
            seg[i] = (real_t)exp(la0 + sg[i]);
            sebg[i] = (real_t)(b * exp(la0 + sg[i]));
            sek[i] = (real_t)exp(gn - sg[i]);
            sb[i] = (real_t)b;
        }
        for (int e = tid; e < n * n; e += blockDim.x) {
            const int i = e / n, j = e % n;
            real_t l = (real_t)0;
            if (j < i) {
                for (int p = 0; p < F; ++p) l += sk[i * F + p] * sk[j * F + p];
                l *= (real_t)bh[c0 + i] * REXP((real_t)(sg[i] - sg[j]));
            }
            sl[i * C + j] = l;
        }
        __syncthreads();
        // 3. T = (I + L)^-1, column r by thread r: T_ir = [i == r] - sum_(r<=j<i) L_ij T_jr;
        //    R = B V - B e^G K S_0 in place of the V tile
        for (int r = tid; r < n; r += blockDim.x) {
            for (int i = 0; i < r; ++i) st[i * C + r] = (real_t)0;
            st[r * C + r] = (real_t)1;
            for (int i = r + 1; i < n; ++i) {
                real_t x = (real_t)0;
                for (int j = r; j < i; ++j) x -= sl[i * C + j] * st[j * C + r];
                st[i * C + r] = x;
            }
        }
        for (int e = tid; e < n * nc; e += blockDim.x) {
            const int m = e / nc, jj = e % nc;
            real_t ks = (real_t)0;
            for (int p = 0; p < F; ++p) ks += sk[m * F + p] * ss[p * TILE + jj];
            sv[m * TILE + jj] = sb[m] * sv[m * TILE + jj] - sebg[m] * ks;
        }
        __syncthreads();
        // 4. U = T R; A in L's place (L is no longer read)
        for (int e = tid; e < n * nc; e += blockDim.x) {
            const int i = e / nc, jj = e % nc;
            real_t u = (real_t)0;
            for (int m = 0; m <= i; ++m) u += st[i * C + m] * sv[m * TILE + jj];
            su[i * TILE + jj] = u;
        }
        for (int e = tid; e < n * n; e += blockDim.x) {
            const int i = e / n, j = e % n;
            real_t a = (real_t)0;
            if (j <= i) {
                for (int p = 0; p < F; ++p) a += sq[i * F + p] * sk[j * F + p];
                a *= REXP((real_t)(sg[i] - sg[j]));
            }
            sl[i * C + j] = a;
        }
        __syncthreads();
        // 5. outputs and the state
        for (int e = tid; e < n * nc; e += blockDim.x) {
            const int i = e / nc, jj = e % nc;
            real_t inter = (real_t)0;
            for (int p = 0; p < F; ++p) inter += sq[i * F + p] * ss[p * TILE + jj];
            real_t intra = (real_t)0;
            for (int j = 0; j <= i; ++j) intra += sl[i * C + j] * su[j * TILE + jj];
            oh[(c0 + i) * DV + j0 + jj] = seg[i] * inter + intra;
        }
        const double egn = exp(la0 + gn);
        for (int e = tid; e < F * nc; e += blockDim.x) {
            const int p = e / nc, jj = e % nc;
            real_t u = (real_t)0;
            for (int i = 0; i < n; ++i) u += sk[i * F + p] * sek[i] * su[i * TILE + jj];
            state_t* sp = sh + (long long)p * DV + j0 + jj;
            *sp = (state_t)((double)*sp * egn + (double)u);
        }
        c0 += n;
        __syncthreads();  // the tiles are reloaded next chunk
    }
}
"""
