"""The PyTorch twin with update rules: chunkwise forms vs token-by-token recurrences, runtime vs
twin per rule, gradcheck, training, save and load.

Tolerances are those of test_model_torch.py (documented there): float64 runtime vs float64 twin
|Δ| <= 1e-9; float32 runtime vs float64 twin per-token ‖Δ‖/‖e‖ <= 2e-5 for elu+1, 2e-4 for relu
and favor+, and where an input exceeds that, what its conditioning allows.  The chunkwise torch
forms are checked against recurrences written as the formulas read (float64, 1e-12).
"""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from linstream.ops import ModelConfig, load_model  # noqa: E402
from linstream.ops.model.runtime import EmbeddingModel  # noqa: E402
from linstream.ops.model.twin import TorchEmbeddingModel  # noqa: E402
from linstream.ops.model.twin_rules import (  # noqa: E402
    decaying_attention,
    delta_attention,
    unit_keys,
)

from .test_model_torch import (  # noqa: E402
    normalization_condition,
    projection_conditioning_bound,
    random_bounds,
    random_config,
    random_inputs,
    random_weights,
    run_split,
    token_errors,
    twin_of,
)

RULES = [
    "decay",
    {"rule": "decay", "normalize": False},
    "gated",
    {"rule": "gated", "normalize": False},
    "delta",
    "gated_delta",
]
IDS = ["decay", "decay-unnormalized", "gated", "gated-unnormalized", "delta", "gated_delta"]


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def rule_name(spec):
    return spec if isinstance(spec, str) else spec["rule"]


# -- chunkwise forms vs token-by-token recurrences ---------------------------------------------
def decaying_recurrence(q, k, v, log_g, s, z, eps, normalize):
    """S_t = α_t S_{t-1} + k_t v_tᵀ, z_t = α_t z_{t-1} + k_t; y_t = q_tᵀS_t / (q_tᵀz_t + eps)."""
    ys = []
    for t in range(q.shape[2]):
        a = torch.exp(log_g[:, :, t])
        s = a[..., None, None] * s + k[:, :, t, :, None] * v[:, :, t, None, :]
        z = a[..., None] * z + k[:, :, t]
        num = (q[:, :, t, :, None] * s).sum(-2)
        den = (q[:, :, t] * z).sum(-1, keepdim=True)
        ys.append(num / (den + eps) if normalize else num)
    return torch.stack(ys, dim=2), s, z


def delta_recurrence(q, k, v, log_g, beta, s):
    """S_t = α_t (I - β_t k_t k_tᵀ) S_{t-1} + β_t k_t v_tᵀ; y_t = S_tᵀ q_t."""
    f = q.shape[-1]
    eye = torch.eye(f, dtype=q.dtype)
    ys = []
    for t in range(q.shape[2]):
        kt, bt = k[:, :, t], beta[:, :, t, None, None]
        a = torch.exp(log_g[:, :, t])[..., None, None]
        s = a * (eye - bt * kt[..., :, None] * kt[..., None, :]) @ s + bt * (
            kt[..., :, None] * v[:, :, t, None, :]
        )
        ys.append((s * q[:, :, t, :, None]).sum(-2))
    return torch.stack(ys, dim=2), s


def _rule_inputs(rng, b, h, t, f, dv, gated):
    g = torch.Generator().manual_seed(int(rng.integers(2**31)))
    q = torch.rand(b, h, t, f, generator=g, dtype=torch.float64) + 0.05
    k = torch.rand(b, h, t, f, generator=g, dtype=torch.float64) + 0.05
    v = torch.randn(b, h, t, dv, generator=g, dtype=torch.float64)
    log_g = -torch.rand(b, h, t, generator=g, dtype=torch.float64) * (2.0 if gated else 0.0)
    beta = torch.rand(b, h, t, generator=g, dtype=torch.float64) * 0.9 + 0.1
    s0 = torch.randn(b, h, f, dv, generator=g, dtype=torch.float64)
    z0 = torch.rand(b, h, f, generator=g, dtype=torch.float64)
    return q, k, v, log_g, beta, s0, z0


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), family=st.sampled_from(["decaying", "delta"]))
def test_chunkwise_forms_equal_token_by_token_recurrences(seed, family):
    rng = np.random.default_rng(seed)
    b, h, t, f, dv = 2, int(rng.integers(1, 3)), int(rng.integers(1, 40)), 4, 3
    gated = bool(rng.integers(2))
    q, k, v, log_g, beta, s0, z0 = _rule_inputs(rng, b, h, t, f, dv, gated)
    chunk = int(rng.integers(1, 20))
    if family == "decaying":
        normalize = bool(rng.integers(2))
        y, (s, z) = decaying_attention(
            q, k, v, log_g, (s0, z0), eps=1e-3, normalize=normalize, log_f=None, chunk=chunk
        )
        y_ref, s_ref, z_ref = decaying_recurrence(q, k, v, log_g, s0, z0, 1e-3, normalize)
        torch.testing.assert_close(z, z_ref, rtol=1e-12, atol=1e-12, msg=f"seed={seed}")
    else:
        k = unit_keys(k)
        y, s = delta_attention(q, k, v, log_g, beta, s0, chunk=chunk)
        y_ref, s_ref = delta_recurrence(q, k, v, log_g, beta, s0)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12, msg=f"seed={seed} C={chunk}")
    torch.testing.assert_close(s, s_ref, rtol=1e-12, atol=1e-12, msg=f"seed={seed} C={chunk}")


def test_unit_keys_keep_a_zero_key_zero_with_finite_gradients():
    k = torch.tensor([[3.0, 4.0], [0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    u = unit_keys(k)
    torch.testing.assert_close(u.detach(), torch.tensor([[0.6, 0.8], [0.0, 0.0]], dtype=u.dtype))
    u.sum().backward()
    assert torch.isfinite(k.grad).all()


@pytest.mark.parametrize("family", ["decay", "gated", "delta", "gated_delta"])
def test_gradcheck_of_the_chunkwise_forms(family):
    rng = np.random.default_rng(5)
    gated = family in ("gated", "gated_delta")
    q, k, v, log_g, beta, s0, z0 = _rule_inputs(rng, 1, 2, 5, 3, 2, gated=True)
    if family in ("decay", "gated"):

        def fn(q, k, v, log_g, s0, z0):
            g = log_g if gated else log_g.detach() * 0 - 0.3
            y, (s, z) = decaying_attention(
                q, k, v, g, (s0, z0), eps=1e-3, normalize=True, log_f=None, chunk=2
            )
            return y, s, z

        args = (q, k, v, log_g, s0, z0)
    else:

        def fn(q, k, v, log_g, beta, s0):
            g = log_g if gated else torch.zeros_like(log_g)
            return delta_attention(q, unit_keys(k), v, g, beta, s0, chunk=2)

        args = (q, k, v, log_g, beta, s0)
    inputs = tuple(a.clone().requires_grad_(True) for a in args)
    assert torch.autograd.gradcheck(fn, inputs)


@pytest.mark.parametrize("spec", RULES, ids=IDS)
def test_gradcheck_through_the_model_with_rule_layers(spec):
    """Gradients wrt the inputs and the gate and β weights, in float64 on a tiny model."""
    cfg = ModelConfig(
        input_kind="features", vocab_size=None, input_dim=3, d_model=4, n_layers=1,
        n_heads=2, d_head=2, d_ff=4, eps=1e-3, rules=[spec],
    )  # fmt: skip
    model = TorchEmbeddingModel(cfg, seed=0).double()
    x = torch.randn(1, 5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    names = [n for n, _ in model.named_parameters() if "gate" in n or "beta" in n] + [
        "layers.0.attn.k.weight"
    ]
    params = dict(model.named_parameters())

    def fn(x, *ws):
        over = dict(zip(names, ws, strict=True))
        return torch.func.functional_call(model, {**params, **over}, (x,), {"chunk_size": 2})

    inputs = (x.requires_grad_(True), *(params[n].detach().clone().requires_grad_() for n in names))
    assert torch.autograd.gradcheck(fn, inputs)


# -- runtime vs twin ------------------------------------------------------------------------------
@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), which=st.integers(0, len(RULES) - 1))
def test_runtime_over_random_splits_equals_twin_for_every_rule(seed, which):
    rng = np.random.default_rng(seed)
    base = random_config(rng)
    rules = [RULES[which] if rng.integers(3) else "additive" for _ in range(base.n_layers)]
    rules[int(rng.integers(base.n_layers))] = RULES[which]
    config = ModelConfig(**{**base.to_dict(), "rules": rules})
    weights = random_weights(config, rng)
    t = int(rng.integers(1, 150))
    x = random_inputs(config, rng, t)
    with torch.no_grad():
        ref = twin_of(config, weights)(torch.from_numpy(x)).numpy()
    bounds = random_bounds(rng, t)
    msg = f"seed={seed} {config} {bounds}"

    rt64 = EmbeddingModel(config, weights, compute_dtype=np.float64)
    out64, _ = run_split(rt64, x, bounds)
    np.testing.assert_allclose(out64, ref, rtol=1e-9, atol=1e-9, err_msg=msg)

    out32, _ = run_split(rt64.with_compute_dtype(np.float32), x, bounds)
    assert out32.dtype == np.float32
    tol = 2e-5 if config.feature_map["name"] == "elu+1" else 2e-4
    errors = token_errors(out32, ref)
    if errors.max() > tol:  # an ill-conditioned input: what its conditioning allows
        kappa = normalization_condition(rt64, x)
        bound = tol * kappa + projection_conditioning_bound(rt64, x, ref)
        worst = int(np.argmax(errors / bound))
        assert (errors <= bound).all(), (msg, worst, errors[worst], bound[worst])


@pytest.mark.parametrize("spec", RULES, ids=IDS)
def test_twin_states_chunk_by_chunk_equal_runtime_states(spec):
    rng = np.random.default_rng(11)
    config = ModelConfig(
        vocab_size=17, d_model=8, n_layers=2, n_heads=2, d_head=4, d_ff=12, rules=[spec, spec]
    )
    weights = random_weights(config, rng)
    x = rng.integers(0, 17, 90)
    bounds = [0, 1, 40, 41, 90]
    rt = EmbeddingModel(config, weights, compute_dtype=np.float64)
    out_rt, states_rt = run_split(rt, x, bounds)
    tw = twin_of(config, weights)
    states, parts = None, []
    with torch.no_grad():
        for (a, b), chunk in zip(itertools.pairwise(bounds), (3, 64, 5, 7), strict=True):
            e, states = tw(torch.from_numpy(x[a:b]), states, return_states=True, chunk_size=chunk)
            parts.append(e.numpy())
    np.testing.assert_allclose(np.concatenate(parts), out_rt, rtol=1e-9, atol=1e-9)
    for (s, z), ref in zip(states, states_rt, strict=True):
        np.testing.assert_allclose(s[0].numpy(), ref.S, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(z[0].numpy(), ref.z, rtol=1e-9, atol=1e-9)


# -- training, save and load ----------------------------------------------------------------------
@pytest.mark.parametrize("spec", RULES, ids=IDS)
def test_twin_trains_every_rule(spec):
    config = ModelConfig(
        vocab_size=20, d_model=16, n_layers=2, n_heads=2, d_head=8, d_ff=32, rules=[spec, spec]
    )
    torch.manual_seed(0)
    model = TorchEmbeddingModel(config, seed=0)
    head = torch.nn.Linear(16, 20)
    opt = torch.optim.Adam([*model.parameters(), *head.parameters()], lr=1e-2)
    data = torch.from_numpy(np.tile(np.arange(20), (4, 3)) % 20)  # a pattern it can learn
    losses = []
    for _ in range(30):
        emb = model(data[:, :-1], chunk_size=16)
        loss = torch.nn.functional.cross_entropy(head(emb).flatten(0, 1), data[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    print(spec, [round(v, 3) for v in losses[::5]])
    assert losses[-1] < 0.5 * losses[0]
    named = dict(model.named_parameters())
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in named.values())
    rule = rule_name(spec)
    assert ("layers.0.attn.gate.weight" in named) == (rule in ("gated", "gated_delta"))
    assert ("layers.0.attn.beta.weight" in named) == (rule in ("delta", "gated_delta"))


@pytest.mark.parametrize("spec", RULES, ids=IDS)
def test_twin_save_load_gives_the_runtime_the_same_outputs(tmp_path, spec):
    config = ModelConfig(
        input_kind="features", vocab_size=None, input_dim=4, d_model=8, n_layers=2, n_heads=2,
        d_head=4, d_ff=8, feature_map={"name": "favor+", "num_features": 6, "seed": 2},
        rules=["additive", spec],
    )  # fmt: skip
    model = TorchEmbeddingModel(config, seed=1)
    path = tmp_path / "twin.safetensors"
    model.save(path)
    back = TorchEmbeddingModel.load(path)
    assert back.config == config
    rt = load_model(path)
    assert rt.config.layer_rule(1)["rule"] == rule_name(spec)
    x = np.random.default_rng(3).standard_normal((70, 4)).astype(np.float32)
    with torch.no_grad():
        ref = back.double()(torch.from_numpy(x)).numpy()
        ref_saved = model.double()(torch.from_numpy(x)).numpy()
    np.testing.assert_array_equal(ref, ref_saved)
    out = rt.with_compute_dtype(np.float64).embed(x, chunk_size=25)
    np.testing.assert_allclose(out, ref, rtol=1e-9, atol=1e-9)
