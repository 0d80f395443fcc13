"""Loading a Mamba-2 folder: its config.json in transformers' and fla's dialects (the defaults
each library gives a key it lacks, what is refused: one line naming the option and its value),
its tensors under `backbone.`, its tokenizer, and the state it carries.

Folders are written by tests/helpers/fla_folders.py (no torch); their outputs are checked
against transformers' own model in test_mamba2_oracle.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers.fla_folders import TINY_CONFIGS, random_weights, write_folder
from linstream.ops.model.fla import ModelFolderError, load_model
from linstream.ops.model.fla.config import parse_config

pytestmark = pytest.mark.e2e  # writes and loads folders: `make check` leaves it out

BASE = TINY_CONFIGS["mamba2"]


def folder_with(tmp_path: Path, drop=(), **changes) -> Path:
    cfg = {k: v for k, v in BASE.items() if k not in drop}
    cfg.update(changes)
    # weights for the config without the change (the refusal must come from the config)
    return write_folder(tmp_path / "m", cfg, weights=random_weights(BASE))


def refused(path: Path) -> str:
    with pytest.raises(ModelFolderError) as info:
        load_model(path)
    msg = str(info.value)
    print(msg)
    assert "\n" not in msg and msg.startswith(str(path))
    return msg


def spec(**raw):
    return parse_config({"model_type": "mamba2", **raw}, source="<test>")


def test_a_bare_config_gets_transformers_defaults():
    """transformers 5.24's Mamba2Config: hidden 4096, 64 layers, 128 heads of 64, d_state 128,
    8 groups, conv 4 with bias, eps 1e-5, vocab 32768, time steps unclamped."""
    c = spec()
    assert (c.common.hidden_size, c.common.num_layers, c.common.vocab_size) == (4096, 64, 32768)
    assert c.common.norm_eps == 1e-5 and c.common.intermediate_size == 8192
    s = c.layer
    assert (s.dialect, s.num_heads, s.head_dim, s.state_size, s.n_groups) == (
        "transformers", 128, 64, 128, 8,
    )  # fmt: skip
    assert (s.conv_kernel, s.use_conv_bias, s.use_bias) == (4, True, False)
    assert s.time_step_limit == (0.0, float("inf")) and s.gated_norm == "gate_then_norm"


def test_fla_keys_select_fla_defaults():
    """fla 0.6.0's Mamba2Config: hidden 2048, 48 layers, heads from expand · hidden / head_dim,
    1 group, vocab 32000, norm_eps; its norm options."""
    c = spec(norm_eps=1e-6)
    s = c.layer
    assert (c.common.hidden_size, c.common.num_layers, c.common.vocab_size) == (2048, 48, 32000)
    assert c.common.norm_eps == 1e-6
    assert (s.dialect, s.num_heads, s.n_groups) == ("fla", 64, 1)
    assert spec(rmsnorm=True, norm_before_gate=True).layer.gated_norm == "norm_then_gate"
    assert spec(rmsnorm=False).layer.gated_norm == "gate"
    assert spec(D_has_hdim=True).layer.d_has_hdim
    assert spec(dt_limit=[0.1, 2.0]).layer.time_step_limit == (0.1, 2.0)


@pytest.mark.parametrize(
    "limit",
    [[0.0, {"__float__": "Infinity"}], [0.0, float("inf")], [0.001, 0.1]],
    ids=["transformers-5", "json-Infinity", "finite"],
)
def test_time_step_limits_as_transformers_writes_them(limit):
    want = tuple(float(v["__float__"]) if isinstance(v, dict) else v for v in limit)
    assert spec(time_step_limit=limit).layer.time_step_limit == want


def test_inert_keys_are_accepted(tmp_path):
    """Initialization, the libraries' scan chunk, residual_in_fp32, bookkeeping."""
    inert = {"time_step_rank": "auto", "time_step_min": 0.01, "time_step_max": 0.2,
             "time_step_floor": 1e-3, "rescale_prenorm_residual": True, "chunk_size": 128,
             "residual_in_fp32": False, "initializer_range": 0.5, "use_cache": False,
             "norm_before_gate": False, "rms_norm": True, "pad_token_id": 0,
             "architectures": ["Mamba2ForCausalLM"], "dtype": "bfloat16"}  # fmt: skip
    model = load_model(folder_with(tmp_path, **inert))
    assert model.config.common.family == "mamba2"


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("hidden_act", "gelu", ["SiLU"]),
        ("norm_before_gate", True, ["always gates before the norm"]),
        ("rms_norm", False, ["always gates before the norm"]),
        ("num_heads", 4, ["num_heads · head_dim = 32 must equal hidden_size · expand = 64"]),
        ("n_groups", 3, ["num_heads (8) must be a multiple of n_groups"]),
        ("time_step_limit", [0.5, 0.1], ["expected lo ≤ hi"]),
        ("some_new_option", 3, ["not a key of transformers 5.24's Mamba2Config"]),
        ("D_has_hdim", False, ["mixes transformers' Mamba-2 keys (layer_norm_epsilon)"]),
    ],
)
def test_an_option_the_runtime_lacks_is_refused_by_name(tmp_path, key, value, words):
    msg = refused(folder_with(tmp_path, **{key: value}))
    if "mixes" not in words[0]:
        assert f"config option {key} = {json.dumps(value)} is not supported" in msg
    for w in words:
        assert w in msg


def test_an_fla_config_refuses_an_unknown_key_naming_fla():
    cfg = {"model_type": "mamba2", "hidden_size": 32, "num_hidden_layers": 2, "head_dim": 8,
           "state_size": 8, "vocab_size": 50, "norm_eps": 1e-5, "fancy": 1}  # fmt: skip
    with pytest.raises(ModelFolderError, match=r"not a key of fla 0\.6\.0's Mamba2Config"):
        parse_config(cfg, source="<test>")


def test_a_malformed_time_step_limit_says_what_was_expected(tmp_path):
    msg = refused(folder_with(tmp_path, time_step_limit=[0.0]))
    assert "time_step_limit = [0.0]: expected two numbers [lo, hi]" in msg


def test_tensors_under_backbone_and_the_state_layout(tmp_path):
    """transformers' names (backbone.embeddings, backbone.layers.i.{norm, mixer.*},
    backbone.norm_f); the state per layer: S [H, head_dim, d_state], conv_xbc [W−1, I + 2GN];
    the output head is not read."""
    model = load_model(folder_with(tmp_path))
    assert model.state_layout() == (("S", (2, 8, 8, 8)), ("conv_xbc", (2, 3, 64 + 2 * 2 * 8)))
    assert model.load_report.parameters == sum(
        a.size for n, a in random_weights(BASE).items() if n != "lm_head.weight"
    )
    w = random_weights(BASE)
    del w["backbone.layers.1.mixer.dt_bias"]
    msg = refused(write_folder(tmp_path / "b", BASE, weights=w))
    assert "missing tensor 'backbone.layers.1.mixer.dt_bias'" in msg


def test_no_tokenizer_json_is_one_line(tmp_path):
    model = load_model(folder_with(tmp_path))
    with pytest.raises(ModelFolderError, match=r"no tokenizer\.json in the folder") as info:
        model.tokenizer_file()
    assert "\n" not in str(info.value)


def test_the_fingerprint_follows_the_forward(tmp_path):
    """A key that changes the forward (the time-step clamp) changes the fingerprint; one that
    does not (the libraries' chunk_size) leaves it."""
    w = random_weights(BASE)
    prints = {}
    for name, extra in [("base", {}), ("chunk", {"chunk_size": 64}),
                        ("clamp", {"time_step_limit": [0.0, 0.5]})]:  # fmt: skip
        folder = write_folder(tmp_path / name, {**BASE, **extra}, weights=w)
        prints[name] = load_model(folder).fingerprint
    assert prints["base"] == prints["chunk"] != prints["clamp"]
    ids = np.arange(20) % 50
    a = load_model(tmp_path / "base").embed(ids)
    b = load_model(tmp_path / "clamp").embed(ids)
    assert not np.allclose(a, b)
