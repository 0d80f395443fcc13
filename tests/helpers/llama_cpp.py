"""llama.cpp for the benchmarks: built on demand from a pinned source package on PyPI into a
cache outside the clone, and reused.

    llama = ensure_llama_cpp()          # minutes the first time (~15 on 2 cores), then free
    llama.bench, llama.debug            # the built llama-bench and llama-debug
    llama.source                        # vendor/llama.cpp: convert_hf_to_gguf.py, gguf-py/

The source is `llama-cpp-python`'s sdist (`pip download --no-binary :all: --no-deps`), checked
against its SHA-256, whose `vendor/llama.cpp` is the llama.cpp it was released with; cmake is
PyPI's pinned wheel (installed into the cache with `pip install --target`), so that a fresh
machine builds the same way whatever cmake its system has.  The build (Release,
`-DGGML_NATIVE=ON -DLLAMA_CURL=OFF`, static, targets `llama-bench` and `llama-debug`) goes to
`$LINSTREAM_LLAMA_CACHE` (default `~/.cache/linstream/llama.cpp`)`/<version>/`, is marked ready
only once complete (a folder without the mark is wiped and started over), and is locked
(flock) so that concurrent callers wait for one build.  Each step is bounded by what is left of
`$LINSTREAM_LLAMA_BUILD_TIMEOUT` seconds (default 3,600); a failure raises `LlamaCppError` with
one line naming the step, its exit status and its log.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CMAKE_VERSION",
    "LLAMA_CPP_PYTHON_VERSION",
    "LlamaCpp",
    "LlamaCppError",
    "cache_root",
    "ensure_llama_cpp",
]

#: The source package and its SHA-256 (PyPI's sdist of llama-cpp-python 0.3.36, whose vendored
#: llama.cpp is commit 0c1e57098).
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
#: PyPI's cmake wheel the build uses (llama.cpp asks for 3.14...3.28 policies).
CMAKE_VERSION = "3.31.6"
TARGETS = ("llama-bench", "llama-debug")
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
)
READY = "READY.json"
SDIST_TREE = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}"


class LlamaCppError(RuntimeError):
    """llama.cpp could not be fetched, built or run (the message is one line)."""


@dataclass(frozen=True)
class LlamaCpp:
    """A built llama.cpp in the cache."""

    root: Path  # cache/<version>
    info: dict  # READY.json: version, commit, cmake, flags, build seconds, CPU flags

    @property
    def source(self) -> Path:
        """The vendored llama.cpp tree (convert_hf_to_gguf.py, gguf-py/, models/)."""
        return self.root / SDIST_TREE / "vendor" / "llama.cpp"

    @property
    def bench(self) -> Path:
        return self.root / "build" / "bin" / "llama-bench"

    @property
    def debug(self) -> Path:
        return self.root / "build" / "bin" / "llama-debug"

    @property
    def commit(self) -> str:
        return str(self.info.get("commit", "unknown"))


def cache_root() -> Path:
    """`$LINSTREAM_LLAMA_CACHE`, or ~/.cache/linstream/llama.cpp."""
    env = os.environ.get("LINSTREAM_LLAMA_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "linstream" / "llama.cpp"


def _ready(root: Path) -> LlamaCpp | None:
    mark = root / READY
    if not mark.is_file():
        return None
    llama = LlamaCpp(root, json.loads(mark.read_text()))
    if not (llama.bench.is_file() and llama.debug.is_file()):
        return None
    return llama


def ensure_llama_cpp(
    cache: Path | None = None, timeout_s: float | None = None, jobs: int | None = None
) -> LlamaCpp:
    """The built llama.cpp for LLAMA_CPP_PYTHON_VERSION: the cached one, or built now (locked,
    bounded by timeout_s seconds in all, `jobs` parallel compiles, default the CPU count)."""
    cache = cache or cache_root()
    if timeout_s is None:
        timeout_s = float(os.environ.get("LINSTREAM_LLAMA_BUILD_TIMEOUT", "3600"))
    root = cache / LLAMA_CPP_PYTHON_VERSION
    llama = _ready(root)
    if llama is not None:
        return llama
    cache.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    with open(cache / f"{LLAMA_CPP_PYTHON_VERSION}.lock", "w") as lock:
        _lock(lock, deadline, cache)
        llama = _ready(root)  # another process built it while we waited
        if llama is not None:
            return llama
        return _build(cache, root, deadline, jobs or os.cpu_count() or 1)


def _lock(lock, deadline: float, cache: Path) -> None:
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise LlamaCppError(
                    f"llama.cpp {LLAMA_CPP_PYTHON_VERSION}: another build held "
                    f"{cache}/{LLAMA_CPP_PYTHON_VERSION}.lock past the time limit"
                ) from None
            time.sleep(2.0)


def _run(step: str, cmd: list[str], log: Path, deadline: float, **kw) -> None:
    """Run cmd, appending its output to log; one-line LlamaCppError on failure or timeout."""
    left = deadline - time.monotonic()
    name = f"llama.cpp {LLAMA_CPP_PYTHON_VERSION}: {step}"
    if left <= 0:
        raise LlamaCppError(f"{name}: no time left (LINSTREAM_LLAMA_BUILD_TIMEOUT); log {log}")
    with open(log, "a") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        try:
            rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=left, **kw)
        except subprocess.TimeoutExpired:
            raise LlamaCppError(f"{name} timed out after {left:.0f} s; see {log}") from None
        except OSError as e:
            raise LlamaCppError(f"{name} could not start ({e}); see {log}") from None
    if rc.returncode != 0:
        raise LlamaCppError(f"{name} failed (exit {rc.returncode}); see {log}")


def _cmake(cache: Path, log: Path, deadline: float) -> Path:
    """PyPI's cmake CMAKE_VERSION, installed once into cache/cmake-<version>."""
    target = cache / f"cmake-{CMAKE_VERSION}"
    binary = target / "cmake" / "data" / "bin" / "cmake"
    if binary.is_file():
        return binary
    shutil.rmtree(target, ignore_errors=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    _run(
        f"pip install cmake=={CMAKE_VERSION}",
        [
            *pip,
            "install",
            "--no-deps",
            "--only-binary",
            ":all:",
            "--target",
            str(target),
            f"cmake=={CMAKE_VERSION}",
        ],
        log,
        deadline,
    )
    if not binary.is_file():
        raise LlamaCppError(f"cmake=={CMAKE_VERSION} installed without {binary}; see {log}")
    return binary


def _fetch_source(root: Path, log: Path, deadline: float) -> str:
    """Download and check the sdist, extract it whole to root/ (its .git records the vendored
    llama.cpp's commit, which the build stamps into llama-bench's output); the commit."""
    dl = root / "sdist"
    dl.mkdir()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    pkg = f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"
    _run(
        f"pip download {pkg}",
        [*pip, "download", "--no-binary", ":all:", "--no-deps", "-d", str(dl), pkg],
        log,
        deadline,
    )
    tarballs = list(dl.glob("*.tar.gz"))
    if len(tarballs) != 1:
        raise LlamaCppError(f"pip download {pkg} left {len(tarballs)} tarballs in {dl}")
    sha = hashlib.sha256(tarballs[0].read_bytes()).hexdigest()
    if sha != SDIST_SHA256:
        raise LlamaCppError(f"{tarballs[0].name}: SHA-256 {sha}, expected {SDIST_SHA256}")
    with tarfile.open(tarballs[0]) as tar:
        tar.extractall(root, filter="data")
    shutil.rmtree(dl)
    head = root / SDIST_TREE / ".git" / "modules" / "vendor" / "llama.cpp" / "HEAD"
    return head.read_text().strip() if head.is_file() else "unknown"


def _build(cache: Path, root: Path, deadline: float, jobs: int) -> LlamaCpp:
    shutil.rmtree(root, ignore_errors=True)  # a build without its READY mark: start over
    root.mkdir(parents=True)
    log = root / "build.log"
    t0 = time.monotonic()
    print(
        f"building llama.cpp {LLAMA_CPP_PYTHON_VERSION} into {root} (log: {log})",
        file=sys.stderr,
        flush=True,
    )
    commit = _fetch_source(root, log, deadline)
    cmake = _cmake(cache, log, deadline)
    build = root / "build"
    _run(
        "cmake configure",
        [
            str(cmake),
            "-S",
            str(root / SDIST_TREE / "vendor" / "llama.cpp"),
            "-B",
            str(build),
            *CMAKE_FLAGS,
        ],
        log,
        deadline,
    )
    _run(
        f"cmake build {' '.join(TARGETS)}",
        [
            str(cmake),
            "--build",
            str(build),
            "--config",
            "Release",
            "-j",
            str(jobs),
            "--target",
            *TARGETS,
        ],
        log,
        deadline,
    )
    info = {
        "llama_cpp_python": LLAMA_CPP_PYTHON_VERSION,
        "commit": commit,
        "cmake": CMAKE_VERSION,
        "flags": list(CMAKE_FLAGS),
        "build_s": round(time.monotonic() - t0, 1),
        "jobs": jobs,
    }
    (root / READY).write_text(json.dumps(info, indent=1))
    llama = _ready(root)
    if llama is None:
        raise LlamaCppError(
            f"llama.cpp {LLAMA_CPP_PYTHON_VERSION}: built without "
            f"{', '.join(TARGETS)} in {build}/bin; see {log}"
        )
    return llama
