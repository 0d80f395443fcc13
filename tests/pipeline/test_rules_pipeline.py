"""`CausalLinearAttention(rule=...)`: every update rule through the stateful stage (driven as a
runner drives it, without one: tests/helpers/stage_runs.py; the Beam adapter around it is
checked in test_stage_wiring.py), with shuffled and duplicated chunks, checkpoints, resumes and
the exactly-once output files.

Each test prints its seed; the chunk splits, the shuffle and the duplicates are rebuilt from it.

The tolerance is derived in _rule_helpers.py.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from helpers.rules import PER_TOKEN, reference
from helpers.stage_runs import run_stage
from linstream.pipeline import CausalLinearAttention, Chunk
from linstream.pipeline.io import read_results

pytestmark = pytest.mark.e2e  # whole jobs, subprocesses or servers: `make check` leaves it out

H, DK, DV = 2, 3, 4
#: (rule, transform arguments); "gated-unnormalized" is `gated` with normalize=False.
CASES = {
    "additive": ("additive", {}),
    "decay": ("decay", {"gamma": [0.9, 0.6]}),
    "gated": ("gated", {}),
    "gated-unnormalized": ("gated", {"normalize": False}),
    "delta": ("delta", {}),
    "gated_delta": ("gated_delta", {}),
}


def make_sequence(rule: str, t: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """q, k, v [T, H, d] float32 and the rule's per-token inputs [T, H] (gates over a wide range,
    α from ~0.4 to 1; β over (0, 1])."""
    data = {
        n: rng.standard_normal((t, H, d)).astype(np.float32)
        for n, d in zip("qkv", (DK, DK, DV), strict=True)
    }
    if "log_alpha" in PER_TOKEN.get(rule, ()):
        data["log_alpha"] = -rng.exponential(0.2, size=(t, H))
    if "beta" in PER_TOKEN.get(rule, ()):
        data["beta"] = np.minimum(rng.uniform(0.0, 1.0, size=(t, H)) ** 0.5 + 1e-3, 1.0)
    return data


def split(seq_id: str, data: dict, rng: np.random.Generator, max_len: int = 40) -> list[Chunk]:
    t = len(data["q"])
    cuts = sorted({0, t, *rng.integers(1, t, size=max(1, t // max_len * 2)).tolist()})
    return [
        Chunk(seq_id, i, {n: a[lo:hi] for n, a in data.items()}, final=hi == t)
        for i, (lo, hi) in enumerate(itertools.pairwise(cuts))
    ]


def shuffled_with_duplicates(chunks: list[Chunk], rng: np.random.Generator) -> tuple[list, int]:
    dup = [chunks[int(i)] for i in rng.choice(len(chunks), size=len(chunks) // 3, replace=False)]
    everything = chunks + dup
    return [everything[int(i)] for i in rng.permutation(len(everything))], len(dup)


def per_sequence(results: list, seq_id: str) -> np.ndarray:
    mine = sorted((r for r in results if r.seq_id == seq_id), key=lambda r: r.index)
    return np.concatenate([r.output for r in mine])


def job_input(rule: str, seed: int, sequences: int = 3):
    rng = np.random.default_rng(seed)
    seqs = {f"s{s}": make_sequence(rule, int(rng.integers(60, 200)), rng) for s in range(sequences)}
    chunks = {sid: split(sid, data, rng) for sid, data in seqs.items()}
    return rng, seqs, chunks


@pytest.mark.parametrize("name", list(CASES))
def test_shuffled_duplicated_chunks_match_the_reference_and_resume_exactly(name, tmp_path):
    """One job over shuffled, duplicated chunks equals the float64 reference of each whole
    sequence; a part job and a resumed job (with checkpoints and output files) emit and write
    exactly what the uninterrupted job emits, bit for bit."""
    rule, args = CASES[name]
    seed = 1000 + list(CASES).index(name)
    print(f"seed={seed} rule={name}")
    rng, seqs, chunks = job_input(rule, seed)
    everything = [c for cs in chunks.values() for c in cs]
    sent, n_dup = shuffled_with_duplicates(everything, rng)

    def make(**kw):
        return CausalLinearAttention(rule=rule, checkpoint_every=2, **args, **kw)

    one = run_stage(sent, make())
    assert one.dead == []
    assert one.counters.get("duplicates", 0) == n_dup
    for sid, data in seqs.items():
        ref, tol = reference(rule, args, data, len(chunks[sid]))
        got = per_sequence(one.results, sid)
        err = float(np.max(np.abs(got - ref)))
        print(f"{sid}: T={len(ref)} chunks={len(chunks[sid])} max error {err:.3g}, tol {tol:.3g}")
        assert got.shape == ref.shape and err <= tol

    # Part job, then a resumed job over the rest (plus a few chunks the part job applied).
    stop = {sid: int(rng.integers(0, len(cs))) for sid, cs in chunks.items()}
    stop["s0"] = max(stop["s0"], 1)  # at least one sequence is restored
    part1 = [c for c in sent if c.index < stop[c.seq_id]]
    part2 = [c for c in sent if c.index >= stop[c.seq_id]]
    resent = [c for cs in chunks.values() for c in cs if c.index < stop[c.seq_id]][:3]
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    r1 = run_stage(part1, make(checkpoint_dir=ckpt, output_dir=out))
    r2 = run_stage(part2 + resent, make(checkpoint_dir=ckpt, output_dir=out, resume=True))
    assert r1.dead == [] and r2.dead == []
    assert r2.counters.get("restores", 0) == sum(1 for v in stop.values() if v > 0)
    assert set(r1.by_key()).isdisjoint(r2.by_key())
    both = {**r1.by_key(), **r2.by_key()}
    assert both.keys() == one.by_key().keys()
    for key, r in one.by_key().items():
        assert both[key].start_position == r.start_position
        assert both[key].output.tobytes() == r.output.tobytes(), key

    # The exactly-once files under <out>/results/: every chunk once, the uninterrupted outputs,
    # and so each sequence's reference.
    written = read_results(out)
    assert written.keys() == one.by_key().keys()
    for key, r in one.by_key().items():
        start, arr = written[key]
        assert start == r.start_position
        assert arr.tobytes() == r.output.astype(np.float32).reshape(len(r.output), -1).tobytes()
    for sid, data in seqs.items():
        ref, tol = reference(rule, args, data, len(chunks[sid]))
        rows = [written[(sid, c.index)][1] for c in chunks[sid]]
        assert np.max(np.abs(np.concatenate(rows).reshape(ref.shape) - ref)) <= tol


@pytest.mark.parametrize("rule", ["gated", "delta"])
def test_a_chunk_longer_than_a_block_equals_block_sized_chunks(rule):
    """The stage computes a long chunk in blocks of `block_tokens`, slicing log_alpha/beta with
    q/k/v: the same tokens sent as block-sized chunks give the same bits."""
    seed = 7 if rule == "gated" else 8
    print(f"seed={seed} rule={rule}")
    transform = CausalLinearAttention(rule=rule)
    block = transform.config.block_tokens
    rng = np.random.default_rng(seed)
    data = make_sequence(rule, 2 * block + 37, rng)
    t = len(data["q"])
    long = [Chunk("long", 0, data, final=True)]
    cuts = [*range(0, t, block), t]
    blocks = [
        Chunk("blocks", i, {n: a[lo:hi] for n, a in data.items()}, final=hi == t)
        for i, (lo, hi) in enumerate(itertools.pairwise(cuts))
    ]
    run = run_stage(long + blocks, transform)
    assert run.dead == []
    got_long, got_blocks = per_sequence(run.results, "long"), per_sequence(run.results, "blocks")
    assert got_long.tobytes() == got_blocks.tobytes()
    ref, tol = reference(rule, {}, data, len(blocks))
    assert np.max(np.abs(got_long - ref)) <= tol
