"""CUDA sources of the CuPy backend's three kernels: prep, state_scan and the fused intra_norm.

    prep        raw q/k/v [T, H, D] (float32, float64, or bfloat16 bits) -> head-major, zero-padded,
                feature-mapped [H, TP, W] in the compute dtype; V gets a ones column (W = D + 1)
    state_scan  the state before every chunk: S_n = S_0 + Σ_(m<n) ΔS_m, summed in float64 in
                registers (one thread per state entry), written in the compute dtype
    intra_norm  per (chunk, head): the masked intra-chunk product tril(A) [V | 1] plus the
                inter-chunk term Q̃S | Q̃z from cuBLAS, then the normalization, written straight
                into out [T, H, DV].  Two variants: a register-tiled one (each of 16 x 16 threads
                owns a (C/16) x (DV/16) tile of outputs) when C and DV are multiples of 16, and a
                one-output-per-thread one for any other shape.

The index arithmetic is named once per layout, in `PREP_MACROS` / `INTRA_MACROS` /
`SCAN_MACROS`, which the sources `#define`.  Launch geometry: prep, blocks of PREP_BLOCK (32
columns x 8 rows), a grid-stride loop over rows; state_scan, SCAN_BLOCK threads, one per state
entry; intra_norm, INTRA_BLOCK threads per (chunk, head) block with the chunk's A and [V | 1]
tiles in dynamic shared memory (`intra_shared_bytes`).  The CPU tests run these sources on
emulated blocks and threads (tests/helpers/cuda_emu.py) and compile them with NVRTC.
"""

from __future__ import annotations

from linstream.ops.cuda import IN_TYPES as _IN_TYPES
from linstream.ops.cuda import REAL_TYPES as _REAL_TYPES

__all__ = [
    "FUSED_MAPS",
    "INTRA_BLOCK",
    "PREP_BLOCK",
    "SCAN_BLOCK",
    "intra_shared_bytes",
    "intra_source",
    "intra_tiled",
    "prep_source",
    "scan_source",
]

PREP_BLOCK = (32, 8)  # 32 threads along a row (coalesced), 8 rows per block
INTRA_BLOCK = 256
SCAN_BLOCK = 256
TILE_THREADS = 16  # the tiled intra_norm: 16 row groups x 16 column groups = INTRA_BLOCK

# Feature maps the prep kernel applies in-register; any other map runs through the array code.
FUSED_MAPS: dict[str, str] = {
    "identity": "(x_)",
    "relu": "(x_ > (real_t)0 ? x_ : (real_t)0)",
    "elu+1": "(x_ > (real_t)0 ? x_ + (real_t)1 : exp(x_))",
}


# Index expressions of the CUDA sources, one per layout.
PREP_MACROS: dict[str, tuple[tuple[str, ...], str]] = {
    "SRC_IDX": (("t", "h", "d"), "(((t) * H + (h)) * D + (d))"),  # x [T, H, D]
    "ROW_T": (("r",), "((r) % TP)"),  # y [H, TP, W] as rows r = h TP + t
    "ROW_H": (("r",), "((r) / TP)"),
    "Y_IDX": (("r", "w"), "((r) * W + (w))"),
}
INTRA_MACROS: dict[str, tuple[tuple[str, ...], str]] = {
    "ROW": (("h", "n", "i"), "((h) * TP + (n) * C + (i))"),  # row of [H, TP, *]
    "A_IDX": (("h", "n", "i", "s"), "((((h) * NCH + (n)) * C + (i)) * C + (s))"),  # [H,NCH,C,C]
    "X_IDX": (("r", "j"), "((r) * (DV + 1) + (j))"),  # [H, TP, DV + 1] at row r
    "SA": (("i", "s"), "((i) * (C + 1) + (s))"),  # shared A tile, rows padded by one
    "SV": (("s", "j"), "((s) * (DV + 1) + (j))"),  # shared [V | 1] tile
    "OUT_IDX": (("t", "h", "j"), "(((t) * H + (h)) * DV + (j))"),  # out [T, H, DV]
    "TROW": (("ti", "r"), "((ti) + TI * (r))"),  # tiled: the thread's r-th row (interleaved,
    "TCOL": (("tj", "q"), "((tj) + TJ * (q))"),  # so rows of every length share the work)
}
SCAN_MACROS: dict[str, tuple[tuple[str, ...], str]] = {
    "SCAN_H": (("o",), "((o) / E)"),  # thread o owns entry e of head h's S | z (E = F (DV+1))
    "SCAN_E": (("o",), "((o) % E)"),
    "SCAN_IDX": (("h", "n", "e"), "(((h) * NCH + (n)) * E + (e))"),  # [H, NCH, F, DV + 1]
}


def _defines(macros: dict[str, tuple[tuple[str, ...], str]]) -> str:
    return "\n".join(f"#define {n}({', '.join(a)}) {body}" for n, (a, body) in macros.items())


def prep_source(fmap: str, in_dtype: str, real_dtype: str) -> str:
    """Source of `prep` for one feature map (a FUSED_MAPS key), input and compute dtype."""
    in_t, load = _IN_TYPES[in_dtype]
    return f"""
typedef {_REAL_TYPES[real_dtype]} real_t;
typedef {in_t} in_t;
{_defines(PREP_MACROS)}
#define LOAD(v_) {load}
#define FMAP(x_) {FUSED_MAPS[fmap]}

// Row r = h TP + t of y [H, TP, W] per threadIdx.y (grid-stride over rows), its columns w per
// threadIdx.x: one division per row, coalesced loads and stores along w.  Rows t >= T are
// padding: zero, so padded keys add nothing to the state (φ(0) need not be 0).  With ones_col,
// column D is 1.
extern "C" __global__ void prep(const in_t* __restrict__ x, real_t* __restrict__ y,
                                const long long T, const long long H, const long long D,
                                const long long TP, const long long W, const int ones_col) {{
    const long long rows = H * TP;
    const long long step = (long long)gridDim.x * blockDim.y;
    for (long long r = (long long)blockIdx.x * blockDim.y + threadIdx.y; r < rows; r += step) {{
        const long long t = ROW_T(r), h = ROW_H(r);
        for (long long w = threadIdx.x; w < W; w += blockDim.x) {{
            real_t val = (real_t)0;
            if (t < T) {{
                if (w < D) {{
                    const real_t x_ = LOAD(x[SRC_IDX(t, h, w)]);
                    val = FMAP(x_);
                }} else if (ones_col) {{
                    val = (real_t)1;
                }}
            }}
            y[Y_IDX(r, w)] = val;
        }}
    }}
}}
"""


_INTRA_LOAD = """
    extern __shared__ __align__(16) unsigned char smem_raw[];
    real_t* sa = reinterpret_cast<real_t*>(smem_raw);  // [C][C + 1]
    real_t* sv = sa + C * (C + 1);                      // [C][DV + 1]
    const long long n = blockIdx.x, h = blockIdx.y;
    for (int e = threadIdx.x; e < C * C; e += blockDim.x) {
        const int i = e / C, s = e % C;
        sa[SA(i, s)] = (s <= i) ? a[A_IDX(h, n, i, s)] : (real_t)0;  // causal mask
    }
    for (int e = threadIdx.x; e < C * (DV + 1); e += blockDim.x) {
        const int s = e / (DV + 1), j = e % (DV + 1);
        sv[SV(s, j)] = vx[X_IDX(ROW(h, n, s), j)];
    }
    __syncthreads();
"""

_INTRA_SIGNATURE = """intra_norm(const real_t* __restrict__ a, const real_t* __restrict__ vx,
           const real_t* __restrict__ inter, real_t* __restrict__ out,
           const long long T, const long long H, const long long TP, const long long NCH,
           const real_t eps)"""


def _intra_simple_source(c: int, dv: int, real_dtype: str) -> str:
    return f"""
typedef {_REAL_TYPES[real_dtype]} real_t;
#define C {int(c)}
#define DV {int(dv)}
{_defines(INTRA_MACROS)}

// Block (n, h) = chunk n of head h.  a: Q̃K̃ᵀ per chunk from cuBLAS (unmasked);
// vx: [V | 1]; inter: Q̃S_n | Q̃z_n from cuBLAS, S_n the state before chunk n.
// out[t, h, j] = (inter[i, j] + sum_(s<=i) A[i,s] V[s,j])
//                / (inter[i, DV] + sum_(s<=i) A[i,s] + eps),   t = n C + i
extern "C" __global__ void __launch_bounds__({INTRA_BLOCK})
{_INTRA_SIGNATURE} {{{_INTRA_LOAD}
    for (int e = threadIdx.x; e < C * DV; e += blockDim.x) {{
        const int i = e / DV, j = e % DV;
        const long long t = n * C + i;
        if (t >= T) continue;  // padding rows: nothing to write (no barrier follows)
        const long long r = ROW(h, n, i);
        real_t num = inter[X_IDX(r, j)];
        real_t den = inter[X_IDX(r, DV)];
        for (int s = 0; s <= i; ++s) {{
            const real_t w = sa[SA(i, s)];
            num += w * sv[SV(s, j)];
            den += w * sv[SV(s, DV)];
        }}
        out[OUT_IDX(t, h, j)] = num / (den + eps);
    }}
}}
"""


def intra_tiled(c: int, dv: int) -> bool:
    """Whether intra_norm uses its register-tiled variant for this chunk size and width."""
    return c % TILE_THREADS == 0 and dv % TILE_THREADS == 0


def intra_source(c: int, dv: int, real_dtype: str) -> str:
    """Source of `intra_norm` for chunk size c and value width dv: tiled where it can be."""
    if intra_tiled(c, dv):
        return _intra_tiled_source(c, dv, real_dtype)
    return _intra_simple_source(c, dv, real_dtype)


def _intra_tiled_source(c: int, dv: int, real_dtype: str) -> str:
    return f"""
typedef {_REAL_TYPES[real_dtype]} real_t;
#define C {int(c)}
#define DV {int(dv)}
#define TI {TILE_THREADS}
#define TJ {TILE_THREADS}
#define RI (C / TI)
#define RJ (DV / TJ)
{_defines(INTRA_MACROS)}

// Block (n, h) = chunk n of head h; thread (ti, tj) owns rows TROW(ti, 0..RI-1) and columns
// TCOL(tj, 0..RJ-1).  The A tile in shared memory is already masked (zeros above the diagonal),
// so every thread runs s up to its last row.  The denominator's A·1 needs no V: row s of the
// ones column is 1 for every s <= i of a real row i.
extern "C" __global__ void __launch_bounds__({INTRA_BLOCK})
{_INTRA_SIGNATURE} {{{_INTRA_LOAD}
    const int tj = threadIdx.x % TJ, ti = threadIdx.x / TJ;
    real_t num[RI][RJ];
    real_t den[RI];
#pragma unroll
    for (int r = 0; r < RI; ++r) {{
        den[r] = (real_t)0;
#pragma unroll
        for (int q = 0; q < RJ; ++q) num[r][q] = (real_t)0;
    }}
    const int last = TROW(ti, RI - 1);
    for (int s = 0; s <= last; ++s) {{
        real_t vv[RJ];
#pragma unroll
        for (int q = 0; q < RJ; ++q) vv[q] = sv[SV(s, TCOL(tj, q))];
#pragma unroll
        for (int r = 0; r < RI; ++r) {{
            const real_t w = sa[SA(TROW(ti, r), s)];
            den[r] += w;
#pragma unroll
            for (int q = 0; q < RJ; ++q) num[r][q] += w * vv[q];
        }}
    }}
#pragma unroll
    for (int r = 0; r < RI; ++r) {{
        const int i = TROW(ti, r);
        const long long t = n * C + i;
        if (t < T) {{
            const long long row = ROW(h, n, i);
            const real_t dn = inter[X_IDX(row, DV)] + den[r] + eps;
#pragma unroll
            for (int q = 0; q < RJ; ++q) {{
                const int j = TCOL(tj, q);
                out[OUT_IDX(t, h, j)] = (inter[X_IDX(row, j)] + num[r][q]) / dn;
            }}
        }}
    }}
}}
"""


def scan_source(real_dtype: str) -> str:
    """Source of `state_scan`: S_n for every chunk n, from ΔS [H, NCH, E] and S_0 [H, E]."""
    return f"""
typedef {_REAL_TYPES[real_dtype]} real_t;
{_defines(SCAN_MACROS)}

// Thread o walks the chunks of one state entry: pre[n] = S_0 + sum_(m<n) ds[m], in float64
// registers whatever real_t is (the master state's precision); fin = S_0 + sum of all ds.
extern "C" __global__ void state_scan(const real_t* __restrict__ ds,
                                      const double* __restrict__ s0, real_t* __restrict__ pre,
                                      double* __restrict__ fin, const long long H,
                                      const long long NCH, const long long E) {{
    const long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= H * E) return;
    const long long h = SCAN_H(o), e = SCAN_E(o);
    double acc = s0[o];
#pragma unroll 8
    for (long long n = 0; n < NCH; ++n) {{
        const long long idx = SCAN_IDX(h, n, e);
        const double d = (double)ds[idx];
        pre[idx] = (real_t)acc;
        acc += d;
    }}
    fin[o] = acc;
}}
"""


def intra_shared_bytes(c: int, dv: int, itemsize: int) -> int:
    """Dynamic shared memory of one intra_norm block: the A tile and the [V | 1] tile."""
    return (c * (c + 1) + c * (dv + 1)) * itemsize
