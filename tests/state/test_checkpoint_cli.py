"""`linstream checkpoint inspect|verify` through checkpoint_cli.main (and a host parser)."""

import argparse
import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest
from helpers.store_faults import flip_bit, random_state, truncate
from linstream.pipeline.app import checkpoint_cli
from linstream.state import CheckpointStore

pytestmark = pytest.mark.e2e  # whole jobs, subprocesses or servers: `make check` leaves it out


def _store(tmp_path):
    store = CheckpointStore(str(tmp_path))
    a = random_state(1, seq_id="alpha", position=10, next_chunk=2)
    store.commit(a)
    store.commit(dataclasses.replace(a, position=20, next_chunk=3))
    store.commit(random_state(2, seq_id="beta/β", position=5, next_chunk=1, dtype="float32"))
    return store


def test_inspect_prints_a_table(tmp_path, capsys):
    _store(tmp_path)
    assert checkpoint_cli.main(["checkpoint", "inspect", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "sequence",
        "position",
        "next_chunk",
        "commits",
        "bytes",
        "fingerprint",
        "|S|",
        "|z|",
    ]
    alpha = lines[1].split()
    assert alpha[:4] == ["alpha", "20", "3", "2"]
    assert alpha[6] == "ffffffffffff"
    st = random_state(1)
    assert abs(float(alpha[7]) - np.linalg.norm(st.S.ravel())) < 1e-4 * float(alpha[7])
    assert lines[2].split()[:4] == ["beta/β", "5", "1", "1"]


def test_inspect_one_sequence(tmp_path, capsys):
    _store(tmp_path)
    assert checkpoint_cli.main(["checkpoint", "inspect", str(tmp_path), "--seq", "beta/β"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and out[1].startswith("beta/β")


def test_verify_clean_store_exits_zero(tmp_path, capsys):
    _store(tmp_path)
    assert checkpoint_cli.main(["checkpoint", "verify", str(tmp_path)]) == 0
    assert "ok: 3 commit(s)" in capsys.readouterr().out


def test_verify_lists_each_bad_file_and_exits_nonzero(tmp_path, capsys):
    store = _store(tmp_path)
    bad1 = store.commits("alpha")[0].data_path
    flip_bit(bad1, 100)
    bad2 = store.commits("beta/β")[0].manifest_path
    truncate(bad2, 0)
    assert checkpoint_cli.main(["checkpoint", "verify", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"BAD {bad1}: CorruptCheckpointError: sha256" in out
    assert f"BAD {bad2}: CorruptCheckpointError: manifest is empty" in out
    assert "2 bad commit(s)" in out


def test_missing_root_exits_2(tmp_path, capsys):
    assert checkpoint_cli.main(["checkpoint", "verify", str(tmp_path / "nope")]) == 2
    assert "no checkpoint store" in capsys.readouterr().err


def test_plugs_into_a_host_parser(tmp_path):
    _store(tmp_path)
    parser = argparse.ArgumentParser(prog="linstream")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo")
    checkpoint_cli.add_checkpoint_parser(sub)
    args = parser.parse_args(["checkpoint", "verify", str(tmp_path)])
    assert args.func(args) == 0


def test_module_does_not_import_beam(tmp_path):
    """checkpoint_cli itself never imports Beam (the package __init__ is stubbed out here: it
    belongs to the pipeline and may import Beam)."""
    pipeline_dir = os.path.dirname(checkpoint_cli.__file__)
    code = (
        "import sys, types; "
        "pkg = types.ModuleType('linstream.pipeline'); "
        f"pkg.__path__ = [{pipeline_dir!r}]; "
        "sys.modules['linstream.pipeline'] = pkg; "
        "import linstream.pipeline.app.checkpoint_cli as c; "
        f"rc = c.main(['checkpoint', 'verify', {str(tmp_path)!r}]); "
        "assert rc == 0, rc; "
        "assert not [m for m in sys.modules if m.split('.')[0] == 'apache_beam']"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
