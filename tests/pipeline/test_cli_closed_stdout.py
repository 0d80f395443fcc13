"""A reader that closes `linstream`'s standard output early ends the output, not the command.

`linstream checkpoint inspect --json | head -1` once ended with `linstream checkpoint:
BrokenPipeError: [Errno 32] Broken pipe` on stderr and exit status 1.  Now every printing
command drops the rest of its output quietly and exits with its own status: 0 where it found
nothing wrong, 1 where `verify` found a bad commit, nothing on stderr.

Two ways to close the reader: the pipe's read end closed before the command starts (every write
finds it gone: deterministic at any output size), and the shell pipeline of the report, with
more output than a pipe holds (64 KiB on Linux), so that writes still follow when `head` exits.
"""

from __future__ import annotations

import os
import subprocess

import pytest
from helpers.cli import LINSTREAM
from helpers.store_faults import flip_bit, random_state
from linstream.state import CheckpointStore

pytestmark = pytest.mark.e2e  # whole jobs, subprocesses or servers: `make check` leaves it out


def _store(root, n):
    store = CheckpointStore(str(root))
    for i in range(n):
        store.commit(random_state(i, seq_id=f"seq-{i:04d}", position=10, next_chunk=2))
    return store


def _to_closed_reader(*args):
    """Runs `linstream ARGS` with stdout a pipe whose read end is already closed."""
    r, w = os.pipe()
    os.close(r)
    try:
        return subprocess.run(
            [LINSTREAM, *map(str, args)], stdout=w, stderr=subprocess.PIPE, text=True,
            timeout=300, check=False,
        )  # fmt: skip
    finally:
        os.close(w)


@pytest.mark.parametrize(
    "argv",
    [
        ["checkpoint", "inspect", "{root}", "--json"],
        ["checkpoint", "inspect", "{root}"],
        ["checkpoint", "verify", "{root}"],
        ["checkpoint", "gc", "{root}", "--dry-run"],
        ["sample", "--output", "{root}/sample", "--sequences", "2", "--tokens", "64"],
        ["--help"],
        ["embed", "--help"],
    ],
    ids=lambda a: " ".join(a).replace("{root}", "ROOT"),
)
def test_a_closed_reader_ends_the_output_quietly(tmp_path, argv):
    _store(tmp_path, 3)
    proc = _to_closed_reader(*(a.format(root=tmp_path) for a in argv))
    assert proc.stderr == ""
    assert proc.returncode == 0


def test_verify_keeps_its_verdict_when_the_reader_is_gone(tmp_path):
    store = _store(tmp_path, 3)
    flip_bit(store.commits("seq-0001")[0].data_path, 100)
    proc = _to_closed_reader("checkpoint", "verify", tmp_path)
    assert proc.stderr == ""
    assert proc.returncode == 1  # as with a reader: one bad commit


def test_inspect_json_into_head(tmp_path):
    n = 700  # ~240 bytes a line: about 2.5 pipe buffers
    _store(tmp_path, n)
    full = subprocess.run(
        [LINSTREAM, "checkpoint", "inspect", tmp_path, "--json"],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    assert len(full.stdout) > 2 * 65536, len(full.stdout)
    proc = subprocess.run(
        ["bash", "-c", f'"{LINSTREAM}" checkpoint inspect "{tmp_path}" --json | head -1; '
                       'echo "status ${PIPESTATUS[*]}"'],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    first, status = proc.stdout.splitlines()
    assert first == full.stdout.splitlines()[0]
    assert status == "status 0 0"
    assert proc.stderr == ""
