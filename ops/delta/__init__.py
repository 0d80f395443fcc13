"""The delta rules: `delta` (S ← S + β k(v − Sᵀk)ᵀ) and `gated_delta` (S ← α(I − β kkᵀ)S + β kvᵀ),
with L2-normalized keys.

    naive    float64 references, token by token (`delta_recurrent`, `gated_delta_recurrent`)
    numba    the chunkwise CPU kernel both rules share (WY form, `delta_chunks`)
"""
