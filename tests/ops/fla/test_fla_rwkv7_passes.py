"""RWKV-7's fused elementwise passes (`linstream.ops.model.fla.rwkv7_passes`) against fla's own
torch references for the same steps (fla.ops.rwkv7 and fla.modules: `token_shift_ref` with
`torch_addcmul_rwkv7` for the time mix's six token shifts, `rwkv_mix_torch` for the channel
mix's, `k_update_ref`, `gate_output_correction_ref` after torch's GroupNorm,
`rwkv_relu_and_square_torch`, torch's LayerNorm and normalize, fla's l2norm formula), over
random splits of the tokens into calls (the shifts carry the previous call's last row), in
float32 and float64.  Seeds are printed.

fla's references run in float64 on the same (compute-dtype) inputs.  Tolerance (derived): an
output of an elementwise pass is formed by at most m roundings in the compute dtype (unit
roundoff u), each relative to the largest magnitude M among its terms, so |Δ| ≤ m·u·M with m
counted per pass below (a sigmoid or exp with ~1 ulp counted as 2; a norm's mean and variance
are summed in float64 and count once; a d-term sum counts d).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from helpers.streaming import random_bounds
from linstream.ops.model.fla import rwkv7_passes as passes

torch = pytest.importorskip("torch")
pytest.importorskip("fla", reason="flash-linear-attention is a test extra")

DTYPES = [np.float32, np.float64]


def u(dt) -> float:
    return float(np.finfo(dt).eps) / 2


def close(got, want, m, dt, scale):
    err = float(np.max(np.abs(np.asarray(got, np.float64) - want)))
    tol = m * u(dt) * float(scale)
    print(f"|Δ| {err:.3g}, tolerance {tol:.3g}")
    assert err <= tol


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_token_shifts_over_splits_equal_fla(dt, seed):
    """Six mixes (the time mix) and one (the channel mix): x + (x_{t−1} − x) ⊙ mix, x_{−1} the
    previous call's last row (zeros at the start).  m = 3 (a difference, a product, a sum)."""
    from fla.modules.token_shift import token_shift_ref
    from fla.ops.rwkv7.channel_mixing import rwkv_mix_torch
    from fla.ops.rwkv7.fused_addcmul import torch_addcmul_rwkv7

    rng = np.random.default_rng(seed)
    t, d = int(rng.integers(2, 90)), int(rng.integers(1, 40))
    bounds = random_bounds(rng, t, max_cuts=4, small=())
    print(f"seed={seed} T={t} D={d} bounds={bounds}")
    h = rng.standard_normal((t, d)).astype(dt)
    mix = rng.random((6, d)).astype(dt)
    last = np.zeros(d, dt)
    got = []
    for a, b in itertools.pairwise(bounds):
        got.append(passes.shift_mix(h[a:b], last, mix))
        last = h[b - 1]
    out = np.concatenate(got, axis=1)
    x = torch.from_numpy(h.astype(np.float64))[None]
    delta = token_shift_ref(x)
    mixes = [torch.from_numpy(m.astype(np.float64)) for m in mix]
    want = np.stack([y[0].numpy() for y in torch_addcmul_rwkv7(x, delta, *mixes)])
    scale = 2 * np.max(np.abs(h)) + np.max(np.abs(h)) * 2
    close(out, want, 3, dt, scale)
    ffn = rwkv_mix_torch(x, torch.zeros(1, d, dtype=torch.float64), mixes[0])[0].numpy()
    close(out[0], ffn, 3, dt, scale)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("fused", [True, False])
def test_keys_equal_fla(dt, fused):
    """(a, k, b) = (−k̂, k_update_ref(k, α, k_a), k̂ ⊙ α), k̂ = normalize(k ⊙ k_k) per head
    (fused: fla's l2norm formula, else torch's normalize).  m = d + 6 (the d-term norm, then
    a few products); M = max|k|·max(1, |k_k|)·max(1, |α|, |k_a|) and 1 for the unit vectors."""
    import torch.nn.functional as F
    from fla.ops.rwkv7.fused_k_update import k_update_ref
    from helpers.fla_oracle import _l2norm

    seed = 4
    rng = np.random.default_rng(seed)
    t, nh, d = 37, 3, 16
    print(f"seed={seed}")
    k = rng.standard_normal((t, nh * d)).astype(dt)
    alpha = rng.random((t, nh * d)).astype(dt)
    k_k, k_a = (rng.random(nh * d).astype(dt) for _ in range(2))
    a, k_new, b = passes.keys(k, alpha, k_k, k_a, d, fused)
    kt, at, kkt, kat = (torch.from_numpy(y.astype(np.float64)) for y in (k, alpha, k_k, k_a))
    kh = (kt * kkt).reshape(t, nh, d)
    kk = (_l2norm(kh) if fused else F.normalize(kh, dim=-1, p=2.0)).reshape(t, -1)
    m = d + 6
    close(a, (-kk).numpy(), m, dt, 1.0)
    close(b, (kk * at).numpy(), m, dt, 1.0)
    scale = np.max(np.abs(k)) * 2
    close(k_new, k_update_ref(kt, at, kat).numpy(), 6, dt, scale)


@pytest.mark.parametrize("dt", DTYPES)
def test_group_norm_bonus_and_gate_equal_fla(dt):
    """GroupNorm per head (eps head_dim · norm_eps) · w + b, then fla's
    gate_output_correction_ref (the r ⊙ k ⊙ r_k bonus times v, times the gate g).
    m = 2·d + 12 (the d_k-term bonus, the normalized value's few steps, the gate);
    M = the largest term: |normalized|·|w| + |b| + |bonus|·|v|, times |g|."""
    import torch.nn.functional as F
    from fla.ops.rwkv7.gate_output_correction import gate_output_correction_ref

    seed = 5
    rng = np.random.default_rng(seed)
    print(f"seed={seed}")
    t, nh, dk, dv, eps = 29, 3, 8, 16, 8e-5
    o, v, g = (rng.standard_normal((t, nh, dv)).astype(dt) for _ in range(3))
    r, k = (rng.standard_normal((t, nh, dk)).astype(dt) for _ in range(2))
    r_k = rng.standard_normal((nh, dk)).astype(dt)
    w, b = (rng.standard_normal(nh * dv).astype(dt) for _ in range(2))
    got = passes.group_norm_out_(o.copy(), r, k, v, r_k, g, w, b, eps)
    ot, rt, kt, vt, gt, rkt, wt, bt = (
        torch.from_numpy(y.astype(np.float64)) for y in (o, r, k, v, g, r_k, w, b)
    )
    normed = F.group_norm(ot.reshape(t, nh * dv), nh, wt, bt, eps)
    want = gate_output_correction_ref(
        normed[None], rt[None], kt[None], rkt, vt[None], gt.reshape(t, -1)[None]
    )[0].reshape(t, nh, dv)
    bonus = np.abs((rt * kt * rkt).sum(-1, keepdim=True).numpy())
    scale = np.max(
        (np.sqrt(dv) * np.abs(w).max() + np.abs(b).max() + bonus * np.abs(v)) * np.abs(g)
    )
    close(got, want.numpy(), 2 * dk + 12, dt, scale)


@pytest.mark.parametrize("dt", DTYPES)
def test_relu_square_and_layer_norms_equal_fla_and_torch(dt):
    """sqrelu_ = fla's rwkv_relu_and_square_torch (m = 1, M = max x²); layer_norm and
    add_layer_norm = torch's layer_norm (of x + y) with and without a bias (m = 8, M = the
    normalized value's bound √D times max|w|, plus max|b|)."""
    import torch.nn.functional as F
    from fla.ops.rwkv7.channel_mixing import rwkv_relu_and_square_torch

    seed = 6
    rng = np.random.default_rng(seed)
    print(f"seed={seed}")
    t, d, eps = 31, 24, 1e-5
    x, y = (rng.standard_normal((t, d)).astype(dt) for _ in range(2))
    w, b = (rng.standard_normal(d).astype(dt) for _ in range(2))
    xt, yt, wt, bt = (torch.from_numpy(z.astype(np.float64)) for z in (x, y, w, b))
    close(passes.sqrelu_(x.copy()), rwkv_relu_and_square_torch(xt).numpy(), 1, dt, np.max(x * x))
    scale = np.sqrt(d) * np.max(np.abs(w)) + np.max(np.abs(b))
    close(
        passes.layer_norm(x, w, b, eps), F.layer_norm(xt, (d,), wt, bt, eps).numpy(), 8, dt, scale
    )
    close(
        passes.layer_norm(x, w, None, eps),
        F.layer_norm(xt, (d,), wt, None, eps).numpy(),
        8,
        dt,
        scale,
    )
    s, n = passes.add_layer_norm(x, y, w, b, eps)
    close(s, (xt + yt).numpy(), 1, dt, np.max(np.abs(x)) + np.max(np.abs(y)))
    close(n, F.layer_norm(xt + yt, (d,), wt, bt, eps).numpy(), 8, dt, scale)
