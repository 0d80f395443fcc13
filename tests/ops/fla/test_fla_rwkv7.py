"""RWKV-7 streamed by linstream equals fla's own `RWKV7ForCausalLM`.

Tiny random models are built with fla's classes (flash-linear-attention 0.6.0, pinned) over the
options RWKV-7 configs use (fused or torch norms, a wider value_dim, the LoRA ranks given or left
to the layer's formula, with and without the first layer's pre_norm and the norms' biases, heads
from num_heads), saved with save_pretrained and loaded by linstream from the folder.  fla runs on
the CPU through its own torch references (tests/helpers/fla_oracle_rwkv7.py; both of its layer
paths, the chunked one from 64 tokens on and the recurrent one below, reach fla's
dplr_recurrence).  linstream streams the tokens over random splits (Hypothesis draws a seed; the
seed and the split points are printed) and every hidden state fla's `output_hidden_states` gives
must match.

Tolerance, as tests/ops/fla/test_fla_oracle.py derives it: the reference is fla in float64 (its
float32-only pieces as float64 clones of its own source); fla's own float32 run differs from it
by e32; linstream in a dtype of unit roundoff u must stay within 8 · e32 · u / u32 (8: another
summation order: chunks of up to 32 tokens with a triangular solve, where fla steps token by
token).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("fla", reason="flash-linear-attention is a test extra (make test installs it)")

from helpers.fla_oracle import run_fla  # noqa: E402
from helpers.fla_oracle_rwkv7 import patch_rwkv7_for_cpu  # noqa: E402
from helpers.rwkv_mamba_models import model_config, write_model_folder  # noqa: E402
from helpers.streaming import random_bounds, stream_hidden_states, worst  # noqa: E402
from linstream.ops.model.fla import ModelFolderError, load_model  # noqa: E402

T = 100  # tokens: fla's chunked path (64 tokens and more) and, in the splits, its recurrent one
SEED = 20261204
FACTOR = 8
DTYPES = {"float64": np.float64, "float32": np.float32}
#: RWKV7Config overrides over helpers.rwkv_mamba_models' tiny model (hidden 128, 2 layers,
#: head_dim 64, ranks 16/16/8/16, fuse_norm off)
VARIANTS = {
    "tiny": {},
    "fused_norm": {"fuse_norm": True},
    "wide_values_no_prenorm": {"value_dim": 256, "norm_first": False, "num_hidden_layers": 3},
    "auto_ranks_no_bias": {
        "decay_low_rank_dim": None,
        "a_low_rank_dim": None,
        "v_low_rank_dim": None,
        "gate_low_rank_dim": None,
        "norm_bias": False,
    },
    "num_heads": {"head_dim": None, "num_heads": 4, "hidden_ratio": 3.5, "intermediate_size": None},
}


def unit_roundoff(dtype) -> float:
    return float(np.finfo(dtype).eps) / 2


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """name -> (folder, token ids, fla float64 hidden states, e32), built on first use."""
    root = tmp_path_factory.mktemp("rwkv7")
    ids = np.random.default_rng(SEED).integers(0, 320, T)
    print(f"token seed={SEED}")
    cache: dict = {}

    def get(name):
        if name not in cache:
            patch_rwkv7_for_cpu()
            cfg = model_config("rwkv7", "tiny", **VARIANTS[name])
            folder = write_model_folder(root / name, "rwkv7", config=cfg, seed=3)
            ref = run_fla(folder, ids, torch.float64)
            e32 = max(
                float(np.max(np.abs(a - b)))
                for a, b in zip(run_fla(folder, ids, torch.float32), ref, strict=True)
            )
            cache[name] = (folder, ids, ref, e32)
        return cache[name]

    return get


@pytest.fixture(scope="module", autouse=True)
def _skip_fla_layer_init():
    """fla 0.6.0's RWKV7Attention cannot initialize a value_dim other than hidden_size (its
    v_lora bias init has hidden_size entries), and from_pretrained runs that init too: it is
    skipped here, as every parameter it sets is then randomized (randomize_) or loaded."""
    patch_rwkv7_for_cpu()
    from fla.layers.rwkv7 import RWKV7Attention

    orig = RWKV7Attention._initialize_weights
    RWKV7Attention._initialize_weights = lambda self, module: None
    yield
    RWKV7Attention._initialize_weights = orig


def tolerance(e32, dtype) -> float:
    return FACTOR * e32 * unit_roundoff(dtype) / unit_roundoff(np.float32)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])  # fmt: skip
@given(seed=st.integers(0, 2**32 - 1))
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("name", list(VARIANTS))
def test_streamed_hidden_states_equal_fla(zoo, name, dtype, seed):
    folder, ids, ref, e32 = zoo(name)
    rng = np.random.default_rng(seed)
    bounds = random_bounds(rng, T)
    print(f"model={name} dtype={dtype} seed={seed} bounds={bounds}")
    model = load_model(folder, compute_dtype=DTYPES[dtype])
    hs, _ = stream_hidden_states(model, ids, bounds)
    assert all(h.dtype == DTYPES[dtype] for h in hs)
    err, tol = worst(hs, ref), tolerance(e32, DTYPES[dtype])
    print(f"error {err:.3g}, tolerance {tol:.3g} (fla float32's own error {e32:.3g})")
    assert err <= tol


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_token_by_token_equals_fla(zoo, dtype):
    """The extreme split: one token per call, 20 calls (every token shift from the state)."""
    folder, ids, ref, e32 = zoo("tiny")
    model = load_model(folder, compute_dtype=DTYPES[dtype])
    n = 20
    hs, _ = stream_hidden_states(model, ids[:n], list(range(n + 1)))
    assert worst(hs, [r[:n] for r in ref]) <= tolerance(e32, DTYPES[dtype])


@pytest.mark.parametrize("name", ["tiny", "wide_values_no_prenorm"])
def test_carried_state_is_fla_cache(zoo, name):
    """After the same tokens, linstream's state holds fla's cache: the wkv state per head
    [H, K, V] (fla's recurrent_state, key-major too) and the two token shifts' last inputs
    (conv_state: attn_norm's output, ffn_state: ffn_norm's)."""
    folder, ids, _, e32 = zoo(name)
    _, cache = run_fla(folder, ids, torch.float64, splits=[40], return_cache=True)
    model = load_model(folder, compute_dtype=np.float64)
    _, states = stream_hidden_states(model, ids, [0, 17, T])
    tol = tolerance(e32, np.float64)
    assert model.state_layout()[0][0] == "S"
    for i, st_i in enumerate(states):
        layer = cache[i]
        assert sorted(st_i) == ["S", "shift_attn", "shift_ffn"]
        for ours, theirs in (
            ("S", layer["recurrent_state"][0]),
            ("shift_attn", layer["conv_state"][0]),
            ("shift_ffn", layer["ffn_state"][0]),
        ):
            want = theirs.numpy()
            scale = max(1.0, float(np.max(np.abs(want))))
            assert st_i[ours].shape == want.shape, ours
            assert float(np.max(np.abs(st_i[ours] - want))) <= tol * scale, ours


def test_bfloat16_checkpoint_and_shards_equal_fla(tmp_path):
    """Published RWKV-7 checkpoints are bfloat16, some sharded: linstream upcasts once at load,
    fla loads the same files; one file or several give the same fingerprint."""
    cfg = model_config("rwkv7", "tiny")
    one = write_model_folder(tmp_path / "one", "rwkv7", config=cfg, dtype=torch.bfloat16)
    many = write_model_folder(
        tmp_path / "many", "rwkv7", config=cfg, dtype=torch.bfloat16, max_shard_size="200KB"
    )
    assert len(list(many.glob("*.safetensors"))) > 2
    ids = np.random.default_rng(SEED + 1).integers(0, 320, 70)
    ref = run_fla(one, ids, torch.float64)
    e32 = worst(run_fla(one, ids, torch.float32), ref)
    a, b = load_model(one, compute_dtype=np.float64), load_model(many, compute_dtype=np.float64)
    assert a.load_report.disk_dtypes == ("BF16",) and b.load_report.files > 2
    assert a.fingerprint == b.fingerprint
    hs, _ = stream_hidden_states(b, ids, [0, 7, 70])
    assert worst(hs, ref) <= tolerance(e32, np.float64)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"hidden_act": "gelu"}, 'config option hidden_act = "gelu" is not supported'),
        ({"value_dim": [128, 256]}, "config option value_dim = [128, 256] is not supported"),
        ({"value_dim": 192}, "config option value_dim = 192 is not supported"),
        ({"attn": {"layers": [1], "num_heads": 2}}, "config option attn = "),
        ({"attn_mode": "parallel"}, 'config option attn_mode = "parallel" is not supported'),
        ({"head_dim": 48}, "config option head_dim = 48 is not supported"),
        ({"gate_lora_scale": 2}, "config option gate_lora_scale = 2 is not supported: not a key"),
    ],
)
def test_options_the_runtime_lacks_are_refused_by_name(zoo, tmp_path, change, expected):
    folder, *_ = zoo("tiny")
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in folder.iterdir():
        (bad / f.name).symlink_to(f)
    (bad / "config.json").unlink()
    cfg = {**json.loads((folder / "config.json").read_text()), **change}
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFolderError, match="^" + str(bad)) as e:
        load_model(bad)
    print(e.value)
    assert expected in str(e.value) and "\n" not in str(e.value)
