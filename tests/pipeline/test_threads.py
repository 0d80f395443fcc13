"""`linstream embed --threads N` bounds the threads the kernels (Numba) and BLAS use, as
llama.cpp's `-t` and PyTorch's `set_num_threads` do; without it every core is used, as before.

The job says, with `-v`, what the libraries themselves report after the bound (Numba's
`get_num_threads`, threadpoolctl's BLAS count): the line is read back from them, not echoed from
the flag."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers.cli import linstream, write_texts

pytestmark = pytest.mark.e2e  # whole jobs in subprocesses: `make check` leaves it out


def _threads_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if "for the kernels (Numba)" in ln]
    assert len(lines) == 1, stderr
    return lines[0]


def test_threads_bounds_the_kernels_and_blas(tmp_path, tiny_model_path):
    write_texts(tmp_path / "in", {"a.txt": "some text " * 200})
    common = ["embed", "--input", "in", "--model", tiny_model_path, "--backend", "numba", "-v"]
    one = linstream(*common, "--output", "o1", "--threads", "1", cwd=tmp_path)
    assert one.returncode == 0, one.stderr
    assert _threads_line(one.stderr).endswith("threads: 1 for the kernels (Numba), 1 for BLAS")
    cores = os.cpu_count() or 1
    if cores > 1:  # the default stays what it was: every core
        every = linstream(*common, "--output", "o2", cwd=tmp_path)
        assert every.returncode == 0, every.stderr
        assert "threads: 1 for the kernels" not in _threads_line(every.stderr)
    bad = linstream(*common, "--output", "o3", "--threads", "0", cwd=tmp_path)
    assert bad.returncode == 2 and "--threads" in bad.stderr and "whole number >= 1" in bad.stderr


_PROBE = """
import numpy  # BLAS is loaded before the bound: it is bounded where it runs
from linstream.ops.model.thread_limit import limit_threads, thread_counts
limit_threads(1)
from linstream.ops import load_model
from linstream.ops.model.blas import _single_threaded_blas
load_model("builtin:default")
print(*thread_counts(), _single_threaded_blas.threads())
"""


def test_limit_threads_holds_for_numba_blas_and_the_row_split_in_a_fresh_process():
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "1", "1"], proc.stdout


_PROBE_API = """
import numpy as np
from linstream.pipeline import embed
from linstream.ops.model.blas import _single_threaded_blas
from linstream.ops.model.thread_limit import thread_counts
text = ["some text " * 300]
every = embed(text, backend="numba")  # the default: as the process found them
before = _single_threaded_blas.threads()
one = embed(text, backend="numba", threads=1)
print(before, *thread_counts(), _single_threaded_blas.threads(), int(np.array_equal(every, one)))
"""


def test_embeds_threads_bounds_this_process_from_that_call_on():
    """`embed(..., threads=1)` after a call without it: the kernels, BLAS and the row split are
    at one thread from then on, and the numbers do not change (the row ranges are fixed by a
    chunk's length)."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE_API], capture_output=True, text=True, env=env, check=False
    )
    assert proc.returncode == 0, proc.stderr
    before, numba_threads, blas, split, same = proc.stdout.split()
    if (os.cpu_count() or 1) > 1:
        assert int(before) > 1, proc.stdout  # else a bound of one would show nothing
    assert (numba_threads, blas, split, same) == ("1", "1", "1", "1"), proc.stdout
