"""CUDA source of Mamba-2's SSD kernel, the same algorithm, chunk boundaries and float64 segment
sums as ops/ssd/numba.py.

    ssd_bad_rows   one block per token: flags a token whose x, B, C or time step holds an Inf
                   or NaN (the Numba kernel's `_row_finite`, over the whole row: every head)
    ssd_chunks     one block per (head-dim tile, head), the chunk loop inside

Launch geometry as every rule kernel (ops/decay/cupy_kernels.py): NT = 256 threads, grid
(ceil(P / VALUE_TILE), H).  Block (x, h) owns rows [x·VALUE_TILE, +np) of head h's state
[P, N] (and those columns of its outputs): the rows evolve independently, so the tiles need no
communication; each block forms the chunk's CBᵀ of its group itself.  Per chunk of n ≤ C tokens
(a chunk ends early before a flagged token, as the Numba kernel's `_chunk_starts`), with
la_i = max(s_i·A_h, LOG_GATE_FLOOR) for i ≥ 1 (la0, the first token's, kept out of the sums):
    1. load        B, C [n, N] of the head's group, this block's x columns [n, np], the state
                   tile, la and the time steps s (float64); G_i = Σ_{1≤l≤i} la_l from the
                   chunk's start and G_n − G_i = Σ_{i<l<n} la_l from its end (thread 0, float64)
    2. decays      row i of M by thread i: e^{G_i − G_j}·s_j, the segment sum G_i − G_j summed
                   from the diagonal down (float64: never a difference of prefix sums)
    3. M, factors  M_ij ← (C_i·B_j)·M_ij for j ≤ i; e^{la0 + G_i}, s_i·e^{G_n − G_i}
    4. out, state  y_i = e^{la0+G_i} C_i·S_0[p] + Σ_{j≤i} M_ij x_j + D_h x_i (written to out);
                   S[p] ← e^{la0 + G_n} S[p] + Σ_i s_i e^{G_n − G_i} x_ip B_i (state_t, global)

Shared memory, `ssd_shared_bytes` (each array rounded up to 16 bytes): la, s, G, G_n − G [C]
float64; B, C [C, N], x [C, VALUE_TILE], state [VALUE_TILE, N], M [C, C], two factors [C] in
real_t; an int.  At C = 64, N = 128, float32: 95 KiB; at N = 64: 63 KiB.
"""

from __future__ import annotations

from linstream.ops.decay.cupy_kernels import VALUE_TILE, carve_bytes, prelude

__all__ = ["ssd_shared_bytes", "ssd_source"]


def ssd_shared_bytes(c: int, n: int, real_size: int) -> int:
    """Dynamic shared memory of one ssd_chunks block (its CARVEs, in order)."""
    return carve_bytes(
        (c, 8),  # la
        (c, 8),  # s
        (c, 8),  # G
        (c, 8),  # G_n - G
        (c * n, real_size),  # B
        (c * n, real_size),  # C
        (c * VALUE_TILE, real_size),  # x tile
        (VALUE_TILE * n, real_size),  # state tile
        (c * c, real_size),  # M
        (2 * c, real_size),  # factors
        (1, 4),  # the chunk's n
    )


def ssd_source(in_kind: str, real_dtype: str, state_dtype: str) -> str:
    """Source of `ssd_bad_rows` and `ssd_chunks` for one input kind, compute dtype and state
    dtype."""
    return prelude(in_kind, real_dtype, state_dtype) + _SSD_BODY


_SSD_BODY = """
// bad [T] int, zeroed by the caller: set to 1 for a token whose x [T, H, P], B or C [T, G, N]
// or time step (step [T, H] float64) holds an Inf or NaN.  Grid (T,).
extern "C" __global__ void __launch_bounds__(NT)
ssd_bad_rows(const in_t* __restrict__ x, const in_t* __restrict__ b, const in_t* __restrict__ c,
             const double* __restrict__ step, int* __restrict__ bad, const int H, const int P,
             const int G, const int N) {
    const long long t = blockIdx.x;
    const long long nx = (long long)H * P, nb = (long long)G * N;
    for (long long e = threadIdx.x; e < nx + 2 * nb + H; e += blockDim.x) {
        bool finite;
        if (e < nx) finite = isfinite(LOAD(x[t * nx + e]));
        else if (e < nx + nb) finite = isfinite(LOAD(b[t * nb + (e - nx)]));
        else if (e < nx + 2 * nb) finite = isfinite(LOAD(c[t * nb + (e - nx - nb)]));
        else finite = isfinite(step[t * H + (e - nx - 2 * nb)]);
        if (!finite) bad[t] = 1;  // every writer writes the same 1
    }
}

// x [T, H, P], b, c [T, G, N]; step [T, H] (the time steps), a [H] float64; d [H, P] real_t;
// bad [T] from ssd_bad_rows; s [H, P, N] updated in place; out [T, H, P].
// Grid (ceil(P / TILE), H).
extern "C" __global__ void __launch_bounds__(NT)
ssd_chunks(const in_t* __restrict__ x, const in_t* __restrict__ b, const in_t* __restrict__ c,
           const double* __restrict__ step, const double* __restrict__ a,
           const real_t* __restrict__ d, const int* __restrict__ bad, state_t* __restrict__ s,
           real_t* __restrict__ out, const long long T, const int H, const int G, const int P,
           const int N, const int C, const int TILE) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char* smem_p = smem_raw;
    CARVE(double, sla, C)
    CARVE(double, sst, C)
    CARVE(double, sgs, C)
    CARVE(double, srs, C)
    CARVE(real_t, sb, C * N)
    CARVE(real_t, sc, C * N)
    CARVE(real_t, sx, C * TILE)
    CARVE(real_t, ss, TILE * N)
    CARVE(real_t, sm, C * C)
    CARVE(real_t, sf, 2 * C)
    CARVE(int, s_end, 1)
    real_t* seg = sf;      // e^{la0 + G_i}
    real_t* sek = sf + C;  // s_i e^{G_n - G_i}

    const int tid = threadIdx.x;
    const long long h = blockIdx.y;
    const long long g = h / (H / G);
    const int p0 = blockIdx.x * TILE;
    const int np = min(TILE, P - p0);  // state rows (head-dim columns) of this block
    const double ah = a[h];
    state_t* sh = s + h * P * N;

    for (long long c0 = 0; c0 < T;) {
        // the chunk's end: C tokens, or before the first flagged token after its first
        if (tid == 0) {
            const long long stop = min(c0 + C, T);
            long long i = c0 + 1;
            while (i < stop && !bad[i]) ++i;
            *s_end = (int)(i - c0);
        }
        __syncthreads();
        const int n = *s_end;
        // 1. load
        for (int i = tid; i < n; i += blockDim.x) {
            const double si = step[(c0 + i) * H + h];
            const double li = si * ah;
            sst[i] = si;
            sla[i] = li < LOG_GATE_FLOOR ? LOG_GATE_FLOOR : li;  // a NaN stays NaN
        }
        for (int e = tid; e < n * N; e += blockDim.x) {
            const int i = e / N, q = e % N;
            const long long at = ((c0 + i) * G + g) * N + q;
            sb[e] = LOAD(b[at]);
            sc[e] = LOAD(c[at]);
        }
        for (int e = tid; e < n * np; e += blockDim.x) {
            const int i = e / np, pp = e % np;
            sx[i * TILE + pp] = LOAD(x[((c0 + i) * H + h) * P + p0 + pp]);
        }
        for (int e = tid; e < np * N; e += blockDim.x) {
            ss[e] = (real_t)sh[(long long)p0 * N + e];
        }
        __syncthreads();
        if (tid == 0) {  // G_i from the chunk's start, G_n - G_i from its end (float64, in order)
            double acc = 0.0;
            sgs[0] = acc;
            for (int i = 1; i < n; ++i) {
                acc += sla[i];
                sgs[i] = acc;
            }
            acc = 0.0;
            srs[n - 1] = acc;
            for (int i = n - 2; i >= 0; --i) {
                acc += sla[i + 1];
                srs[i] = acc;
            }
        }
        // 2. row i of the decays by thread i, its segment sums from the diagonal down
        for (int i = tid; i < n; i += blockDim.x) {
            double acc = 0.0;
            for (int j = i; j >= 0; --j) {
                sm[i * C + j] = REXP((real_t)acc) * (real_t)sst[j];
                acc += sla[j];  // la of token j enters the segments that start before it
            }
        }
        __syncthreads();
        // 3. M = (C Bᵀ) ⊙ decays, lower triangle; the per-token factors
        const double la0 = sla[0];
        for (int e = tid; e < n * n; e += blockDim.x) {
            const int i = e / n, j = e % n;
            if (j <= i) {
                real_t cb = (real_t)0;
                for (int q = 0; q < N; ++q) cb += sc[i * N + q] * sb[j * N + q];
                sm[i * C + j] *= cb;
            }
        }
        for (int i = tid; i < n; i += blockDim.x) {
            seg[i] = (real_t)exp(la0 + sgs[i]);
            sek[i] = (real_t)(sst[i] * exp(srs[i]));
        }
        __syncthreads();
        // 4. outputs and the state
        for (int e = tid; e < n * np; e += blockDim.x) {
            const int i = e / np, pp = e % np;
            real_t inter = (real_t)0;
            for (int q = 0; q < N; ++q) inter += sc[i * N + q] * ss[pp * N + q];
            real_t intra = (real_t)0;
            for (int j = 0; j <= i; ++j) intra += sm[i * C + j] * sx[j * TILE + pp];
            const real_t xi = sx[i * TILE + pp];
            out[((c0 + i) * H + h) * P + p0 + pp] =
                seg[i] * inter + intra + d[h * P + p0 + pp] * xi;
        }
        const double decay = exp(la0 + sgs[n - 1]);
        for (int e = tid; e < np * N; e += blockDim.x) {
            const int pp = e / N, q = e % N;
            real_t u = (real_t)0;
            for (int i = 0; i < n; ++i) u += sx[i * TILE + pp] * sek[i] * sb[i * N + q];
            state_t* sp = sh + (long long)(p0 + pp) * N + q;
            *sp = (state_t)((double)*sp * decay + (double)u);
        }
        c0 += n;
        __syncthreads();  // the tiles are reloaded next chunk
    }
}
"""
