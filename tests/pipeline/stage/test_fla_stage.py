"""A checkpoint folder in fla's format through the stateful stage (no runner): chunks in any order
and twice give what calling the model chunk by chunk gives, bit for bit, also when a second job
resumes every sequence from its format-3 checkpoint (the short convolutions' tails and RetNet's
position restored); another model's checkpoint is refused; `layer` picks a hidden state; the
step ships the folder's path, never the weights.  Folders: tests/helpers/fla_folders.py (random
weights, no torch); fla's own forward is the oracle in tests/ops/fla/test_fla_oracle.py and
tests/pipeline/test_fla_cli.py."""

from __future__ import annotations

import itertools
import json
import os

import numpy as np
import pytest
from apache_beam.internal import pickler
from helpers.fla_folders import TINY_CONFIGS, write_folder
from helpers.stage_runs import run_stage
from helpers.streaming import stream_chunks
from linstream.ops import load_model
from linstream.pipeline import Chunk, EmbedSequences
from linstream.pipeline.stage.steps import EmbedStep
from linstream.state import CheckpointStore, decode_state

SEED = 20261202
FAMILIES = list(TINY_CONFIGS)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("fla")
    return {f: str(write_folder(root / f, TINY_CONFIGS[f], seed=1)) for f in FAMILIES}


def _sequence(rng, seq_id, vocab):
    """A sequence's token ids and its chunks (random sizes 1..9, the last one final)."""
    sizes = rng.integers(1, 10, int(rng.integers(5, 9)))
    ids = rng.integers(0, vocab, int(sizes.sum())).astype(np.int32)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    chunks = [
        Chunk(seq_id, i, ids[a:b], final=i == len(sizes) - 1)
        for i, (a, b) in enumerate(itertools.pairwise(bounds))
    ]
    return ids, chunks


def _direct(model, chunks, layer=None):
    """The model called chunk by chunk (the reference every result must equal bit for bit)."""
    return stream_chunks(model, chunks, layer=layer)[0]


@pytest.mark.parametrize("family", FAMILIES)
def test_shuffled_resumed_chunks_equal_the_model_chunk_by_chunk(folders, family, tmp_path):
    seed = SEED + FAMILIES.index(family)
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    model = load_model(folders[family])
    seqs = [_sequence(rng, f"s{i}", model.config.vocab_size)[1] for i in range(2)]
    want = {k: v for chunks in seqs for k, v in _direct(model, chunks).items()}
    ckpt = str(tmp_path / "ckpt")

    def job(chunks, **kw):
        t = EmbedSequences(
            folders[family], checkpoint_dir=ckpt, checkpoint_every=2, emit="tokens", **kw
        )
        return run_stage(chunks, t)

    # First job: the first chunks of each sequence, shuffled, one sent twice.
    first = [c for chunks in seqs for c in chunks[:4]]
    order = [first[i] for i in rng.permutation(len(first))] + [first[0]]
    one = job(order)
    assert not one.dead, one.dead
    # Second job: the rest, resumed from the checkpoints (the last commit is at chunk 4).
    rest = [c for chunks in seqs for c in chunks[4:]]
    two = job([rest[i] for i in rng.permutation(len(rest))], resume=True)
    assert not two.dead, two.dead
    got = {**one.by_key(), **two.by_key()}
    assert len(one.results) + len(two.results) == len(want) == len(got)
    for key, emb in want.items():
        assert got[key].output.dtype == emb.dtype
        assert np.array_equal(got[key].output, emb), key
    # What the second job resumed from: format 3, the model's layout, RetNet's position implied.
    store = CheckpointStore(ckpt)
    st = store.restore("s0", fingerprint=model.fingerprint)
    assert st is not None and st.layout == model.state_layout()
    assert st.z is None and [n for n, _ in st.layout][1:] == [
        n for n in model.state_specs[0].names() if n not in ("S", "position")
    ]
    newest = store.commits("s0")[0]
    with open(newest.manifest_path, "rb") as f:
        assert json.load(f)["format_version"] == 3
    with open(newest.data_path, "rb") as f:
        assert decode_state(f.read()) == st


def test_another_models_checkpoint_is_refused(folders, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    rng = np.random.default_rng(SEED)
    _ids, chunks = _sequence(rng, "s", 50)
    run_stage(chunks[:2], EmbedSequences(folders["gla"], checkpoint_dir=ckpt))
    other = write_folder(tmp_path / "other", TINY_CONFIGS["gla"], seed=2)  # same config
    run = run_stage(chunks[2:3], EmbedSequences(str(other), checkpoint_dir=ckpt, resume=True))
    assert not run.results
    [dead] = run.dead
    assert (dead.chunk_index, dead.reason) == (2, "restore_failed")
    assert "another model" in dead.message
    # ... and a model of another family with the same S shape too (its fingerprint differs).
    run = run_stage(
        chunks[2:3], EmbedSequences(folders["delta_net"], checkpoint_dir=ckpt, resume=True)
    )
    assert [d.reason for d in run.dead] == ["restore_failed"]


@pytest.mark.parametrize("layer", [0, 1, 2])
def test_layer_picks_a_hidden_state(folders, layer):
    model = load_model(folders["retnet"])
    _ids, chunks = _sequence(np.random.default_rng(SEED + layer), "s", 50)
    run = run_stage(chunks, EmbedSequences(folders["retnet"], layer=layer, emit="tokens"))
    want = _direct(model, chunks, layer=layer)
    assert len(run.results) == len(want)
    for r in run.results:
        assert np.array_equal(r.output, want[(r.seq_id, r.index)])
    if layer < 2:  # not the final output
        final = _direct(model, chunks)
        assert not np.array_equal(run.results[0].output, final[("s", 0)])


def test_layer_is_checked_against_the_model(folders):
    with pytest.raises(ValueError, match=r"from 0 \(the embeddings\) to 2 .* got 3"):
        EmbedStep(folders["gla"], layer=3)
    with pytest.raises(ValueError, match="needs a checkpoint folder in fla's format"):
        EmbedStep("builtin:default", layer=1)


def test_the_step_ships_the_folder_path_not_the_weights(folders, tmp_path):
    model = load_model(folders["hgrn2"])
    step = EmbedStep(model)  # a loaded model: its folder goes to the workers, as a path
    data = pickler.dumps(step)
    assert len(data) < model.held_bytes() // 4, len(data)
    back = pickler.loads(data)
    assert back._source == os.path.abspath(folders["hgrn2"])
    back.setup()
    assert back.model is not model and back.model.fingerprint == model.fingerprint


def test_a_float32_state_is_carried_and_committed_as_float32(folders, tmp_path):
    model = load_model(folders["delta_net"])
    _ids, chunks = _sequence(np.random.default_rng(SEED + 9), "s", 50)
    ckpt = str(tmp_path / "ckpt")
    t = EmbedSequences(
        folders["delta_net"], state_dtype="float32", checkpoint_dir=ckpt, emit="tokens"
    )
    run = run_stage(chunks, t)
    by_key, states = stream_chunks(model, chunks, model.initial_states(np.float32))
    want = {index: emb for (_, index), emb in by_key.items()}
    assert [r.index for r in run.results] == sorted(want)
    for r in run.results:
        assert np.array_equal(r.output, want[r.index])
    st = CheckpointStore(ckpt).restore("s", fingerprint=model.fingerprint)
    assert st is not None and st.dtype == np.float32
    assert all(np.array_equal(st.tensors[k][i], states[i][k]) for i in range(2) for k in st.tensors)


def test_the_gpu_backend_runs_a_folder_on_the_device(folders, tmp_path, monkeypatch):
    """backend "cupy" reaches the fla runtime's device path through the stage: with the CUDA
    emulator standing in for the GPU (tests/helpers/cuda_emu.py), the stage's outputs and
    committed state are those of the model's device forward called chunk by chunk, bit for bit
    (the device path's own accuracy: tests/ops/fla/test_fla_device.py)."""
    from helpers.cuda_emu import EmuLauncher, compiler_missing
    from linstream.ops.model import device
    from linstream.ops.model.fla import runtime

    if compiler_missing() is not None:
        pytest.skip(str(compiler_missing()))
    emu = device._CupyDevice(EmuLauncher())
    monkeypatch.setattr(runtime, "resolve_backend", lambda name, **kw: "cupy")
    monkeypatch.setattr(device, "_cupy_device", lambda: emu)
    model = load_model(folders["gla"])
    _ids, chunks = _sequence(np.random.default_rng(SEED + 11), "s", 50)
    want, states = {}, None
    for c in chunks:
        want[c.index], states = model._forward_on(emu, c.data, states, 2)
        want[c.index] = want[c.index][0]
    ckpt = str(tmp_path / "ckpt")
    step = EmbedSequences(folders["gla"], backend="cupy", checkpoint_dir=ckpt, emit="tokens")
    run = run_stage(chunks, step)
    assert [r.index for r in run.results] == sorted(want)
    for r in run.results:
        assert np.array_equal(r.output, want[r.index])
    st = CheckpointStore(ckpt).restore("s", fingerprint=model.fingerprint)
    assert st is not None
    assert all(np.array_equal(st.tensors[k][i], states[i][k]) for i in range(2) for k in st.tensors)
