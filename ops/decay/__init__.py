"""The decaying rules: `decay` (S ← γS + φ(k)vᵀ, a fixed γ per head), `gated` (γ replaced by a
data-dependent α_t per token and head, given in log space), and the vector gate (one α per key
dimension, token and head: Gated Linear Attention, HGRN2).

    naive          float64 references, token by token (`decay_recurrent`, `gated_recurrent`)
    numba          the chunkwise CPU kernel both rules share (`decay_chunks`)
    vector_naive   float64 reference of the vector gate (`vector_gated_recurrent`)
    vector_numba   its chunkwise CPU kernel (`vector_gated_chunks`)
"""
