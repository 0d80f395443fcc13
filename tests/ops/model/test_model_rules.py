"""Update rules in the model, without torch: the config field, the fingerprint, the runtime.

The twin's side (training, agreement with the runtime, gradcheck) is in test_model_rules_twin.py.
"""

import dataclasses
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from linstream.ops import EmbeddingModel, ModelConfig, feature_maps, load_model
from linstream.ops.model.config import retnet_gammas
from linstream.ops.model.weights import fingerprint, init_weights, weight_specs, write_model
from linstream.state import ModelMismatchError, SequenceState, decode_state, encode_state

SMALL = {"vocab_size": 13, "d_model": 8, "n_layers": 2, "n_heads": 2, "d_head": 4, "d_ff": 12}
RULE_SPECS = [
    "additive",
    "decay",
    {"rule": "decay", "gamma": [0.5, 0.9], "normalize": False},
    "gated",
    {"rule": "gated", "normalize": False, "tau": 4.0},
    "delta",
    "gated_delta",
    {"rule": "gated_delta", "tau": 1.0},
]

# Recorded before update rules existed (commit 789a260): the built-in model's config JSON and
# fingerprint.  Every checkpoint written with it carries this fingerprint, so neither may move.
BUILTIN_JSON = (
    '{"activation":"gelu_tanh","d_ff":512,"d_head":32,"d_model":128,"eps":1e-06,'
    '"feature_map":{"name":"elu+1"},"input_dim":null,"input_kind":"tokens","n_heads":4,'
    '"n_layers":2,"norm_eps":1e-05,"normalization":"layernorm","vocab_size":4096}'
)
BUILTIN_FINGERPRINT = "63b75dfb86625200b7ff68cbf448ea084b56e4935a52efac8322e9b450453e20"
# ... and a FAVOR+ model whose key shift b is 0 (its fingerprint must not move either).
FAVOR_SMALL = dict(SMALL, n_layers=1, feature_map={"name": "favor+", "num_features": 16, "seed": 3})
FAVOR_SMALL_FINGERPRINT = "f22b564bf1cfaac7d88d2beff27f39e707b9de76b85e73c43cbed2debe41d1a7"


# -- config ---------------------------------------------------------------------------------------
def test_builtin_model_json_and_fingerprint_are_unchanged():
    m = load_model("builtin:default")
    assert m.config.to_json() == BUILTIN_JSON
    assert m.fingerprint == BUILTIN_FINGERPRINT
    explicit = ModelConfig(**{**m.config.to_dict(), "rules": ["additive", {"rule": "additive"}]})
    assert explicit.to_json() == BUILTIN_JSON
    assert explicit == m.config
    assert fingerprint(explicit, m.weights) == BUILTIN_FINGERPRINT


def test_favor_plus_fingerprint_with_zero_key_shift_is_unchanged():
    cfg = ModelConfig(**FAVOR_SMALL)
    assert feature_maps.get_feature_map(cfg.feature_map).key_shift(cfg.d_head) == 0.0
    assert fingerprint(cfg, init_weights(cfg, 0)) == FAVOR_SMALL_FINGERPRINT


@pytest.mark.parametrize("spec", RULE_SPECS[1:], ids=str)
def test_rule_configs_round_trip_through_json_in_canonical_form(spec):
    cfg = ModelConfig(**SMALL, rules=["additive", spec])
    back = ModelConfig.from_json(cfg.to_json())
    assert back == cfg and back.to_json() == cfg.to_json()
    rule = cfg.layer_rule(1)
    assert rule["rule"] == (spec if isinstance(spec, str) else spec["rule"])
    assert cfg.layer_rule(0) == {"rule": "additive"}
    if rule["rule"] == "decay" and isinstance(spec, str):
        assert rule["gamma"] == [1 - 2**-5, 1 - 2**-6] == retnet_gammas(2)


def test_rule_defaults_are_filled_in_so_equal_configs_fingerprint_the_same():
    short = ModelConfig(**SMALL, rules=["gated", "decay"])
    full = ModelConfig(
        **SMALL,
        rules=[
            {"rule": "gated", "normalize": True, "tau": 16},
            {"rule": "decay", "gamma": retnet_gammas(2), "normalize": True},
        ],
    )
    assert short.to_json() == full.to_json()


@pytest.mark.parametrize(
    ("rules", "exc", "words"),
    [
        ("decay", TypeError, r"rules must be None or a list with one rule per layer, got str"),
        (["decay"], ValueError, r"one rule per layer \(n_layers = 2\), got 1"),
        (["additive", "softmax"], ValueError, r"rules\[1\] \(layer 1\): unknown rule 'softmax'"),
        (["additive", 3], TypeError, r"rules\[1\] \(layer 1\) must be a rule name or a dict"),
        ([{"rule": "delta", "tau": 2}, "additive"], ValueError, r"rule 'delta' takes \[\], got"),
        (
            [{"rule": "decay", "gamma": [0.5]}, "additive"],
            ValueError,
            r"layer 0\): gamma must be a list of n_heads = 2 decays in \(0, 1\), got \[0.5\]",
        ),
        (
            [{"rule": "decay", "gamma": [0.5, 1.0]}, "additive"],
            ValueError,
            r"gamma must lie in \(0, 1\) for every head, got 1.0 for head 1",
        ),
        ([{"rule": "gated", "tau": 0}, "additive"], ValueError, r"tau must be a finite number > 0"),
        (
            [{"rule": "gated", "tau": -1}, "additive"],
            ValueError,
            r"tau must be a finite number > 0, got -1",
        ),
        (
            [{"rule": "gated_delta", "tau": "16"}, "additive"],
            TypeError,
            r"layer 0\): tau must be a finite number > 0, got '16'",
        ),
        (
            [{"rule": "gated", "normalize": 1}, "additive"],
            TypeError,
            r"normalize must be true or false, got 1",
        ),
    ],
)
def test_bad_rules_are_refused_naming_the_layer(rules, exc, words):
    with pytest.raises(exc, match=words) as info:
        ModelConfig(**SMALL, rules=rules)
    assert "\n" not in str(info.value)


def test_rule_projections_are_tensors_of_the_layer():
    cfg = ModelConfig(**SMALL, rules=["gated_delta", "decay"])
    specs = weight_specs(cfg)
    for name, shape in [("gate.weight", (2, 8)), ("gate.bias", (2,)), ("beta.weight", (2, 8))]:
        assert specs[f"layers.0.attn.{name}"].shape == shape
    assert not [n for n in specs if n.startswith("layers.1.attn.") and ("gate" in n or "beta" in n)]
    plain = ModelConfig(**SMALL)
    assert set(weight_specs(plain)) < set(specs)


# -- fingerprint ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("additive", "decay"),
        ("decay", {"rule": "decay", "gamma": [0.96875, 0.99]}),
        ("decay", {"rule": "decay", "normalize": False}),
        ("gated", {"rule": "gated", "tau": 8.0}),
        ("gated", {"rule": "gated", "normalize": False}),
        ("delta", "gated_delta"),
    ],
    ids=str,
)
def test_models_differing_only_in_a_layer_rule_have_other_fingerprints(a, b, tmp_path):
    """And so a checkpoint written under one rule is refused under the other."""
    ca, cb = (ModelConfig(**SMALL, rules=["additive", r]) for r in (a, b))
    wa = init_weights(ca, 0)
    wb = {n: wa.get(n, w) for n, w in init_weights(cb, 0).items()}  # same tensors where shared
    fa, fb = EmbeddingModel(ca, wa).fingerprint, EmbeddingModel(cb, wb).fingerprint
    assert fa != fb
    m = EmbeddingModel(ca, wa)
    _, states = m.embed_chunk(np.arange(5), None)
    st = SequenceState(
        "s", 5, 1, np.stack([s.S for s in states]), np.stack([s.z for s in states]), fa
    )
    data = encode_state(st)
    assert decode_state(data, expected_fingerprint=fa) == st
    with pytest.raises(ModelMismatchError):
        decode_state(data, expected_fingerprint=fb)


def test_favor_plus_key_shift_is_part_of_the_fingerprint(monkeypatch):
    """b = max(0, B - KEY_EXP_MAX) scales the carried state: a map with b > 0 must fingerprint
    differently when b changes; one with b = 0 is not affected."""
    big = ModelConfig(
        vocab_size=5, d_model=4, n_layers=1, n_heads=1, d_head=128, d_ff=4,
        feature_map={"name": "favor+", "num_features": 128, "seed": 0},
    )  # fmt: skip
    small = ModelConfig(**FAVOR_SMALL)
    wb, ws = init_weights(big, 0), init_weights(small, 0)
    fm = feature_maps.get_feature_map(big.feature_map)
    assert fm.key_shift(128) > 0
    before = fingerprint(big, wb), fingerprint(small, ws)
    monkeypatch.setattr(feature_maps, "KEY_EXP_MAX", feature_maps.KEY_EXP_MAX + 1.0)
    assert fm.key_shift(128) > 0
    after = fingerprint(big, wb), fingerprint(small, ws)
    assert after[0] != before[0]
    assert after[1] == before[1] == FAVOR_SMALL_FINGERPRINT


# -- the runtime ----------------------------------------------------------------------------------
def _random_rules(rng, n_layers, n_heads):
    out = []
    for _ in range(n_layers):
        spec = RULE_SPECS[int(rng.integers(len(RULE_SPECS)))]
        if isinstance(spec, dict) and "gamma" in spec:
            spec = dict(spec, gamma=[float(g) for g in rng.uniform(0.3, 0.99, n_heads)])
        out.append(spec)
    return out


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_any_split_gives_the_float64_one_pass_embeddings_for_every_rule(seed):
    rng = np.random.default_rng(seed)
    kind = str(rng.choice(["tokens", "features"]))
    fmap = str(rng.choice(["elu+1", "relu", "favor+"]))
    n_layers, n_heads = int(rng.integers(1, 4)), int(rng.integers(1, 3))
    cfg = ModelConfig(
        input_kind=kind,
        vocab_size=13 if kind == "tokens" else None,
        input_dim=3 if kind == "features" else None,
        d_model=8,
        n_layers=n_layers,
        n_heads=n_heads,
        d_head=4,
        d_ff=12,
        feature_map={"name": fmap, "num_features": 6} if fmap == "favor+" else {"name": fmap},
        eps=1e-3,
        rules=_random_rules(rng, n_layers, n_heads),
    )
    m = EmbeddingModel(cfg, init_weights(cfg, int(rng.integers(1000))), compute_dtype=np.float64)
    t = int(rng.integers(1, 160))
    x = rng.integers(0, 13, t) if kind == "tokens" else rng.standard_normal((t, 3))
    whole, whole_states = m.embed_chunk(x, None)
    k = int(rng.integers(0, min(t, 7)))
    cuts = sorted(int(c) for c in rng.choice(np.arange(1, t), size=k, replace=False)) if k else []
    bounds = [0, *cuts, t]
    states = m.initial_states()
    parts = []
    for a, b in itertools.pairwise(bounds):
        e, states = m.embed_chunk(x[a:b], states, backend=str(rng.choice(["numpy", "numba"])))
        parts.append(e)
    msg = f"seed={seed} rules={cfg.rules} bounds={bounds}"
    np.testing.assert_allclose(np.concatenate(parts), whole, rtol=1e-11, atol=1e-11, err_msg=msg)
    for s1, s2 in zip(states, whole_states, strict=True):
        np.testing.assert_allclose(s1.S, s2.S, rtol=1e-11, atol=1e-11, err_msg=msg)
        np.testing.assert_allclose(s1.z, s2.z, rtol=1e-11, atol=1e-11, err_msg=msg)


def test_rule_layers_equal_the_ops_call_with_the_projected_gates():
    """One gated_delta layer by hand: projections, gates as documented, then the ops call."""
    from linstream.ops import causal_linear_attention
    from linstream.ops.model import layers as model_layers
    from linstream.ops.model.layers import _norm

    cfg = ModelConfig(**dict(SMALL, n_layers=1), rules=[{"rule": "gated_delta", "tau": 2.0}])
    w = init_weights(cfg, 0)
    w["layers.0.attn.gate.bias"] = np.array([0.5, -1.0], np.float32)
    w["layers.0.attn.beta.bias"] = np.array([-0.3, 2.0], np.float32)
    m = EmbeddingModel(cfg, w, compute_dtype=np.float64)
    x = np.arange(9) % 13
    seen = {}

    def attend(q, k, v, s, rule):
        seen.update(rule)
        return causal_linear_attention(q, k, v, s, **rule)

    real = m._host.layers[0]
    xn = _norm(np, m._host.embed[x], real.n1, cfg.norm_eps)
    a, b = (f"layers.0.attn.{n}" for n in ("gate", "beta"))
    logit_a = xn @ w[f"{a}.weight"].T.astype(np.float64) + w[f"{a}.bias"].astype(np.float64)
    logit_b = xn @ w[f"{b}.weight"].T.astype(np.float64) + w[f"{b}.bias"].astype(np.float64)

    model_layers.forward_chunk(np, m._host, x, m.initial_states(), config=cfg, attend=attend)
    np.testing.assert_allclose(seen["log_alpha"], -np.log1p(np.exp(-logit_a)) / 2.0, rtol=1e-12)
    np.testing.assert_allclose(seen["beta"], 1 / (1 + np.exp(-logit_b)), rtol=1e-12)
    assert seen["rule"] == "gated_delta" and np.all(seen["log_alpha"] <= 0)


def test_cupy_backend_is_refused_for_a_model_with_rule_layers():
    cfg = ModelConfig(**SMALL, rules=["additive", "gated"])
    m = EmbeddingModel(cfg, init_weights(cfg, 0))
    x = np.arange(4)
    with pytest.raises(ValueError, match=r"layer 1 of this model uses rule 'gated'") as info:
        m.embed_chunk(x, None, backend="cupy")
    assert "\n" not in str(info.value) and "got 'cupy'" in str(info.value)
    with pytest.raises(ValueError, match=r"no CuPy kernel"):
        m._embed_chunk_on(None, x, None)  # type: ignore[arg-type]
    emb, _ = m.embed_chunk(x, None, backend="auto")  # "auto" stays on the host
    assert emb.shape == (4, 8)


def test_rule_model_saves_and_loads_with_the_same_outputs(tmp_path):
    cfg = ModelConfig(**SMALL, rules=["gated_delta", {"rule": "decay", "normalize": False}])
    w = init_weights(cfg, 4)
    path = tmp_path / "m.safetensors"
    write_model(path, cfg, w)
    back = load_model(path)
    assert back.config == cfg and dataclasses.asdict(back.config)["rules"] == cfg.rules
    ref = EmbeddingModel(cfg, w)
    x = np.arange(30) % 13
    np.testing.assert_array_equal(back.embed(x, chunk_size=7), ref.embed(x, chunk_size=7))
    assert back.fingerprint == ref.fingerprint


def test_the_docs_per_layer_rules_example_runs_and_equals_one_pass():
    import re
    from pathlib import Path

    doc = Path(__file__).resolve().parents[3] / "docs" / "rules.md"
    blocks = re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.S)
    block = next(b for b in blocks if "rules=[" in b and "embed_chunk" in b)
    scope: dict = {}
    exec(compile(block, str(doc), "exec"), scope)
    model, tokens = scope["model"], scope["tokens"]
    assert [model.config.layer_rule(i)["rule"] for i in range(3)] == [
        "additive",
        "decay",
        "gated_delta",
    ]
    assert scope["emb"].shape == (1000, 128) and np.isfinite(scope["emb"]).all()
    m64 = model.with_compute_dtype(np.float64)  # the same loop in float64 equals one pass
    states = None
    for s in range(0, 3000, 1000):
        emb, states = m64.embed_chunk(tokens[s : s + 1000], states)
    whole, whole_states = m64.embed_chunk(tokens, None)
    np.testing.assert_allclose(emb, whole[-1000:], rtol=1e-10, atol=1e-10)
    for a, b in zip(states, whole_states, strict=True):
        np.testing.assert_allclose(a.S, b.S, rtol=1e-10, atol=1e-10)


def test_auto_on_a_gpu_machine_says_once_that_a_rule_model_stays_on_the_cpu(monkeypatch, caplog):
    """On a machine where "auto" picks the GPU, a model with rule layers runs on the Numba CPU
    kernels, and the log says so once (not once per chunk)."""
    from linstream.ops.model import runtime as model_runtime

    real = model_runtime.resolve_backend

    def gpu_machine(name, **kw):  # what resolve_backend answers where CuPy has a device
        return "cupy" if name == "auto" else real(name, **kw)

    cfg = ModelConfig(**SMALL, rules=["additive", "gated"])
    m = EmbeddingModel(cfg, init_weights(cfg, 0))
    x = np.arange(6) % 5
    want = m.embed_chunk(x, None, backend="numba")[0]
    monkeypatch.setattr(model_runtime, "resolve_backend", gpu_machine)
    with caplog.at_level("WARNING", logger="linstream.ops.model.runtime"):
        for _ in range(3):
            emb, states = m.embed_chunk(x, None, backend="auto")
    np.testing.assert_array_equal(emb, want)
    assert all(isinstance(s.S, np.ndarray) for s in states)
    said = [r.getMessage() for r in caplog.records if r.name == "linstream.ops.model.runtime"]
    assert len(said) == 1, said
    assert "layer 1 uses rule 'gated', which has no CuPy kernel" in said[0]
    assert "runs on the CPU (backend 'numba')" in said[0]
