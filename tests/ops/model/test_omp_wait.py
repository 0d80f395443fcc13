"""OpenMP's wait policy (`linstream.ops.omp_wait`): Numba's parallel kernels run on a libgomp that
loaded after linstream asked for passive waiting, whatever was imported first; where they cannot
(Numba's OpenMP layer loaded on PyTorch's copy before linstream came, or the binding not done
under LD_PRELOAD), the process is told once, with what to do.  Each case is a fresh Python
process, as a user's script is, and where Numba's OpenMP calls go is read from the dynamic
linker's own account (LD_DEBUG=bindings)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from linstream.ops import omp_wait

# Imports in the given order ("numba": a parallel kernel of the user's own runs first), then two
# forwards of the built-in model (a line is said at most once a process, when linstream's kernels
# are first imported) through the runtime (`load_model`) or the Python API (`embed`, a Beam job
# in the process), then prints the policy the process ends with.
_SCRIPT = """
import os, sys
import numpy as np
entry, order = sys.argv[1], sys.argv[2:]
for name in order:
    if name == "torch":
        import torch
    elif name == "numba":
        import numba
        @numba.njit(parallel=True)
        def twice(x):
            for i in numba.prange(x.shape[0]):
                x[i] *= 2
        twice(np.ones(64))
    else:
        from linstream.ops import load_model
        from linstream.pipeline import embed
if entry == "runtime":
    model = load_model("builtin:default")
    ids = np.arange(4096) % 200  # long enough for the kernels' parallel versions
    emb, states = model.embed_chunk(ids, model.initial_states())
    emb, states = model.embed_chunk(ids, states)
    shape = emb.shape
else:
    shape = embed(["a first text", "a second, longer one"]).shape
    shape = embed(["a third"] * 3).shape
print("policy", os.environ.get("OMP_WAIT_POLICY"), shape)
"""
_SAID = "OMP_WAIT_POLICY=PASSIVE"
# the linker's line for Numba's OpenMP layer's call into libgomp
_BOUND = re.compile(
    r"binding file \S*omppool\S* \[\d+\] to (\S+) \[\d+\]: normal symbol `GOMP_parallel'"
)


def _run(
    *order: str,
    entry: str = "runtime",
    policy: str | None = None,
    bindings: Path | None = None,
    preload: str | None = None,
) -> subprocess.CompletedProcess[str]:
    drop = ("OMP_WAIT_POLICY", "LD_DEBUG", "LD_PRELOAD")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    if preload is not None:
        env["LD_PRELOAD"] = preload
    if bindings is not None:
        env.update(LD_DEBUG="bindings", LD_DEBUG_OUTPUT=str(bindings))
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, entry, *order],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def _numba_openmp(bindings: Path) -> set[str]:
    """The libgomp(s) Numba's OpenMP layer's GOMP_parallel was bound to, per the linker (its
    files, one per process and ~100 MB with PyTorch loaded, removed once read)."""
    found: set[str] = set()
    for path in bindings.parent.glob(bindings.name + ".*"):
        with open(path, encoding="utf-8", errors="replace") as f:
            found |= {os.path.realpath(m.group(1)) for line in f if (m := _BOUND.search(line))}
        path.unlink()
    return found


def _torch_lib() -> str:
    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin is not None
    return os.path.realpath(Path(spec.origin).parent / "lib")


@pytest.mark.e2e
@pytest.mark.parametrize(("entry", "shape"), [("runtime", "(4096, "), ("embed", "(3, ")])
def test_torch_imported_first_numba_runs_on_its_own_openmp(entry, shape, tmp_path):
    pytest.importorskip("torch")
    proc = _run("torch", "linstream", entry=entry, bindings=tmp_path / "ld")
    bound = _numba_openmp(tmp_path / "ld")
    assert bound, "the linker bound no GOMP_parallel for Numba's OpenMP layer"
    assert not any(p.startswith(_torch_lib()) for p in bound), bound  # not PyTorch's copy
    assert _SAID not in proc.stderr, proc.stderr  # nothing to say: it waits passively
    assert f"policy PASSIVE {shape}" in proc.stdout, proc.stdout


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("order", "preload"),
    [
        (("torch", "numba", "linstream"), None),  # Numba's layer loaded on PyTorch's copy first
        (("torch", "linstream"), "libm.so.6"),  # LD_PRELOAD: not bound, a preload not bypassed
    ],
)
def test_numba_left_on_torchs_openmp_is_told_once_with_the_remedy(order, preload, tmp_path):
    pytest.importorskip("torch")
    proc = _run(*order, bindings=tmp_path / "ld", preload=preload)
    bound = _numba_openmp(tmp_path / "ld")
    assert bound and all(p.startswith(_torch_lib()) for p in bound), bound
    lines = [line for line in proc.stderr.splitlines() if _SAID in line]
    assert len(lines) == 1, proc.stderr
    assert "libgomp.so" in lines[0] and "import linstream first" in lines[0], lines
    assert "policy PASSIVE (4096, " in proc.stdout, proc.stdout


@pytest.mark.parametrize(
    ("order", "policy"),
    [
        (("linstream", "torch"), None),  # linstream first: every libgomp loads after PASSIVE
        (("linstream",), None),  # no torch: Numba's libgomp loads after PASSIVE
        (("torch", "linstream"), "ACTIVE"),  # the user's own policy: kept, nothing said
    ],
)
@pytest.mark.e2e
def test_other_orders_and_a_users_policy_say_nothing(order, policy):
    if "torch" in order:
        pytest.importorskip("torch")
    proc = _run(*order, policy=policy)
    assert _SAID not in proc.stderr, proc.stderr
    assert f"policy {policy or 'PASSIVE'} (4096, " in proc.stdout, proc.stdout


def test_the_libraries_are_found_by_name(tmp_path):
    maps = tmp_path / "maps"
    line = "7f47-7f48 r-xp 0000a000 fe:00 326474                     {}\n"
    torch_copy = "/venv/site-packages/torch/lib/libgomp.so.1"
    system = "/usr/lib/x86_64-linux-gnu/libgomp.so.1.0.0"
    hashed = "/venv/scikit_learn.libs/libgomp-a34b3233.so.1.0.0"  # loaded for its module only
    libc = "7f40-7f41 r--p 00000000 fe:00 1 /usr/lib/libc.so.6\n"
    maps.write_text(libc + "".join(line.format(p) for p in (torch_copy, system, hashed, system)))
    assert omp_wait.loaded_libgomps(str(maps)) == {torch_copy, system}
    assert omp_wait.loaded_libgomps(str(tmp_path / "absent")) == set()
