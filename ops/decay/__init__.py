"""The decaying rules: `decay` (S ← γS + φ(k)vᵀ, a fixed γ per head) and `gated` (γ replaced by a
data-dependent α_t per token and head, given in log space).

    naive    float64 references, token by token (`decay_recurrent`, `gated_recurrent`)
    numba    the chunkwise CPU kernel both rules share (`decay_chunks`)
"""
