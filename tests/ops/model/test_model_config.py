"""ModelConfig: JSON round trip and refusals with clear messages."""

import dataclasses

import pytest
from linstream.ops.model.config import ModelConfig

FEATURES = {"input_kind": "features", "vocab_size": None, "input_dim": 7}


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        dict(FEATURES, normalization="rmsnorm", activation="silu"),
        {"feature_map": {"name": "favor+", "num_features": 16, "seed": 3}, "eps": 0},
        {"feature_map": {"name": "relu"}, "n_layers": 3, "activation": "relu"},
    ],
    ids=["default", "features-rmsnorm", "favor+", "relu"],
)
def test_json_round_trip(kwargs):
    cfg = ModelConfig(**kwargs)
    back = ModelConfig.from_json(cfg.to_json())
    assert back == cfg
    assert back.to_json() == cfg.to_json()
    assert hash(back) == hash(cfg)


def test_config_is_frozen_and_keeps_its_own_feature_map_copy():
    fm = {"name": "elu+1"}
    cfg = ModelConfig(feature_map=fm)
    fm["name"] = "relu"
    assert cfg.feature_map == {"name": "elu+1"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.d_model = 3  # type: ignore[misc]


def test_int_and_float_eps_write_the_same_json():
    assert ModelConfig(eps=0).to_json() == ModelConfig(eps=0.0).to_json()


def test_derived_sizes():
    cfg = ModelConfig(n_heads=3, d_head=5, feature_map={"name": "favor+", "num_features": 11})
    assert cfg.d_attn == 15
    assert cfg.feature_dim == 11


@pytest.mark.parametrize(
    ("kwargs", "exc", "words"),
    [
        ({"input_kind": "pixels"}, ValueError, "input_kind"),
        ({"vocab_size": 0}, ValueError, "vocab_size"),
        ({"vocab_size": 5.0}, TypeError, "vocab_size"),
        ({"input_dim": 4}, ValueError, "input_dim must be None"),
        ({"input_kind": "features", "input_dim": 3}, ValueError, "vocab_size must be None"),
        ({"input_kind": "features", "vocab_size": None}, TypeError, "input_dim"),
        ({"d_model": -1}, ValueError, "d_model"),
        ({"n_layers": True}, TypeError, "n_layers"),
        ({"normalization": "batchnorm"}, ValueError, "normalization"),
        ({"activation": "tanh"}, ValueError, "activation"),
        ({"eps": float("nan")}, ValueError, "eps"),
        ({"feature_map": "elu+1"}, TypeError, "feature_map"),
        ({"feature_map": {"name": "softmax"}}, ValueError, "softmax"),
    ],
)
def test_invalid_configs_are_refused_naming_the_field(kwargs, exc, words):
    with pytest.raises(exc, match=words):
        ModelConfig(**kwargs)


def test_from_json_refuses_unknown_fields_and_bad_json():
    with pytest.raises(ValueError, match="unknown model config field"):
        ModelConfig.from_dict({"d_model": 8, "colour": "blue"})
    with pytest.raises(ValueError, match="not valid JSON"):
        ModelConfig.from_json("{d_model: 8")
    with pytest.raises(TypeError, match="JSON object"):
        ModelConfig.from_json("[1, 2]")
