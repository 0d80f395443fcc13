"""`linstream demo` as a new user reads it: every number it prints says what it counts.

The header's chunks are the chunks the uninterrupted job counts (and its rows, those chunks plus
the rows sent twice, which the jobs count as duplicates); the counters of a job line are
explained; part 1 says which chunks it held; and the kernels are compiled before the jobs, so
that no job's tokens/s includes compiling (no job says it compiles)."""

from __future__ import annotations

import re

import pytest
from helpers.cli import linstream

pytestmark = pytest.mark.e2e  # whole jobs in a subprocess: `make check` leaves it out


def test_the_demos_lines_say_what_their_numbers_count(tmp_path, tiny_model_path):
    argv = ["demo", "--sequences", "3", "--tokens", "2048", "--chunk-tokens", "256"]
    argv += ["--model", tiny_model_path, "--backend", "numba", "--workdir", str(tmp_path / "w")]
    proc = linstream(*argv, env={"NUMBA_CACHE_DIR": str(tmp_path / "numba-cache")})  # cold
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    head = re.search(
        r"(\d+) chunks, written as (\d+) rows \(shuffled, (\d+) of them twice\)", lines[0]
    )
    assert head, lines[0]
    chunks, rows, twice = (int(g) for g in head.groups())
    assert chunks == 3 * 8 and rows == chunks + twice
    full = next(ln for ln in lines if ln.strip().startswith("uninterrupted"))
    assert f" {chunks} chunks," in full and f"duplicates {twice}," in full, full
    assert any(
        "duplicates: rows sent twice" in ln and "gaps: times a sequence" in ln for ln in lines
    )
    assert any(
        re.search(r"part 1: each sequence's first \d+ to \d+ of its 8 chunks", ln) for ln in lines
    )
    ready = next(i for i, ln in enumerate(lines) if ln.strip().startswith("kernels ready ("))
    part1 = next(i for i, ln in enumerate(lines) if ln.strip().startswith("part1 "))
    assert ready < part1 and "function(s) compiled" in lines[ready], lines[ready]
    assert not any("compiling the Numba kernels" in ln for ln in lines[part1:]), proc.stdout
    assert lines[-1].startswith("resume check passed"), lines[-1]
