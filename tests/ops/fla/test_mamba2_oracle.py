"""Mamba-2 streamed by linstream equals transformers' own `Mamba2ForCausalLM`.

Tiny random models are built with transformers 5.24's own class on the CPU, saved with
save_pretrained (tests/helpers/rwkv_mamba_models.py), and loaded by linstream from the folder.
transformers runs its pure-PyTorch path (no mamba_ssm here) on the whole sequence: its
continuation through its cache does not reproduce whole-sequence outputs on the CPU, so
linstream's streamed splits are compared with one whole-sequence forward.  linstream streams
the tokens over a random split (Hypothesis draws a seed; the seed and the split print) and every
hidden state must match: the embeddings, each block's output, the final norm
(tests/helpers/mamba2_oracle.py maps transformers' numbering onto linstream's).

Tolerance, derived from the dtype as in test_fla_oracle.py: the reference is transformers in
float64 (its float32-only pieces run as float64 clones of its own source, so it is the model's
math in float64 throughout); its float32 run differs from that by e32 (measured per model);
linstream in a dtype of unit roundoff u must stay within 8 · e32 · u / u32 (8: another
summation order: the SSD's chunks of 64 tokens carried across calls, where transformers runs
its chunk_size in one call).

The configurations cover the options checkpoints use: one group and several, head_dim 8–32,
d_state 16/64/128, chunk_size 16–256, a clamped time-step limit, convolutions with and without
bias and of width 3 and 4, in/out-projection biases, residual_in_fp32 either way.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", reason="transformers is a test extra (make test installs it)")

from helpers.mamba2_oracle import mamba2_cache, run_mamba2  # noqa: E402
from helpers.rwkv_mamba_models import model_config, write_model_folder  # noqa: E402
from helpers.streaming import random_bounds, stream_hidden_states, worst  # noqa: E402
from linstream.ops.model.fla import load_model  # noqa: E402

T = 100  # tokens: across the SSD kernel's 64-token chunks and the models' chunk_size
SEED = 20261204
DTYPES = {"float64": np.float64, "float32": np.float32}
FACTOR = 8  # see the module docstring

#: overrides of helpers.rwkv_mamba_models' "tiny" Mamba-2 (hidden 64, expand 2: I = 128)
CONFIGS = {
    # heads 8 × 16, d_state 16, one group, chunk_size 32, conv bias, limit (0, inf)
    "tiny": {},
    # 4 groups of 4 heads × 8, d_state 64, a clamped time step, eps 1e-6, chunk_size 16
    "groups": dict(num_heads=16, head_dim=8, state_size=64, n_groups=4, chunk_size=16,
                   time_step_limit=(0.05, 0.4), layer_norm_epsilon=1e-6),
    # 4 heads × 32, d_state 128, 2 groups, chunk_size 256, no conv bias, projection biases,
    # a conv of width 3, the residual kept in the model's dtype
    "wide": dict(num_heads=4, head_dim=32, state_size=128, n_groups=2, chunk_size=256,
                 use_conv_bias=False, use_bias=True, conv_kernel=3, residual_in_fp32=False),
}  # fmt: skip


def unit_roundoff(dtype) -> float:
    return float(np.finfo(dtype).eps) / 2


def tolerance(e32: float, dtype) -> float:
    return FACTOR * e32 * unit_roundoff(dtype) / unit_roundoff(np.float32)


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """name -> (folder, token ids, transformers float64 hidden states, e32), built on first use."""
    root = tmp_path_factory.mktemp("mamba2_models")
    ids = np.random.default_rng(SEED).integers(0, 50000, T)
    print(f"token seed={SEED}")
    cache: dict = {}

    def get(name):
        if name not in cache:
            cfg = model_config("mamba2", "tiny", **CONFIGS[name])
            folder = write_model_folder(root / name, "mamba2", config=cfg, seed=1)
            ref = run_mamba2(folder, ids, torch.float64)
            r32 = run_mamba2(folder, ids, torch.float32)
            e32 = max(float(np.max(np.abs(a - b))) for a, b in zip(r32, ref, strict=True))
            cache[name] = (folder, ids, ref, e32)
        return cache[name]

    return get


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])  # fmt: skip
@given(seed=st.integers(0, 2**32 - 1))
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("name", list(CONFIGS))
def test_streamed_hidden_states_equal_transformers(zoo, name, dtype, seed):
    folder, ids, ref, e32 = zoo(name)
    rng = np.random.default_rng(seed)
    bounds = random_bounds(rng, T, small=(1, 2))
    print(f"model={name} dtype={dtype} seed={seed} bounds={bounds}")
    model = load_model(folder, compute_dtype=DTYPES[dtype])
    hs, _ = stream_hidden_states(model, ids, bounds)
    assert all(h.dtype == DTYPES[dtype] for h in hs)
    tol = tolerance(e32, DTYPES[dtype])
    err = worst(hs, ref)
    print(f"error {err:.3g}, tolerance {tol:.3g} (transformers float32's own error {e32:.3g})")
    assert err <= tol


@pytest.mark.parametrize("name", list(CONFIGS))
def test_token_by_token_equals_one_pass(zoo, name):
    """The extreme split: one token per call (every call shorter than the conv's tail)."""
    folder, ids, ref, e32 = zoo(name)
    model = load_model(folder, compute_dtype=np.float64)
    n = 12
    hs, _ = stream_hidden_states(model, ids[:n], list(range(n + 1)))
    assert worst(hs, [r[:n] for r in ref]) <= tolerance(e32, np.float64)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_carried_state_is_transformers_cache(zoo, name):
    """After the same tokens, linstream's state holds transformers' cache: `S` its SSM state
    [H, head_dim, d_state], `conv_xbc` the last W−1 of the W raw inputs its convolution state
    keeps ([conv_dim, W], oldest first)."""
    folder, ids, _, e32 = zoo(name)
    cache = mamba2_cache(folder, ids, torch.float64)
    model = load_model(folder, compute_dtype=np.float64)
    _, states = stream_hidden_states(model, ids, [0, 17, 18, T])
    assert [n for n, _ in model.state_layout()] == ["S", "conv_xbc"]
    for st_i, (ssm, conv) in zip(states, cache, strict=True):
        scale = max(1.0, float(np.max(np.abs(ssm))))
        assert st_i["S"].shape == ssm.shape
        assert float(np.max(np.abs(st_i["S"] - ssm))) <= tolerance(e32, np.float64) * scale
        tail = conv[:, 1:].T
        assert st_i["conv_xbc"].shape == tail.shape
        c_tol = tolerance(e32, np.float64) * max(1.0, float(np.max(np.abs(tail))))
        assert float(np.max(np.abs(st_i["conv_xbc"] - tail))) <= c_tol


def test_bfloat16_checkpoint_equals_transformers_on_the_same_weights(tmp_path):
    """A checkpoint saved in bfloat16: linstream upcasts once at load, transformers loads the
    same file (as float32, then float64): both agree as for float32 files."""
    cfg = model_config("mamba2", "tiny", **CONFIGS["groups"])
    folder = write_model_folder(tmp_path / "bf16", "mamba2", config=cfg, dtype=torch.bfloat16)
    ids = np.random.default_rng(SEED + 1).integers(0, 50000, 60)
    ref = run_mamba2(folder, ids, torch.float64)
    e32 = worst(run_mamba2(folder, ids, torch.float32), ref)
    model = load_model(folder, compute_dtype=np.float64)
    assert model.load_report.disk_dtypes == ("BF16",)
    hs, _ = stream_hidden_states(model, ids, [0, 7, 60])
    assert worst(hs, ref) <= tolerance(e32, np.float64)


def test_sharded_folder_is_the_same_model(tmp_path):
    """save_pretrained with a small max_shard_size writes model.safetensors.index.json and
    several files: the same fingerprint and the same outputs as the single-file folder."""
    cfg = model_config("mamba2", "tiny", tie_word_embeddings=False)
    one = write_model_folder(tmp_path / "one", "mamba2", config=cfg)
    many = write_model_folder(tmp_path / "many", "mamba2", config=cfg, max_shard_size="100KB")
    assert (many / "model.safetensors.index.json").is_file()
    assert len(list(many.glob("*.safetensors"))) > 2
    a, b = load_model(one), load_model(many)
    assert a.load_report.files == 1 and b.load_report.files > 2
    assert a.fingerprint == b.fingerprint
    ids = np.arange(30) * 997 % 50000
    np.testing.assert_array_equal(a.embed(ids, chunk_size=7), b.embed(ids, chunk_size=7))
