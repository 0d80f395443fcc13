"""Loading a checkpoint folder in fla's format: what is refused (one line naming the option and
its value, or the file and the tensor), what is accepted, the tokenizer, the fingerprint, the
streaming interface, and the memory a load holds (a second process measures it).

Folders are written by tests/helpers/fla_folders.py (no torch); the outputs of these models are
checked against fla itself in test_fla_oracle.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from helpers.fla_folders import TINY_CONFIGS, bf16_round, random_weights, write_folder
from helpers.streaming import stream_embeddings
from linstream.ops.model.fla import LayerState, ModelFolderError, load_model
from linstream.ops.model.weights import ModelFileError

pytestmark = pytest.mark.e2e  # whole jobs, subprocesses or servers: `make check` leaves it out


def folder_with(tmp_path: Path, family: str = "gla", **changes) -> Path:
    cfg = dict(TINY_CONFIGS[family])
    cfg.update(changes)
    # weights for the config without the change (the refusal must come from the config)
    return write_folder(tmp_path / "m", cfg, weights=random_weights(TINY_CONFIGS[family]))


def refused(path: Path) -> str:
    with pytest.raises(ModelFolderError) as info:
        load_model(path)
    msg = str(info.value)
    print(msg)
    assert "\n" not in msg and msg.startswith(str(path))
    return msg


# -- config options ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("family", "key", "value", "words"),
    [
        ("gla", "attn", {"layers": [1], "num_heads": 2}, ["hybrid softmax-attention", "[1]"]),
        ("gla", "feature_map", "gelu", ["the runtime has"]),
        ("gla", "gate_logit_normalizer", 8, ["fla 0.6.0 ignores"]),
        ("gla", "use_gv", True, ["fla 0.6.0 ignores"]),
        ("retnet", "use_short_conv", True, ["builds no short convolution"]),
        ("delta_net", "use_output_norm", False, ["applies the output norm"]),
        ("delta_net", "qk_activation", "tanh", ["silu"]),
        ("gated_deltanet", "num_v_heads", 3, ["multiple of num_heads"]),
        ("gated_deltanet", "output_gate_activation", "relu", ["sigmoid"]),
        ("hgrn2", "attnres_block_size", 2, ["attention residuals"]),
        ("gla", "hidden_act", "powlu", ["SwiGLU"]),
        ("gla", "some_new_option", 3, ["not a key of fla 0.6.0's gla config"]),
    ],
)
def test_an_option_the_runtime_lacks_is_refused_by_name(tmp_path, family, key, value, words):
    msg = refused(folder_with(tmp_path, family, **{key: value}))
    assert f"config option {key} = {json.dumps(value)} is not supported" in msg
    for w in words:
        assert w in msg


def test_a_value_of_the_wrong_type_says_what_was_expected(tmp_path):
    msg = refused(folder_with(tmp_path, hidden_size="32"))
    assert 'hidden_size = "32": expected a positive integer' in msg


def test_another_model_type_is_refused_with_the_families(tmp_path):
    msg = refused(folder_with(tmp_path, model_type="mamba"))
    assert 'model_type "mamba"' in msg and "'gated_deltanet'" in msg


def test_hybrid_config_without_hybrid_layers_and_inert_keys_load(tmp_path):
    """attn with no layers, and keys that cannot change hidden states (training switches,
    token ids, bookkeeping) are accepted."""
    inert = {"attn": {"layers": []}, "use_cache": False, "fuse_cross_entropy": False,
             "bos_token_id": 5, "architectures": ["GLAForCausalLM"], "use_l2warp": True,
             "gate_logit_normalizer": 16, "gate_low_rank_dim": 16}  # fmt: skip
    model = load_model(folder_with(tmp_path, **inert))
    assert model.config.common.family == "gla"


# -- files ---------------------------------------------------------------------------------------
def test_not_a_folder_no_config_and_bad_json(tmp_path):
    assert "not a folder" in refused(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    assert "no config.json" in refused(tmp_path / "empty")
    (tmp_path / "empty" / "config.json").write_text("{nope")
    assert "config.json is not valid JSON" in refused(tmp_path / "empty")


def test_pickle_weights_are_refused_and_never_opened(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY_CONFIGS["gla"]))
    (folder / "pytorch_model.bin").mkdir()  # a folder: opening it as a file would fail loudly
    msg = refused(folder)
    assert "only PyTorch pickle weights (pytorch_model.bin)" in msg and "never unpickles" in msg


def test_missing_unexpected_and_misshapen_tensors_are_named(tmp_path):
    cfg = TINY_CONFIGS["gla"]
    w = random_weights(cfg)
    del w["model.layers.1.attn.gk_proj.1.bias"]
    msg = refused(write_folder(tmp_path / "a", cfg, weights=w))
    assert "missing tensor 'model.layers.1.attn.gk_proj.1.bias'" in msg
    w = random_weights(cfg)
    w["model.layers.0.attn.q_conv1d.bias"] = np.zeros(16, np.float32)
    msg = refused(write_folder(tmp_path / "b", cfg, weights=w))
    assert "unexpected tensor 'model.layers.0.attn.q_conv1d.bias'" in msg
    w = random_weights(cfg)
    w["model.norm.weight"] = np.ones(31, np.float32)
    msg = refused(write_folder(tmp_path / "c", cfg, weights=w))
    assert "tensor 'model.norm.weight' has shape [31], expected [32]" in msg


def test_non_finite_and_truncated_weights_are_refused(tmp_path):
    cfg = TINY_CONFIGS["delta_net"]
    w = random_weights(cfg)
    w["model.layers.1.mlp.up_proj.weight"][3, 4] = np.nan
    msg = refused(write_folder(tmp_path / "a", cfg, weights=w))
    assert "'model.layers.1.mlp.up_proj.weight' holds nan at index (3, 4)" in msg
    folder = write_folder(tmp_path / "b", cfg)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[:-100])
    assert "do not hold a F32 tensor" in refused(folder)


def test_an_index_naming_a_file_outside_the_folder_is_refused(tmp_path):
    folder = write_folder(tmp_path / "m", TINY_CONFIGS["gla"], shards=2)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    name = next(iter(index["weight_map"]))
    index["weight_map"][name] = "../elsewhere.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert "names '../elsewhere.safetensors'" in refused(folder)


def test_bfloat16_weights_are_upcast_exactly(tmp_path):
    cfg = TINY_CONFIGS["gla"]
    w = random_weights(cfg, seed=3)
    folder = write_folder(tmp_path / "m", cfg, weights=w, dtype="BF16")
    ids = np.array([0, 7, 49, 7])
    for dt in (np.float32, np.float64):
        model = load_model(folder, compute_dtype=dt)
        emb, _ = model.embed_chunk(ids, None, layer=0)  # layer 0: the embeddings
        want = bf16_round(w["model.embeddings.weight"])[ids].astype(dt)
        np.testing.assert_array_equal(emb, want)
    assert model.load_report.disk_dtypes == ("BF16",)
    assert model.load_report.disk_bytes * 4 == model.load_report.held_bytes  # 2 -> 8 bytes


# -- tokenizer -----------------------------------------------------------------------------------
def test_tokenizer_json_is_found_and_a_sentencepiece_only_folder_says_what_to_add(tmp_path):
    folder = folder_with(tmp_path)
    (folder / "tokenizer.model").write_bytes(b"\x00sentencepiece")
    model = load_model(folder)  # the weights load: token-id inputs need no tokenizer
    with pytest.raises(ModelFolderError) as info:
        model.tokenizer_file()
    msg = str(info.value)
    assert "\n" not in msg
    assert "only a SentencePiece tokenizer.model" in msg and "tokenizer.json" in msg
    assert "save_pretrained" in msg
    (folder / "tokenizer.json").write_text("{}")
    assert load_model(folder).tokenizer_file() == str(folder / "tokenizer.json")


# -- fingerprint ---------------------------------------------------------------------------------
def test_fingerprint_covers_the_architecture_and_the_weights_only(tmp_path):
    cfg = TINY_CONFIGS["gla"]
    w = random_weights(cfg)
    base = load_model(write_folder(tmp_path / "a", cfg, weights=w)).fingerprint
    assert load_model(write_folder(tmp_path / "b", cfg, weights=w, shards=3)).fingerprint == base
    inert = write_folder(tmp_path / "c", {**cfg, "use_cache": False, "eos_token_id": 9}, weights=w)
    assert load_model(inert).fingerprint == base
    w2 = {k: v.copy() for k, v in w.items()}
    w2["model.layers.1.attn.o_proj.weight"][0, 0] += 1e-3
    assert load_model(write_folder(tmp_path / "d", cfg, weights=w2)).fingerprint != base
    clamp = write_folder(tmp_path / "e", {**cfg, "clamp_min": -0.5}, weights=w)
    assert load_model(clamp).fingerprint != base
    head = {k: v.copy() for k, v in w.items()}
    head["lm_head.weight"] += 1.0  # not read: the runtime gives hidden states
    assert load_model(write_folder(tmp_path / "f", cfg, weights=head)).fingerprint == base


# -- the streaming interface --------------------------------------------------------------------
@pytest.mark.parametrize("family", list(TINY_CONFIGS))
def test_states_are_fixed_in_size_and_never_written(tmp_path, family):
    model = load_model(write_folder(tmp_path / "m", TINY_CONFIGS[family]))
    states = model.initial_states()
    size = model.state_nbytes()
    assert sum(s.nbytes for s in states) == size
    ids = np.arange(40) % 50
    _, states = model.embed_chunk(ids[:30], states)
    before = [{k: a.copy() for k, a in s.items()} for s in states]
    ids_before = ids.copy()
    emb, after = model.embed_chunk(ids[30:], states)
    assert emb.shape == (10, 32) and emb.dtype == np.float32
    for s, b in zip(states, before, strict=True):
        for k in s:
            np.testing.assert_array_equal(s[k], b[k])
    np.testing.assert_array_equal(ids, ids_before)
    assert sum(s.nbytes for s in after) == size
    assert all(isinstance(s, LayerState) for s in after)
    with pytest.raises(ValueError, match="read-only"):
        after[0]["S"][0, 0, 0] = 1.0


def test_float32_states_stay_float32(tmp_path):
    model = load_model(write_folder(tmp_path / "m", TINY_CONFIGS["gated_deltanet"]))
    _, st = model.embed_chunk(np.arange(9), model.initial_states(np.float32))
    assert all(a.dtype == np.float32 for s in st for a in s.values())


def test_bad_inputs_and_states_say_what_was_expected(tmp_path):
    model = load_model(write_folder(tmp_path / "m", TINY_CONFIGS["retnet"]))
    cases = [
        (np.array([1, 50, 2]), ValueError, "unknown token id 50 at position 1: the model's "
         "vocabulary has 50 ids (0 to 49)"),
        (np.array([], np.int64), ValueError, "empty chunk"),
        (np.array([1.0, 2.0]), TypeError, "got dtype float64"),
        (np.zeros((2, 2), np.int64), ValueError, "1-D [T], got shape (2, 2)"),
    ]  # fmt: skip
    for tokens, kind, text in cases:
        with pytest.raises(kind) as info:
            model.embed_chunk(tokens, None)
        assert text in str(info.value)
    with pytest.raises(ValueError, match="expected backend 'auto', 'numba', 'numpy' or 'cupy'"):
        model.embed_chunk(np.arange(3), None, backend="gpu")
    with pytest.raises(ValueError, match="layer must be an integer from 0 to 2"):
        model.embed_chunk(np.arange(3), None, layer=3)
    with pytest.raises(ValueError, match="one LayerState per layer"):
        model.embed_chunk(np.arange(3), model.initial_states()[:1])
    other = load_model(write_folder(tmp_path / "o", TINY_CONFIGS["gla"]))
    with pytest.raises(ValueError, match="expected"):
        model.embed_chunk(np.arange(3), other.initial_states())


def test_the_layer_option_gives_each_hidden_state(tmp_path):
    model = load_model(write_folder(tmp_path / "m", TINY_CONFIGS["hgrn2"]))
    ids = np.arange(20) % 50
    hs, _ = model.hidden_states(ids, None)
    assert len(hs) == 3
    for n in range(3):
        emb, _ = model.embed_chunk(ids, None, layer=n)
        np.testing.assert_array_equal(emb, hs[n])
    np.testing.assert_array_equal(model.embed_chunk(ids, None)[0], hs[-1])


def test_errors_are_model_file_errors_for_the_callers_that_catch_them(tmp_path):
    with pytest.raises(ModelFileError):
        load_model(tmp_path / "absent")


# -- memory --------------------------------------------------------------------------------------
_MEMORY_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from linstream.ops.model.fla import load_model, mkl
    import linstream.ops.model.fla.gla  # the modules a load imports (Numba: ~100 MiB) first

    try:  # PyTorch's CPU library (MKL's products, ~100 MiB), loaded before the measure
        mkl.library()
    except mkl.MKLUnavailable:
        pass
    from linstream.ops.model.fla import avx512
    avx512.reason_unavailable("float32")  # LLVM's library, which tells the CPU's features

    def hwm():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    before = hwm()
    model = load_model(sys.argv[1], compute_dtype=np.float32)
    r = model.load_report
    print(json.dumps({"before": before, "after": hwm(), "held": r.held_bytes,
                      "transient": r.transient_bytes, "disk": r.disk_bytes, "line": str(r)}))
    """
)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM from /proc")
def test_a_load_holds_the_weights_and_one_layer_more(tmp_path):
    """A bfloat16 folder of 45M parameters (86 MiB on disk, 172 MiB held as float32), loaded
    in a fresh process (its modules imported first): its memory high-water mark grows by the
    held weights plus at most the load's reported transient bound (one layer's tensors and one
    raw tensor) and 16 MiB for the allocator and Python objects.  A second full copy of the
    weights (even the raw bfloat16 bytes, 86 MiB) would not fit."""
    cfg = {"model_type": "gla", "hidden_size": 512, "num_hidden_layers": 12, "num_heads": 4,
           "vocab_size": 8000, "use_short_conv": True}  # fmt: skip
    folder = write_folder(tmp_path / "m", cfg, dtype="BF16", shards=2)
    out = subprocess.run(
        [sys.executable, "-c", _MEMORY_SCRIPT, str(folder)],
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    r = json.loads(out.stdout.strip().splitlines()[-1])
    print(r["line"], "| high-water mark grew by", r["after"] - r["before"])
    grew = r["after"] - r["before"]
    assert r["held"] == 2 * r["disk"]
    assert r["transient"] < r["disk"] // 4
    assert grew <= r["held"] + r["transient"] + (16 << 20), (grew, r)


# -- where a folder lies -------------------------------------------------------------------------
def test_load_model_routes_a_folder_and_its_url_to_the_same_model(tmp_path):
    """`linstream.ops.load_model` reads a folder (a path, or a URL through fsspec: memory://
    here, gs:// or s3:// on a cluster) as a checkpoint in fla's format."""
    import fsspec
    from linstream.ops import load_model as load_any

    folder = write_folder(tmp_path / "m", TINY_CONFIGS["gated_deltanet"], shards=2)
    (folder / "tokenizer.json").write_text("{}")
    fs = fsspec.filesystem("memory")
    for f in folder.iterdir():
        fs.pipe(f"/linstream-test/gdn/{f.name}", f.read_bytes())
    try:
        local = load_any(str(folder))
        remote = load_any("memory://linstream-test/gdn")  # fsspec lists it as a folder
        assert type(local).__name__ == type(remote).__name__ == "FlaModel"
        assert remote.fingerprint == local.fingerprint
        assert remote.tokenizer_file() == "memory:///linstream-test/gdn/tokenizer.json"
        ids = np.arange(25) % 50
        np.testing.assert_array_equal(
            remote.embed(ids, chunk_size=6), local.embed(ids, chunk_size=6)
        )
        with pytest.raises(ModelFolderError, match="memory://nowhere/: not a folder"):
            load_any("memory://nowhere/")  # a URL ending in "/" is taken for a folder
    finally:
        fs.rm("/linstream-test", recursive=True)
    assert type(load_any("builtin:default")).__name__ == "EmbeddingModel"


# -- threads -------------------------------------------------------------------------------------
# a chunk of one row range (its products split by columns), of two row ranges, of four
_CUTS = (0, 100, 400, 4500)
_THREADS_SCRIPT = """
import itertools, sys
import numpy as np
from linstream.ops.model.fla import load_model
ids = np.random.default_rng(5).integers(0, 50, {end})
for folder, out in zip(sys.argv[1::2], sys.argv[2::2]):
    model, st, embs = load_model(folder), None, []
    for a, b in itertools.pairwise({cuts}):
        emb, st = model.embed_chunk(ids[a:b], st)
        embs.append(emb)
    np.savez(out, emb=np.concatenate(embs), **{{f"{{i}}/{{k}}": s[k] for i, s in enumerate(st)
                                                for k in s}})
"""


def _streamed(model, ids):
    emb, st = stream_embeddings(model, ids, _CUTS)
    return {"emb": emb} | {f"{i}/{k}": s[k] for i, s in enumerate(st) for k in s}


def test_the_bits_do_not_depend_on_the_thread_count_or_who_runs_which_rows(tmp_path, monkeypatch):
    """A product over some rows is not bit-equal to the same rows of a product over all of them
    (BLAS treats a block's tail rows, and each of its threads' shares, differently), so the
    runtime holds BLAS at one thread (NumPy's, and SciPy's, which the Numba kernels call) and
    cuts a long chunk's rows into ranges fixed by its length alone (a short chunk's products:
    their output columns, by the width alone, or each product of one input whole): the outputs
    and states are
    the same bits on 1, 2 or 3 threads, in a second process with OPENBLAS_NUM_THREADS=1, and
    when the caller runs every range itself in another order (a helper that never gets a
    core)."""
    from linstream.ops.model import blas
    from linstream.ops.model.fla import runtime
    from linstream.ops.model.threads import RowSplit

    class ReversedOnCaller(RowSplit):  # every range (and every call of a group) on the caller
        def each(self, calls):
            for call in reversed(calls):
                call()

    reversed_on_caller = ReversedOnCaller(1)

    configs = {f: TINY_CONFIGS[f] for f in ("gla", "delta_net", "retnet", "rwkv7")}
    # one head of 128 × 256: the kernels' own products (Numba's np.dot, SciPy's BLAS) are then
    # large enough for BLAS to run them on its threads (over 2^18 multiply-adds)
    configs["gla_wide"] = {**TINY_CONFIGS["gla"], "hidden_size": 256, "num_heads": 1}
    families = list(configs)
    folders = [write_folder(tmp_path / f, configs[f]) for f in families]
    ids = np.random.default_rng(5).integers(0, 50, _CUTS[-1])
    script = _THREADS_SCRIPT.format(end=_CUTS[-1], cuts=_CUTS)
    args = [a for f, d in zip(families, folders, strict=True) for a in (d, tmp_path / f"{f}.npz")]
    env = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr

    def same(want, got, *what):
        assert got.keys() == want.keys()
        for k, a in got.items():
            assert np.array_equal(a, want[k]), (*what, k)

    for family, folder in zip(families, folders, strict=True):
        model = load_model(folder)
        monkeypatch.setattr(blas._single_threaded_blas, "_threads", 1)
        want = _streamed(model, ids)
        for threads in (2, 3):
            monkeypatch.setattr(blas._single_threaded_blas, "_threads", threads)
            same(want, _streamed(model, ids), family, f"{threads} threads")
        monkeypatch.setattr(
            runtime, "_thread_layout", lambda: (blas._single_threaded_blas(), reversed_on_caller)
        )
        same(want, _streamed(model, ids), family, "caller only, ranges reversed")
        monkeypatch.undo()
        with np.load(tmp_path / f"{family}.npz") as f:
            same(want, dict(f), family, "OPENBLAS_NUM_THREADS=1 process")
