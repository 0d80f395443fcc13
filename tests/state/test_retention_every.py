"""`keep_every_tokens`: retention keeps the first commit at or past each multiple of N tokens
besides the newest ones, with their data files, in this process and in the next (gc)."""

from __future__ import annotations

import json

import numpy as np
from helpers.cli import linstream
from linstream.state import CheckpointStore, SequenceState

FP = "ef" * 32


def _commit_every_4_tokens(root: str, *, keep_every: int, up_to: int = 60) -> None:
    rng = np.random.default_rng(3)  # values only; the positions are what is checked
    with CheckpointStore(root, keep=2, keep_every_tokens=keep_every) as store:
        for i, position in enumerate(range(4, up_to + 1, 4)):
            S = rng.standard_normal((1, 1, 2, 2))
            store.commit(SequenceState("a", position, i + 1, S, np.ones((1, 1, 2)), FP))


def _positions(root: str) -> list[int]:
    proc = linstream("checkpoint", "inspect", root, "--json")  # another process reads them
    assert proc.returncode == 0, proc.stderr
    (rec,) = [json.loads(line) for line in proc.stdout.splitlines()]
    return rec["positions"]


def test_first_commit_past_each_multiple_is_kept_and_readable(tmp_path):
    root = str(tmp_path / "ckpt")
    _commit_every_4_tokens(root, keep_every=10)
    # newest two (56, 60) and the first at or past 10, 20, 30, 40, 50, 60
    assert _positions(root) == [12, 20, 32, 40, 52, 56, 60]
    store = CheckpointStore(root)
    assert store.verify() == []  # every kept commit's data file is there and intact
    assert [store.read_commit("a", p).position for p in (12, 32)] == [12, 32]


def test_without_it_only_the_newest_are_kept(tmp_path):
    root = str(tmp_path / "ckpt")
    _commit_every_4_tokens(root, keep_every=0)
    assert _positions(root) == [56, 60]


def test_gc_keeps_them_by_the_recorded_flag_and_drops_them_with_0(tmp_path):
    root = str(tmp_path / "ckpt")
    _commit_every_4_tokens(root, keep_every=10)
    kept = linstream("checkpoint", "gc", root, "--keep-every-tokens", "10")
    assert kept.returncode == 0, kept.stderr
    assert _positions(root) == [12, 20, 32, 40, 52, 56, 60]
    coarser = linstream("checkpoint", "gc", root, "--keep-every-tokens", "25")
    assert coarser.returncode == 0, coarser.stderr
    assert _positions(root) == [32, 52, 56, 60]  # first at or past 25 and 50; newest two
    plain = linstream("checkpoint", "gc", root)  # without the flag: the recorded 25
    assert plain.returncode == 0, plain.stderr
    assert _positions(root) == [32, 52, 56, 60]
    off = linstream("checkpoint", "gc", root, "--keep-every-tokens", "0")
    assert off.returncode == 0, off.stderr
    assert _positions(root) == [56, 60]
