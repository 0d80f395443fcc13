"""fla's pretrained-model families streamed by linstream equal fla's own forward.

Each family's tiny random model is built with fla's own classes (flash-linear-attention 0.6.0,
pinned), saved with save_pretrained to a temporary folder, and loaded by linstream from that
folder.  fla runs on the CPU with its Triton kernels replaced by its own naive references
(tests/helpers/fla_oracle.py).  linstream streams the same tokens chunk by chunk over a random
split (Hypothesis draws a seed; the seed and the split points are printed and rebuild the case)
and every hidden state fla's `output_hidden_states` gives (the embeddings, each block's output,
the final norm) must match.

Tolerance, derived from the dtype: the reference is fla in float64 (its float32-only pieces run
as float64 clones of its own source, so it is the model's math in float64 throughout).  fla's
own float32 run differs from it by e32 (measured once per model: the rounding of fla's code at
float32's unit roundoff u32).  linstream computing in a dtype with unit roundoff u must stay
within 8 · e32 · u / u32: the same rounding, at that dtype's unit roundoff, with a factor of 8
(3 bits) for a different summation order (chunks of 32 and 64 tokens, a triangular inverse in
the delta rules, where fla's reference steps token by token).  For float64 that is about 1e-14
on hidden states of magnitude 5.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("fla", reason="flash-linear-attention is a test extra (make test installs it)")

from helpers.fla_oracle import build_and_save, run_fla, tiny_configs  # noqa: E402
from helpers.streaming import random_bounds, stream_hidden_states, worst  # noqa: E402
from linstream.ops.model.fla import load_model  # noqa: E402

T = 100  # tokens: across the kernels' 32- and 64-token chunks
SEED = 20261201
MODELS = list(tiny_configs())
DTYPES = {"float64": np.float64, "float32": np.float32}
FACTOR = 8  # see the module docstring


def unit_roundoff(dtype) -> float:
    return float(np.finfo(dtype).eps) / 2


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """name -> (folder, token ids, fla float64 hidden states, e32), built on first use."""
    root = tmp_path_factory.mktemp("fla_models")
    ids = np.random.default_rng(SEED).integers(0, 128, T)
    print(f"token seed={SEED}")
    cache: dict = {}

    def get(name):
        if name not in cache:
            folder = build_and_save(name, tiny_configs()[name], root)
            ref = run_fla(folder, ids, torch.float64)
            r32 = run_fla(folder, ids, torch.float32)
            e32 = max(float(np.max(np.abs(a - b))) for a, b in zip(r32, ref, strict=True))
            cache[name] = (folder, ids, ref, e32)
        return cache[name]

    return get


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])  # fmt: skip
@given(seed=st.integers(0, 2**32 - 1))
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("name", MODELS)
def test_streamed_hidden_states_equal_fla(zoo, name, dtype, seed):
    folder, ids, ref, e32 = zoo(name)
    rng = np.random.default_rng(seed)
    bounds = random_bounds(rng, T)
    print(f"model={name} dtype={dtype} seed={seed} bounds={bounds}")
    model = load_model(folder, compute_dtype=DTYPES[dtype])
    hs, _ = stream_hidden_states(model, ids, bounds)
    assert all(h.dtype == DTYPES[dtype] for h in hs)
    tol = FACTOR * e32 * unit_roundoff(DTYPES[dtype]) / unit_roundoff(np.float32)
    err = worst(hs, ref)
    print(f"error {err:.3g}, tolerance {tol:.3g} (fla float32's own error {e32:.3g})")
    assert err <= tol


@pytest.mark.parametrize("name", MODELS)
def test_token_by_token_equals_one_pass(zoo, name):
    """The extreme split: one token per call (every conv tail shorter than its width)."""
    folder, ids, ref, e32 = zoo(name)
    model = load_model(folder, compute_dtype=np.float64)
    n = 12
    hs, _ = stream_hidden_states(model, ids[:n], list(range(n + 1)))
    tol = FACTOR * e32 * unit_roundoff(np.float64) / unit_roundoff(np.float32)
    assert worst(hs, [r[:n] for r in ref]) <= tol


@pytest.mark.parametrize("name", MODELS)
def test_carried_state_is_fla_cache(zoo, name):
    """After the same tokens, linstream's state holds fla's cache: the recurrent state (fla keeps
    GLA, HGRN2 and Gated DeltaNet value-major, [H, V, K]) and the last W−1 raw inputs of each
    short convolution (fla keeps W, the oldest first)."""
    folder, ids, _, e32 = zoo(name)
    _, cache = run_fla(folder, ids, torch.float64, splits=[40], return_cache=True)
    model = load_model(folder, compute_dtype=np.float64)
    _, states = stream_hidden_states(model, ids, [0, 17, T])
    family = model.config.common.family
    for i, st_i in enumerate(states):
        layer = cache[i]
        ref_s = layer["recurrent_state"][0].numpy()
        if family in ("gla", "hgrn2", "gated_deltanet"):
            ref_s = ref_s.transpose(0, 2, 1)
        scale = max(1.0, float(np.max(np.abs(ref_s))))
        tol = FACTOR * e32 * unit_roundoff(np.float64) / unit_roundoff(np.float32) * scale
        assert float(np.max(np.abs(st_i["S"] - ref_s))) <= tol
        convs = [k for k in st_i if k.startswith("conv_")]  # in fla's order: q, k, v / q, f, i
        assert len(convs) == (3 if layer["conv_state"] is not None else 0)
        for k, ref_c in zip(convs, layer["conv_state"] or (), strict=True):
            c = ref_c[0].numpy()[:, 1:].T  # [D, W] -> the last W−1 inputs [W−1, D]
            c_tol = tol / scale * max(1.0, float(np.max(np.abs(c))))
            assert float(np.max(np.abs(st_i[k] - c))) <= c_tol
        if family == "retnet":
            assert int(st_i["position"][0]) == T


@pytest.mark.parametrize("name", ["gla", "gated_deltanet", "hgrn2"])
def test_bfloat16_checkpoint_equals_fla_on_the_same_weights(tmp_path, name):
    """Published checkpoints are bfloat16: linstream upcasts once at load, fla loads the same
    file (from_pretrained upcasts to float32), both must agree as for float32 files."""
    folder = build_and_save(name, tiny_configs()[name], tmp_path, dtype=torch.bfloat16)
    ids = np.random.default_rng(SEED + 1).integers(0, 128, 60)
    ref = run_fla(folder, ids, torch.float64)
    e32 = worst(run_fla(folder, ids, torch.float32), ref)
    model = load_model(folder, compute_dtype=np.float64)
    assert model.load_report.disk_dtypes == ("BF16",)
    hs, _ = stream_hidden_states(model, ids, [0, 7, 60])
    assert worst(hs, ref) <= FACTOR * e32 * unit_roundoff(np.float64) / unit_roundoff(np.float32)


def test_sharded_folder_is_the_same_model(tmp_path):
    """save_pretrained with a small max_shard_size writes model.safetensors.index.json and
    several files: the same fingerprint and the same outputs as the single-file folder."""
    cfg = tiny_configs()["delta_net"]
    one = build_and_save("one", cfg, tmp_path)
    many = build_and_save("many", cfg, tmp_path, max_shard_size="40KB")
    assert (many / "model.safetensors.index.json").is_file()
    assert len(list(many.glob("*.safetensors"))) > 2
    a, b = load_model(one), load_model(many)
    assert a.load_report.files == 1 and b.load_report.files > 2
    assert a.fingerprint == b.fingerprint
    ids = np.arange(30) % 128
    np.testing.assert_array_equal(a.embed(ids, chunk_size=7), b.embed(ids, chunk_size=7))
