"""`linstream warmup` fills the Numba cache that a later `linstream embed` then only reads.

Each command is a process of its own on one NUMBA_CACHE_DIR, as on a worker image: the warm-up at
build time, the job later.  The evidence is Numba's own: with NUMBA_DEBUG_CACHE=1 it prints a
line for every index or compiled kernel it saves and every kernel it loads, and the cache
folder's files (names, sizes, modification times) are compared before and after the job.
"""

from __future__ import annotations

import shutil

import pytest
from _cli_helpers import linstream, write_texts

_COMPILING = "compiling the Numba kernels for this machine"


# The built-in model: wide enough that a job's long chunks run every kernel's parallel version
MODEL = "builtin:default"


@pytest.fixture(scope="module")
def warmed(tmp_path_factory):
    """A cache folder that `linstream warmup --model builtin:default` filled, and its stdout."""
    cache = tmp_path_factory.mktemp("warmed") / "cache"
    proc = linstream("warmup", "--model", MODEL, env={"NUMBA_CACHE_DIR": str(cache)}, timeout=900)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return cache, proc.stdout


def _files(folder):
    return sorted(
        (str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns)
        for p in folder.rglob("*")
        if p.is_file()
    )


def _inputs(root):
    # a short file (a short chunk: the kernels' serial versions) and one of 8,192 bytes sent as
    # one chunk (the byte-level tokenizer: 8,192 tokens, the stage's largest block, enough work
    # for every kernel's parallel version, in halves split across the model's row threads)
    return write_texts(root, {"a.txt": "warm start", "b.txt": "x" * 8192})


def test_warmup_compiles_into_an_empty_cache_and_reports_it(warmed):
    cache, out = warmed
    lines = [ln for ln in out.splitlines() if ln.startswith("warm: ")]
    assert len(lines) == 1 and MODEL in lines[0], out
    assert "function(s) compiled" in lines[0], out  # the folder was empty
    assert f"kernels cached in {cache}" in out
    assert any(cache.rglob("*.nbi")) and any(cache.rglob("*.nbc"))


def test_a_job_after_the_warmup_compiles_nothing(warmed, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(warmed[0], cache)
    before = _files(cache)
    _inputs(tmp_path / "in")
    proc = linstream(
        "embed", "--input", "in", "--output", "out", "--model", MODEL,
        "--backend", "numba", "--chunk-tokens", "8192",
        cwd=tmp_path,
        env={"NUMBA_CACHE_DIR": str(cache), "NUMBA_DEBUG_CACHE": "1"},
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert list((tmp_path / "out" / "results").glob("*.parquet"))
    saved = [ln for ln in proc.stdout.splitlines() if ln.startswith("[cache]") and "saved" in ln]
    loaded = [ln for ln in proc.stdout.splitlines() if ln.startswith("[cache] data loaded")]
    assert saved == [], saved  # nothing compiled, so nothing written
    assert loaded, proc.stdout  # and the kernels did come from this folder
    assert _COMPILING not in proc.stderr
    assert _files(cache) == before


def test_a_second_warmup_finds_everything_in_the_cache(warmed, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(warmed[0], cache)
    before = _files(cache)
    proc = linstream("warmup", "--model", MODEL, env={"NUMBA_CACHE_DIR": str(cache)})
    assert proc.returncode == 0, proc.stderr
    assert f"warm: model {MODEL}, state float64: all from the cache" in proc.stdout
    assert _files(cache) == before


def test_a_cache_from_another_cpu_is_said_once_and_is_no_error(warmed, tmp_path):
    """NUMBA_CPU_NAME=generic makes the job's process compile for another CPU than the one the
    cache was filled for: none of its entries fit, as on a worker of another CPU model."""
    cache = tmp_path / "cache"
    shutil.copytree(warmed[0], cache)
    write_texts(tmp_path / "in", {"a.txt": "warm start", "b.txt": "another cpu"})
    proc = linstream(
        "embed", "--input", "in", "--output", "out", "--model", MODEL,
        "--backend", "numba",
        cwd=tmp_path,
        env={"NUMBA_CACHE_DIR": str(cache), "NUMBA_CPU_NAME": "generic"},
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.count(_COMPILING) == 1, proc.stderr
    assert list((tmp_path / "out" / "results").glob("*.parquet"))


def test_warmup_refuses_an_unknown_model_in_one_line(tmp_path):
    proc = linstream("warmup", "--model", "builtin:nope", env={"NUMBA_CACHE_DIR": str(tmp_path)})
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines == [lines[0]] and lines[0].startswith("linstream warmup: error: "), proc.stderr
    assert "nope" in lines[0] and "Traceback" not in proc.stderr
