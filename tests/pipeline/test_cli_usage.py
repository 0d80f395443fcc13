"""Usage errors as a new user meets them: one line, exit status 2, in well under a second of CPU
time (no Beam import before the flags and folders are checked), and nothing created.

Each case runs the installed `linstream` in a fresh folder and asserts on its one stderr line,
its exit status, the CPU time the command took (user + system, from `getrusage` of the waited-for
child: the machine may be busy, CPU time does not count the wait) and the folder's files after.
"""

from __future__ import annotations

import os
import resource
import subprocess
from pathlib import Path

import pytest
from helpers.cli import LINSTREAM, write_texts
from helpers.fla_folders import TINY_CONFIGS, write_folder

pytestmark = pytest.mark.e2e  # whole commands in subprocesses: `make check` leaves it out

#: The bound on a usage error (it took 4-5 s with Beam imported first, 2-3 s of CPU).
CPU_BOUND_S = 1.0
#: A checkpoint folder's model: its loader package imports Numba (about 0.45 s of CPU here, 0.7 s
#: in all alone, up to 1.05 s on the loaded 2-core machine); Beam's import alone is about 1.8 s,
#: so this bound still fails a command that imports Beam before it refuses.
FOLDER_CPU_BOUND_S = 1.5


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _run_timed(argv: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(
        [LINSTREAM, *argv], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return proc, cpu


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    write_texts(tmp_path / "in", {"a.txt": "some text", "b/c.txt": "more text"})
    (tmp_path / "a-file").write_text("not a folder")
    write_folder(tmp_path / "gla", TINY_CONFIGS["gla"], seed=0)  # no tokenizer.json
    results = tmp_path / "done" / "results"
    results.mkdir(parents=True)
    (results / "part-0.parquet").write_bytes(b"PAR1")  # an earlier job's results
    return tmp_path


CASES = [
    (["--output", "o", "--checkpoint-dir", "a-file"], "--checkpoint-dir a-file: expected a folder"),
    (["--output", "a-file"], "--output a-file: expected a folder, found a file"),
    (["--outptu", "o"], "unknown option --outptu; did you mean --output?"),
    (["--output", "o", "--model", "nope.safetensors"], "got 'nope.safetensors', which does not"),
    (["--output", "o", "--chunk-tokens", "1000000000"], "expected at most 1,048,576 tokens"),
    (["--output", "done"], "--output done already holds the results of an earlier job"),
    (["--output", "o", "--resume"], "--resume needs --checkpoint-dir"),
]


@pytest.mark.parametrize(("argv", "expected"), CASES, ids=[c[1][:30] for c in CASES])
def test_a_usage_error_is_one_line_exit_2_fast_and_creates_nothing(folder, argv, expected):
    before = _files(folder)
    proc, cpu = _run_timed(["embed", "--input", "in", *argv], folder)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("linstream embed: error: ") and expected in lines[0], lines[0]
    assert proc.stdout == ""
    print(f"{expected[:40]!r}: {cpu:.2f} s CPU")
    assert cpu <= CPU_BOUND_S, f"{cpu:.2f} s of CPU time for a usage error"
    assert _files(folder) == before


def test_a_checkpoint_folder_without_tokenizer_json_names_the_tokenizer_flag(folder):
    before = _files(folder)
    proc, cpu = _run_timed(["embed", "--input", "in", "--output", "o", "--model", "gla"], folder)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "gla: no tokenizer.json in the folder" in lines[0], lines[0]
    assert "--tokenizer PATH" in lines[0] and "--tokenizer builtin:bytes" in lines[0], lines[0]
    print(f"{cpu:.2f} s CPU")
    assert cpu <= FOLDER_CPU_BOUND_S, f"{cpu:.2f} s of CPU time for a usage error"
    assert _files(folder) == before


def test_a_folder_that_cannot_be_written_is_a_usage_error(folder):
    target = "/sys/linstream-out"  # sysfs: no folder can be made there, not even by root
    try:
        os.mkdir(target)
    except OSError:
        pass
    else:
        os.rmdir(target)
        pytest.skip("/sys takes new folders on this machine")
    proc, cpu = _run_timed(["embed", "--input", "in", "--output", target], folder)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"linstream embed: error: --output {target}: the folder is not")
    assert "[Errno" not in lines[0]
    assert cpu <= CPU_BOUND_S
