"""Mamba-2's SSD rule (state space duality): a scalar decay per head and token, e^{dt_t·A},
input-dependent B and C shared by the heads of a group, and a skip D.

    steps    the time steps dt: softplus(dt + dt_bias), clamped to the time-step limit
    naive    float64 reference, token by token (`ssd_recurrent`)
    numba    the chunkwise CPU kernel (`ssd_chunks`)
    cupy     the same kernel on a CUDA device (`ssd_chunks`, source in cupy_kernels)
"""
