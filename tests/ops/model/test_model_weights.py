"""Model files: round trip, refusals that name the tensor, and the fingerprint."""

import json
import re

import numpy as np
import pytest
from linstream.ops import load_model
from linstream.ops.model.config import ModelConfig
from linstream.ops.model.weights import (
    ModelFileError,
    fingerprint,
    init_weights,
    read_model,
    weight_specs,
    write_model,
    write_model_bytes,
)
from safetensors.numpy import save

SMALL = ModelConfig(vocab_size=11, d_model=8, n_layers=2, n_heads=2, d_head=4, d_ff=12)
FAVOR = ModelConfig(
    input_kind="features",
    vocab_size=None,
    input_dim=3,
    d_model=8,
    n_layers=1,
    n_heads=2,
    d_head=4,
    d_ff=12,
    normalization="rmsnorm",
    feature_map={"name": "favor+", "num_features": 6, "seed": 1},
)


def _raw_file(config, tensors, metadata=None):
    """Bytes of a safetensors file written without our checks (to make broken files)."""
    meta = metadata or {"format": "linstream-model", "format_version": "1"}
    meta.setdefault("config", config.to_json())
    return save(tensors, metadata=meta)


@pytest.mark.parametrize("config", [SMALL, FAVOR], ids=["tokens", "features-favor+"])
def test_write_read_round_trip(tmp_path, config):
    w = init_weights(config, seed=5)
    path = tmp_path / "m.safetensors"
    write_model(path, config, w)
    cfg2, w2 = read_model(path)
    assert cfg2 == config
    assert sorted(w2) == sorted(w)
    for k in w:
        assert w2[k].dtype == w[k].dtype
        np.testing.assert_array_equal(w2[k], w[k])
    assert fingerprint(cfg2, w2) == fingerprint(config, w)
    assert load_model(path).fingerprint == fingerprint(config, w)
    assert load_model(write_model_bytes(config, w)).fingerprint == fingerprint(config, w)


def test_favor_matrix_is_stored_in_the_file():
    specs = weight_specs(FAVOR)
    assert specs["feature_map.W"].shape == (6, 4)
    assert "feature_map.W" in init_weights(FAVOR, 0)


def test_init_is_deterministic_and_documented_scales():
    a, b = init_weights(SMALL, 3), init_weights(SMALL, 3)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["embed.weight"], init_weights(SMALL, 4)["embed.weight"])
    assert np.all(a["layers.0.ff.up.bias"] == 0)
    assert np.all(a["final_norm.weight"] == 1)
    assert all(v.dtype == np.float32 for v in a.values())


@pytest.mark.parametrize("name", ["layers.1.attn.k.weight", "embed.weight", "final_norm.bias"])
def test_missing_tensor_is_refused_naming_it(name):
    w = init_weights(SMALL, 0)
    del w[name]
    with pytest.raises(ModelFileError, match=f"missing tensor '{re.escape(name)}'"):
        read_model(_raw_file(SMALL, w))


@pytest.mark.parametrize("name", ["layers.0.ff.up.weight", "layers.1.norm2.weight"])
def test_wrong_shape_is_refused_naming_it(name):
    w = init_weights(SMALL, 0)
    w[name] = np.zeros((3, 3), np.float32)
    with pytest.raises(
        ModelFileError, match=rf"tensor '{re.escape(name)}' has shape \[3, 3\], expected"
    ):
        read_model(_raw_file(SMALL, w))


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32])
def test_wrong_dtype_is_refused_naming_it(dtype):
    w = init_weights(SMALL, 0)
    name = "layers.0.attn.o.weight"
    w[name] = w[name].astype(dtype)
    with pytest.raises(
        ModelFileError, match=rf"tensor '{re.escape(name)}' has dtype .*, expected F32"
    ):
        read_model(_raw_file(SMALL, w))


def test_unexpected_tensor_is_refused_naming_it():
    w = init_weights(SMALL, 0)
    w["layers.9.attn.q.weight"] = np.zeros((8, 8), np.float32)
    with pytest.raises(ModelFileError, match=r"unexpected tensor 'layers\.9\.attn\.q\.weight'"):
        read_model(_raw_file(SMALL, w))


def test_non_finite_weight_is_refused_naming_it():
    w = init_weights(SMALL, 0)
    w["layers.1.ff.down.bias"][2] = np.nan
    with pytest.raises(ModelFileError, match=r"'layers\.1\.ff\.down\.bias' holds 1 NaN or Inf"):
        read_model(_raw_file(SMALL, w))


def test_feature_map_matrix_that_differs_from_its_seed_is_refused():
    w = init_weights(FAVOR, 0)
    w["feature_map.W"] = w["feature_map.W"] * np.float32(1.5)
    with pytest.raises(ModelFileError, match=r"'feature_map\.W' differs from the parameters"):
        read_model(_raw_file(FAVOR, w))


def test_writer_refuses_what_the_reader_would(tmp_path):
    w = init_weights(SMALL, 0)
    w["embed.weight"] = w["embed.weight"][:5]
    with pytest.raises(ModelFileError, match=r"'embed\.weight' has shape"):
        write_model(tmp_path / "m.safetensors", SMALL, w)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"", "not a safetensors file"),
        (b"\xff" * 8 + b"{}", "truncated"),
        ((5).to_bytes(8, "little") + b"{nope", "not valid JSON"),
        ((2).to_bytes(8, "little") + b"[]", "must be a JSON object"),
    ],
    ids=["empty", "huge-header", "bad-json", "not-object"],
)
def test_malformed_files_are_refused(data, words):
    with pytest.raises(ModelFileError, match=words):
        read_model(data)


def test_truncated_tensor_data_is_refused():
    data = write_model_bytes(SMALL, init_weights(SMALL, 0))
    with pytest.raises(ModelFileError, match="could not read the tensors"):
        read_model(data[:-10])


@pytest.mark.parametrize(
    ("meta", "words"),
    [
        ({}, "not a linstream model file"),
        ({"format": "linstream-model", "format_version": "2"}, "format_version '2'"),
        ({"format": "linstream-model", "format_version": "1", "config": "{"}, "config"),
        (
            {
                "format": "linstream-model",
                "format_version": "1",
                "config": json.dumps({"d_model": -3}),
            },
            "d_model",
        ),
    ],
    ids=["no-format", "newer-version", "bad-config-json", "invalid-config"],
)
def test_bad_metadata_is_refused(meta, words):
    tensors = init_weights(SMALL, 0)
    data = save(tensors, metadata=meta or None)
    with pytest.raises(ModelFileError, match=words):
        read_model(data)


# -- fingerprint --------------------------------------------------------------------------------
@pytest.mark.parametrize("config", [SMALL, FAVOR], ids=["tokens", "features-favor+"])
def test_fingerprint_changes_when_any_single_weight_changes(config):
    w = init_weights(config, 0)
    base = fingerprint(config, w)
    seen = {base}
    rng = np.random.default_rng(0)
    for name in w:
        changed = {k: v.copy() for k, v in w.items()}
        flat = changed[name].reshape(-1)
        i = int(rng.integers(flat.size))
        flat[i] = np.nextafter(flat[i], np.float32(np.inf))  # the smallest possible change
        fp = fingerprint(config, changed)
        assert fp not in seen, name
        seen.add(fp)
    assert fingerprint(config, w) == base


def test_fingerprint_changes_with_feature_map_params_and_config():
    w = init_weights(FAVOR, 0)
    base = fingerprint(FAVOR, w)
    fm = dict(FAVOR.feature_map, seed=2)
    other = ModelConfig(**{**FAVOR.to_dict(), "feature_map": fm})
    w2 = dict(w, **{"feature_map.W": init_weights(other, 0)["feature_map.W"]})
    assert not np.array_equal(w2["feature_map.W"], w["feature_map.W"])
    assert fingerprint(other, w2) != base
    # The map's generated parameters are hashed on their own too: same stored tensors, other seed.
    assert fingerprint(other, w) != base
    assert fingerprint(ModelConfig(**{**FAVOR.to_dict(), "eps": 1e-5}), w) != base
