"""The additive rule, S ← S + φ(k)vᵀ, z ← z + φ(k): one module per way of computing it.

    naive          float64 NumPy references (the O(T²) masked form and the recurrence): oracles
    naive_numba    a fast float64 recurrence in Numba, the oracle for very long sequences
    chunk          the chunkwise form written against an array namespace (the "numpy" backend)
    numba          the CPU kernel (the "numba" backend)
    cupy           the GPU kernels (the "cupy" backend), with their CUDA sources in cupy_kernels

Every variant takes and returns an `AttentionState`; `linstream.ops.causal_linear_attention`
picks one by its `backend`.
"""
