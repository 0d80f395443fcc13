"""CUDA source of the generalized delta rule's chunkwise kernel in DPLR form (RWKV-7's time mix),
the same algorithm (WY / UT-transform form), chunk boundaries and float64 decay sums as
ops/dplr/numba.py.

    S_t = diag(e^{w_t}) S_{t-1} + b_t (a_tᵀ S_{t-1}) + k_t v_tᵀ        o_t = S_tᵀ q_t

Launch geometry as every rule kernel (ops/decay/cupy_kernels.py): NT = 256 threads, grid
(ceil(DV / VALUE_TILE), H), block (x, h) owning value columns [x·VALUE_TILE, +nc) of head h and
walking its chunks in order (the columns of V, U, O and S evolve independently).  Per chunk of
n ≤ C tokens, with G'_ip the float64 sums of the floored log decays after the chunk's first token
(gf_p, the first token's, kept out of them), as in the Numba kernel's docstring:
    chunk end     n: before a token at which the decays since the chunk's first (each token's
                  smallest over d_k) would sum below −span, or whose k, v, a or b holds an Inf or
                  NaN (each thread checks a strided share; thread 0 sums the decays in order)
    1. load       G' [n, d_k] (thread p sums column p in order), q, k, a, b [n, d_k], this
                  block's V columns, the state tile, in real_t
    2. scale      q ← q e^{G'_i}, a ← a e^{G'_{i-1}} (0 in row 0), k ← k e^{−G'_i},
                  b ← b e^{−G'_i} in place; e^{gf}, e^{G'_n} [d_k]
    3. A          A_qk, A_qb (j ≤ i) and A_ak, A_ab (j < i): one dot product each over d_k
    4. R          R_i = Σ_{j<i} A_ak[i,j] v_j + (a_i e^{G_{i-1}})ᵀ S_0
    5. U          U_i = R_i + Σ_{j<i} A_ab[i,j] U_j, column r by thread r (forward substitution)
    6. out, state o_i = (q_i e^{G_i})ᵀ S_0 + Σ_{j≤i} A_qk[i,j] v_j + A_qb[i,j] u_j (to out);
                  S[p] ← e^{gf_p + G'_np} S[p] + Σ_i e^{G'_np − G'_ip}(k_ip v_i + b_ip u_i)
                  (state_t, in global memory)

Shared memory, `dplr_shared_bytes` (each array rounded up to 16 bytes): G' [C, d_k], gf [d_k]
and each token's smallest decay [C] in float64; q, k, a, b [C, d_k], e^{gf}, e^{G'_n} and the
first token's a [d_k], V and U [C, VALUE_TILE], the state tile [d_k, VALUE_TILE], the four A
[C, C] in real_t; an int.  At C = 32, d_k = 64, float32: 73 KiB; at C = 64: 172 KiB.
"""

from __future__ import annotations

from linstream.ops.decay.cupy_kernels import VALUE_TILE, carve_bytes, prelude

__all__ = ["dplr_shared_bytes", "dplr_source"]


def dplr_shared_bytes(c: int, dk: int, real_size: int) -> int:
    """Dynamic shared memory of one dplr_chunks block (its CARVEs, in order)."""
    return carve_bytes(
        (c * dk, 8),  # G'
        (dk, 8),  # gf
        (c, 8),  # each token's smallest decay
        *[(c * dk, real_size)] * 4,  # q, k, a, b
        *[(dk, real_size)] * 3,  # e^{gf}, e^{G'_n}, the first token's a
        (c * VALUE_TILE, real_size),  # V
        (c * VALUE_TILE, real_size),  # R, then U
        (dk * VALUE_TILE, real_size),  # state tile
        *[(c * c, real_size)] * 4,  # A_qk, A_qb, A_ak, A_ab
        (1, 4),  # the chunk's n
    )


def dplr_source(in_kind: str, real_dtype: str, state_dtype: str) -> str:
    """Source of `dplr_chunks` for one input kind, compute dtype and state dtype."""
    return prelude(in_kind, real_dtype, state_dtype) + _DPLR_BODY


_DPLR_BODY = """
#define FLOOR_GATE(x_) ((x_) < LOG_GATE_FLOOR ? LOG_GATE_FLOOR : (x_))  // a NaN stays NaN

// q, k, a, b, lw [T, H, DK], v [T, H, DV]; s [H, DK, DV] updated in place; out [T, H, DV];
// span: the most the decays after a chunk's first token may sum to.  Grid (ceil(DV / TILE), H).
extern "C" __global__ void __launch_bounds__(NT)
dplr_chunks(const in_t* __restrict__ q, const in_t* __restrict__ k, const in_t* __restrict__ v,
            const in_t* __restrict__ a, const in_t* __restrict__ b, const in_t* __restrict__ lw,
            state_t* __restrict__ s, real_t* __restrict__ out, const long long T, const int H,
            const int DK, const int DV, const int C, const int TILE, const double span) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char* smem_p = smem_raw;
    CARVE(double, sg, C * DK)
    CARVE(double, sgf, DK)
    CARVE(double, smin, C)
    CARVE(real_t, sq, C * DK)
    CARVE(real_t, sk, C * DK)
    CARVE(real_t, sa, C * DK)
    CARVE(real_t, sb, C * DK)
    CARVE(real_t, sef, DK)
    CARVE(real_t, sen, DK)
    CARVE(real_t, sa0, DK)
    CARVE(real_t, sv, C * TILE)
    CARVE(real_t, su, C * TILE)
    CARVE(real_t, ss, DK * TILE)
    CARVE(real_t, sqk, C * C)
    CARVE(real_t, sqb, C * C)
    CARVE(real_t, sak, C * C)
    CARVE(real_t, sab, C * C)
    CARVE(int, s_end, 1)

    const int tid = threadIdx.x;
    const long long h = blockIdx.y;
    const int j0 = blockIdx.x * TILE;
    const int nc = min(TILE, DV - j0);  // value columns of this block
    state_t* sh = s + h * DK * DV;
#define AT(i_, p_) ((((c0 + (i_)) * H) + h) * DK + (p_))  // token c0 + i, head h, key dim p
#define VAT(i_, r_) ((((c0 + (i_)) * H) + h) * DV + (r_))

    for (long long c0 = 0; c0 < T;) {
        // the chunk's end
        const long long stop = min(c0 + C, T);
        if (tid == 0) *s_end = (int)(stop - c0);
        __syncthreads();
        for (int i = 1 + tid; i < stop - c0; i += blockDim.x) {  // each token's smallest decay
            double m = 0.0;
            for (int p = 0; p < DK; ++p) {
                const double x = FLOOR_GATE((double)LOAD(lw[AT(i, p)]));
                if (x < m || isnan(x)) m = x;
            }
            smin[i] = m;
        }
        {
            const long long per = 3LL * DK + DV;
            const long long total = (stop - c0 - 1) * per;
            for (long long e = tid; e < total; e += blockDim.x) {
                const int i = 1 + (int)(e / per);
                const int x = (int)(e % per);
                bool bad;
                if (x < DK) bad = !isfinite(LOAD(k[AT(i, x)]));
                else if (x < 2 * DK) bad = !isfinite(LOAD(a[AT(i, x - DK)]));
                else if (x < 3 * DK) bad = !isfinite(LOAD(b[AT(i, x - 2 * DK)]));
                else bad = !isfinite(LOAD(v[VAT(i, x - 3 * DK)]));
                if (bad) atomicMin(s_end, i);
            }
        }
        __syncthreads();
        if (tid == 0) {  // the decays since the first token, summed in order (float64)
            const int limit = *s_end;
            double acc = 0.0;
            for (int i = 1; i < limit; ++i) {
                acc += smin[i];
                if (!(acc >= -span)) {
                    *s_end = i;
                    break;
                }
            }
        }
        __syncthreads();
        const int n = *s_end;
        // 1. load; thread p sums decay column p in token order (float64)
        for (int p = tid; p < DK; p += blockDim.x) {
            sgf[p] = FLOOR_GATE((double)LOAD(lw[AT(0, p)]));
            sa0[p] = LOAD(a[AT(0, p)]);
            double acc = 0.0;
            sg[p] = acc;
            for (int i = 1; i < n; ++i) {
                acc += FLOOR_GATE((double)LOAD(lw[AT(i, p)]));
                sg[i * DK + p] = acc;
            }
        }
        for (int e = tid; e < n * DK; e += blockDim.x) {
            const int i = e / DK, p = e % DK;
            sq[e] = LOAD(q[AT(i, p)]);
            sk[e] = LOAD(k[AT(i, p)]);
            sa[e] = LOAD(a[AT(i, p)]);
            sb[e] = LOAD(b[AT(i, p)]);
        }
        for (int e = tid; e < n * nc; e += blockDim.x) {
            const int i = e / nc, r = e % nc;
            sv[i * TILE + r] = LOAD(v[VAT(i, j0 + r)]);
        }
        for (int e = tid; e < DK * nc; e += blockDim.x) {
            const int p = e / nc, r = e % nc;
            ss[p * TILE + r] = (real_t)sh[(long long)p * DV + j0 + r];
        }
        __syncthreads();
        // 2. scale by the decays, in place (every e^{-G'} <= e^{span})
        for (int e = tid; e < n * DK; e += blockDim.x) {
            const int i = e / DK;
            const real_t gi = (real_t)sg[e];
            const real_t inv = REXP(-gi);
            sq[e] *= REXP(gi);
            sa[e] *= i == 0 ? (real_t)0 : REXP((real_t)sg[e - DK]);
            sk[e] *= inv;
            sb[e] *= inv;
        }
        for (int p = tid; p < DK; p += blockDim.x) {
            sef[p] = REXP((real_t)sgf[p]);
            sen[p] = REXP((real_t)sg[(n - 1) * DK + p]);
        }
        __syncthreads();
        // 3. the four A matrices, masked
        for (int e = tid; e < n * n; e += blockDim.x) {
            const int i = e / n, j = e % n;
            real_t qk = (real_t)0, qb = (real_t)0, ak = (real_t)0, ab = (real_t)0;
            if (j <= i) {
                for (int p = 0; p < DK; ++p) {
                    qk += sq[i * DK + p] * sk[j * DK + p];
                    qb += sq[i * DK + p] * sb[j * DK + p];
                }
            }
            if (j < i) {
                for (int p = 0; p < DK; ++p) {
                    ak += sa[i * DK + p] * sk[j * DK + p];
                    ab += sa[i * DK + p] * sb[j * DK + p];
                }
            }
            sqk[i * C + j] = qk;
            sqb[i * C + j] = qb;
            sak[i * C + j] = ak;
            sab[i * C + j] = ab;
        }
        __syncthreads();
        // 4. R = A_ak V + (A e^{G_{i-1}}) S_0 (row 0 reads S_0 with its own a, undecayed)
        for (int e = tid; e < n * nc; e += blockDim.x) {
            const int i = e / nc, r = e % nc;
            real_t acc = (real_t)0;
            for (int j = 0; j < i; ++j) acc += sak[i * C + j] * sv[j * TILE + r];
            real_t st = (real_t)0;
            if (i == 0) {
                for (int p = 0; p < DK; ++p) st += sa0[p] * ss[p * TILE + r];
            } else {
                for (int p = 0; p < DK; ++p) st += sa[i * DK + p] * sef[p] * ss[p * TILE + r];
            }
            su[i * TILE + r] = acc + st;
        }
        __syncthreads();
        // 5. U_i = R_i + sum_(j<i) A_ab[i,j] U_j, column r by thread r, in place of R
        for (int r = tid; r < nc; r += blockDim.x) {
            for (int i = 1; i < n; ++i) {
                real_t acc = su[i * TILE + r];
                for (int j = 0; j < i; ++j) acc += sab[i * C + j] * su[j * TILE + r];
                su[i * TILE + r] = acc;
            }
        }
        __syncthreads();
        // 6. outputs and the state
        for (int e = tid; e < n * nc; e += blockDim.x) {
            const int i = e / nc, r = e % nc;
            real_t st = (real_t)0;
            for (int p = 0; p < DK; ++p) st += sq[i * DK + p] * sef[p] * ss[p * TILE + r];
            real_t intra = (real_t)0;
            for (int j = 0; j <= i; ++j) {
                intra += sqk[i * C + j] * sv[j * TILE + r] + sqb[i * C + j] * su[j * TILE + r];
            }
            out[VAT(i, j0 + r)] = st + intra;
        }
        for (int e = tid; e < DK * nc; e += blockDim.x) {
            const int p = e / nc, r = e % nc;
            real_t u = (real_t)0;
            for (int i = 0; i < n; ++i) {
                u += sk[i * DK + p] * sv[i * TILE + r] + sb[i * DK + p] * su[i * TILE + r];
            }
            u *= sen[p];
            const double decay = exp(sgf[p] + sg[(n - 1) * DK + p]);
            state_t* sp = sh + (long long)p * DV + j0 + r;
            *sp = (state_t)((double)*sp * decay + (double)u);
        }
        c0 += n;
        __syncthreads();  // the tiles are reloaded next chunk
    }
#undef AT
#undef VAT
}
"""
