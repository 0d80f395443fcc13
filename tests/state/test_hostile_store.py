"""A checkpoint store is untrusted input: every hostile file is a named error, never a crash,
a hang, an allocation it claims, or a read, write or delete outside the root."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys

import pytest
from helpers.store_faults import (
    HOSTILE_CASES,
    compressed_state_file,
    make_hostile_commit,
    random_state,
)
from linstream.state import CheckpointError, CheckpointStore, CorruptCheckpointError
from linstream.state import errors as state_errors
from linstream.state.codec import decode_state

pytestmark = pytest.mark.e2e  # whole jobs, subprocesses or servers: `make check` leaves it out

CASES = sorted(HOSTILE_CASES)


@pytest.fixture(autouse=True)
def _no_hang():
    """A reader that blocked on a FIFO fails the test after 60 s instead of hanging the run."""

    def expired(*_: object) -> None:
        raise TimeoutError("blocked for 60 s (a FIFO opened for reading?)")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _snapshot(folder: str) -> dict[str, tuple[int, float]]:
    out = {}
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            out[path] = (st.st_size, st.st_mtime)
    return out


@pytest.mark.parametrize("case", CASES)
def test_each_hostile_commit_is_a_named_error_at_restore_and_in_verify(tmp_path, case):
    root, outside = str(tmp_path / "root"), str(tmp_path / "outside")
    os.makedirs(outside)
    st = random_state(0, seq_id="seq")
    paths = make_hostile_commit(root, st, case, outside)
    before = _snapshot(outside)
    store = CheckpointStore(root, background_prune=False)
    error = getattr(state_errors, HOSTILE_CASES[case])
    with pytest.raises(error) as info:
        store.restore("seq", fingerprint=st.fingerprint)
    assert isinstance(info.value, CheckpointError)
    assert info.value.path in paths, info.value
    problems = store.verify()
    assert [(p.path, p.error) for p in problems] == [(paths[0], HOSTILE_CASES[case])]
    # A later commit and a gc neither follow a link out of the root nor hang on a FIFO.
    nxt = dataclasses.replace(st, position=st.position + 5, next_chunk=st.next_chunk + 1)
    try:
        store.commit(nxt)
        refused = None
    except CheckpointError as ex:  # a named refusal (over an unreadable head) is allowed
        refused = ex
    if case == "linked_folder":
        assert isinstance(refused, state_errors.UnsafePathError), refused
    store.gc(grace_seconds=0)
    store.close()
    assert _snapshot(outside) == before, "nothing outside the root may be written or deleted"


def test_a_linked_folder_is_never_written_into(tmp_path):
    root, outside = str(tmp_path / "root"), str(tmp_path / "outside")
    os.makedirs(outside)
    st = random_state(0, seq_id="seq")
    make_hostile_commit(root, st, "linked_folder", outside)
    before = _snapshot(outside)
    store = CheckpointStore(root, background_prune=False)
    with pytest.raises(state_errors.UnsafePathError, match="symbolic link"):
        store.commit(dataclasses.replace(st, position=99, next_chunk=9))
    assert _snapshot(outside) == before


@pytest.mark.parametrize("depth_or_digits", ["deep", "digits"])
def test_manifest_limits_name_the_limit(tmp_path, depth_or_digits):
    root = str(tmp_path / "root")
    case = "deep_manifest" if depth_or_digits == "deep" else "huge_int_manifest"
    make_hostile_commit(root, random_state(0), case, str(tmp_path))
    with pytest.raises(CorruptCheckpointError) as info:
        CheckpointStore(root).restore("seq", fingerprint="f" * 64)
    words = "nested deeper than" if depth_or_digits == "deep" else "a number of 5000 characters"
    assert words in str(info.value)


def test_compressed_state_is_refused_before_it_is_decompressed(tmp_path):
    """A few KB claiming 32 MiB: refused by the codec and by restore, and Arrow's memory pool
    never grows (checked in a fresh process, whose pool peak starts at zero)."""
    root = str(tmp_path / "root")
    paths = make_hostile_commit(root, random_state(0), "compressed_bomb", str(tmp_path))
    size = os.path.getsize(paths[0])
    assert size < 64 * 1024, size
    with open(paths[0], "rb") as f:
        data = f.read()
    with pytest.raises(state_errors.StateBoundsError, match="compressed"):
        decode_state(data)
    code = (
        "import pyarrow as pa\n"
        "from linstream.state import CheckpointStore, CheckpointError\n"
        "try:\n"
        f"    CheckpointStore({root!r}).restore('seq', fingerprint='f' * 64)\n"
        "except CheckpointError as ex:\n"
        "    print(type(ex).__name__)\n"
        "print(pa.default_memory_pool().max_memory())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout.split()
    assert out[0] == "StateBoundsError"
    assert int(out[1]) < 1 << 20, f"Arrow allocated {int(out[1])} bytes for a refused file"


def test_an_uncompressed_state_still_decodes_after_the_bound_check():
    st = random_state(3, shape=(1, 2, 5, 3), dtype="float32")
    from linstream.state import encode_state

    assert decode_state(encode_state(st)) == st
    with pytest.raises(state_errors.StateBoundsError):
        decode_state(compressed_state_file(encode_state(st), "lz4"))


def test_restore_checks_the_model_state_shape(tmp_path):
    store = CheckpointStore(str(tmp_path), background_prune=False)
    st = random_state(0, shape=(3, 2, 3, 4), seq_id="seq")
    store.commit(st)
    with pytest.raises(state_errors.ShapeMismatchError, match=r"layers 3 \(model 2\)"):
        store.restore("seq", fingerprint=st.fingerprint, expected_shape=(2, 2, 3, 4))
    with pytest.raises(state_errors.ShapeMismatchError, match=r"d_v 4 \(model 8\)"):
        store.read_commit("seq", st.position, expected_shape=(3, 2, 3, 8))
    # With a fallback and no older commit, the error is still the shape's.
    with pytest.raises(state_errors.ShapeMismatchError):
        store.restore("seq", fingerprint=st.fingerprint, fallback=True, expected_shape=(1, 1, 1, 1))
    assert store.restore("seq", fingerprint=st.fingerprint, expected_shape=(3, 2, 3, 4)) == st


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "linstream.pipeline.app.checkpoint_cli", "checkpoint", *args],
        capture_output=True,
        text=True,
        timeout=120,  # a FIFO that blocked a reader would hit this
    )


def test_verify_and_inspect_name_every_hostile_file_in_one_line_each(tmp_path):
    root, outside = str(tmp_path / "root"), str(tmp_path / "outside")
    os.makedirs(outside)
    expected = {}
    for i, case in enumerate(CASES):
        st = random_state(i, seq_id=f"s-{case}")
        expected[case] = make_hostile_commit(root, st, case, os.path.join(outside, case))[0]
    CheckpointStore(root).commit(random_state(99, seq_id="good"))
    verify = _cli("verify", root)
    assert verify.returncode == 1, verify
    assert "Traceback" not in verify.stdout + verify.stderr
    bad = [line for line in verify.stdout.splitlines() if line.startswith("BAD ")]
    assert len(bad) == len(CASES), verify.stdout
    for case, path in expected.items():
        assert any(line.startswith(f"BAD {path}: {HOSTILE_CASES[case]}: ") for line in bad), (
            case,
            verify.stdout,
        )
    inspect = _cli("inspect", root)
    assert inspect.returncode == 1, inspect
    assert "Traceback" not in inspect.stdout + inspect.stderr
    rows = {line.split()[0]: line.split() for line in inspect.stdout.splitlines()[1:]}
    assert rows["good"][1:3] == ["7", "1"]
    for case, path in expected.items():
        assert rows[f"s-{case}"][1] == "?", inspect.stdout
        assert f"BAD {path}: {HOSTILE_CASES[case]}: " in inspect.stderr, (case, inspect.stderr)
