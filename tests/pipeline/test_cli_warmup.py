"""`linstream warmup` fills the Numba cache that a later `linstream embed` then only reads.

Each command is a process of its own on one NUMBA_CACHE_DIR, as on a worker image: the warm-up at
build time, the job later.  The evidence is Numba's own: with NUMBA_DEBUG_CACHE=1 it prints a
line for every index or compiled kernel it saves and every kernel it loads, and the cache
folder's files (names, sizes, modification times) are compared before and after the job.
"""

from __future__ import annotations

import shutil

import pytest
from helpers.cli import linstream, write_texts

pytestmark = [
    pytest.mark.e2e,  # whole jobs, subprocesses or servers: `make check` leaves it out
    pytest.mark.xdist_group("warmup"),  # one worker: the warmed cache below is made once
]

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


@pytest.mark.parametrize("command", ["warmup", "embed"])
def test_a_model_path_that_does_not_exist_is_one_line_saying_what_was_expected(command, tmp_path):
    missing = str(tmp_path / "no-such-model")
    extra = (
        ["--input", str(tmp_path), "--output", str(tmp_path / "out")] if command == "embed" else []
    )
    proc = linstream(command, "--model", missing, *extra, env={"NUMBA_CACHE_DIR": str(tmp_path)})
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines == [
        f"linstream {command}: error: expected builtin:NAME, a .safetensors model "
        f"file or a checkpoint folder, got {missing!r}, which does not exist"
    ], proc.stderr


def test_a_checkpoint_folder_warmed_up_then_embedded_compiles_nothing(tmp_path):
    """`linstream warmup --model <folder in fla's format>` compiles what a job with that folder
    calls (the built-in model's kernels excepted, which it never calls): the job then compiles
    nothing, writes nothing into the cache and does not say it compiles."""
    from helpers.fla_folders import TINY_CONFIGS, write_folder
    from linstream.pipeline.io.tokenizers import byte_tokenizer

    folder = write_folder(tmp_path / "gla", {**TINY_CONFIGS["gla"], "vocab_size": 256})
    byte_tokenizer().save(str(folder / "tokenizer.json"))
    cache = tmp_path / "cache"
    proc = linstream("warmup", "--model", folder, env={"NUMBA_CACHE_DIR": str(cache)}, timeout=900)
    assert proc.returncode == 0, proc.stderr
    assert f"warm: model {folder}, state float64: " in proc.stdout, proc.stdout
    before = _files(cache)
    assert before
    _inputs(tmp_path / "in")
    proc = linstream(
        "embed", "--input", "in", "--output", "out", "--model", folder,
        "--backend", "numba", "--chunk-tokens", "8192",
        cwd=tmp_path,
        env={"NUMBA_CACHE_DIR": str(cache), "NUMBA_DEBUG_CACHE": "1"},
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert list((tmp_path / "out" / "results").glob("*.parquet"))
    saved = [ln for ln in proc.stdout.splitlines() if ln.startswith("[cache]") and "saved" in ln]
    assert saved == [], saved
    assert any(ln.startswith("[cache] data loaded") for ln in proc.stdout.splitlines())
    assert _COMPILING not in proc.stderr, proc.stderr
    assert _files(cache) == before


def test_warmup_refuses_a_folder_it_cannot_load_in_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    proc = linstream(
        "warmup", "--model", tmp_path / "empty", env={"NUMBA_CACHE_DIR": str(tmp_path / "c")}
    )
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines == [lines[0]] and lines[0].startswith("linstream warmup: error: "), proc.stderr
    assert "no config.json" in lines[0] and "Traceback" not in proc.stderr
