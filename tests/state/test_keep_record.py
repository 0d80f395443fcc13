"""The store's `--keep-every-tokens` record (`keep_record`): written whole, read as untrusted input.

Every bad record — damaged, nested, oversized, a number too long, wrong keys or types, a FIFO, a
folder or a symbolic link in its place — is one line naming the file and a non-zero exit of
`linstream checkpoint gc` and `inspect`, and nothing is pruned by a guess."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from helpers.cli import linstream, one_error_line
from linstream.pipeline.app.checkpoint_cli import main
from linstream.state import CheckpointStore, SequenceState
from linstream.state.errors import CorruptCheckpointError
from linstream.state.store.keep_record import MAX_RECORD_BYTES, RECORD_NAME, read_keep_every

FP = "ef" * 32


def _commits(root: str, up_to: int = 40) -> None:
    rng = np.random.default_rng(3)  # values only; the positions are what is checked
    with CheckpointStore(root, keep=2, keep_every_tokens=0) as store:
        for i, position in enumerate(range(4, up_to + 1, 4)):
            S = rng.standard_normal((1, 1, 2, 2))
            store.commit(SequenceState("a", position, i + 1, S, np.ones((1, 1, 2)), FP))


def _files(root: str) -> list[str]:
    return sorted(os.listdir(os.path.join(root, "qa")))  # sequence "a"'s folder


def test_given_n_is_recorded_and_used_by_a_store_opened_without_it(tmp_path):
    root = str(tmp_path / "ckpt")
    _commits(root)
    store = CheckpointStore(root)
    assert store.settle_keep_every(None) is None  # no record: nothing to say, nothing kept
    assert not os.path.exists(os.path.join(root, RECORD_NAME))
    note = store.settle_keep_every(10)
    assert note is not None and RECORD_NAME in note
    with open(os.path.join(root, RECORD_NAME), "rb") as f:
        assert json.loads(f.read()) == {"format": 1, "keep_every_tokens": 10}
    assert CheckpointStore(root).retention.keep_every_tokens == 10  # a later store reads it
    assert store.settle_keep_every(10) is None  # the same N again: nothing new to say
    assert "was 10" in (store.settle_keep_every(25) or "")
    assert read_keep_every(store.folders.fs) == 25
    assert store.settle_keep_every(0) is not None  # turned off explicitly, and recorded
    assert read_keep_every(store.folders.fs) == 0
    assert CheckpointStore(root).retention.keep_every_tokens == 0


def _fifo(path: str) -> None:
    os.mkfifo(path)


def _folder(path: str) -> None:
    os.mkdir(path)


def _link(path: str) -> None:
    target = path + ".target"
    with open(target, "w") as f:
        json.dump({"format": 1, "keep_every_tokens": 8}, f)
    os.symlink(target, path)


BAD = {
    "not json": b"keep 16",
    "nested": b"[" * 40 + b"]" * 40,
    "oversized": b'{"format": 1, "keep_every_tokens": 16, "pad": "'
    + b"x" * MAX_RECORD_BYTES
    + b'"}',
    "long number": b'{"format": 1, "keep_every_tokens": ' + b"9" * 60 + b"}",
    "too large": b'{"format": 1, "keep_every_tokens": 99999999999999999999}',
    "negative": b'{"format": 1, "keep_every_tokens": -16}',
    "a string": b'{"format": 1, "keep_every_tokens": "16"}',
    "a bool": b'{"format": 1, "keep_every_tokens": true}',
    "a float": b'{"format": 1, "keep_every_tokens": 16.0}',
    "NaN": b'{"format": 1, "keep_every_tokens": NaN}',
    "other format": b'{"format": 2, "keep_every_tokens": 16}',
    "extra key": b'{"format": 1, "keep_every_tokens": 16, "keep": 9}',
    "a list": b"[1, 16]",
    "bad utf-8": b'{"format": 1, "keep_every_tokens": 16, "x": "\xff"}',
}


@pytest.mark.parametrize("case", [*BAD, "fifo", "folder", "link"])
def test_a_bad_record_is_one_line_and_a_nonzero_exit(tmp_path, capsys, case):
    root = str(tmp_path / "ckpt")
    _commits(root)
    before = _files(root)
    path = os.path.join(root, RECORD_NAME)
    if case in BAD:
        with open(path, "wb") as f:
            f.write(BAD[case])
    else:
        {"fifo": _fifo, "folder": _folder, "link": _link}[case](path)
    with pytest.raises(CorruptCheckpointError, match=RECORD_NAME):
        CheckpointStore(root)
    for argv in (["checkpoint", "gc", root], ["checkpoint", "inspect", root, "--json"]):
        assert main(argv) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and RECORD_NAME in err[0], err
    assert main(["checkpoint", "gc", root, "--keep-every-tokens", "8"]) == 1  # never overwritten
    assert RECORD_NAME in capsys.readouterr().err
    assert _files(root) == before  # nothing pruned


def test_a_bad_record_through_the_command(tmp_path):
    root = str(tmp_path / "ckpt")
    _commits(root)
    with open(os.path.join(root, RECORD_NAME), "wb") as f:
        f.write(b'{"format": 1, "keep_every_tokens": "every"}')
    line = one_error_line(linstream("checkpoint", "gc", root))
    assert RECORD_NAME in line and "keep_every_tokens" in line
    proc = linstream("checkpoint", "gc", root)
    assert proc.returncode != 0


def test_the_record_through_fsspec(tmp_path):
    """An fsspec store (memory://) records and reads it through the same storage layer."""
    root = f"memory://keep-record-{tmp_path.name}"
    store = CheckpointStore(root)
    assert store.settle_keep_every(12) is not None
    assert CheckpointStore(root).retention.keep_every_tokens == 12
    assert "as recorded" in (CheckpointStore(root).settle_keep_every(None) or "")
