"""The generalized delta rule in fla's diagonal-plus-low-rank (DPLR) form, RWKV-7's time mix:

    S_t = diag(exp(w_t)) S_{t-1} + b_t (a_tᵀ S_{t-1}) + k_t v_tᵀ        o_t = S_tᵀ q_t

(a log decay w_t ≤ 0 per key dimension, a rank-1 update with separate vectors a_t, b_t; the
state S [H, d_k, d_v] key-major, as fla's `dplr_recurrence` keeps it).

    naive    the float64 reference, token by token (`dplr_recurrent`)
    numba    the chunkwise CPU kernel (WY / UT-transform form, `dplr_chunks`)
    cupy     the same kernel on a CUDA device (`dplr_chunks`, source in cupy_kernels)
"""
