"""OpenMP's wait policy: a process that imports PyTorch before linstream is told, once, that
Numba's threads will spin (and what to do); any other order, or a policy the user set, says
nothing.  Each case is a fresh Python process, as a user's script is."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from linstream.ops import omp_wait

pytestmark = pytest.mark.e2e  # whole jobs, subprocesses or servers: `make check` leaves it out

# Imports in the given order, then two forwards of the built-in model (the line is said once a
# process, at its first forward) through the runtime (`load_model`) or the Python API
# (`embed`, a Beam job in the process), then prints the policy the process ends with.
_SCRIPT = """
import os, sys
import numpy as np
entry, order = sys.argv[1], sys.argv[2:]
for name in order:
    if name == "torch":
        import torch
    else:
        from linstream.ops import load_model
        from linstream.pipeline import embed
if entry == "runtime":
    model = load_model("builtin:default")
    ids = np.arange(300) % 200
    emb, states = model.embed_chunk(ids, model.initial_states())
    emb, states = model.embed_chunk(ids, states)
    shape = emb.shape
else:
    shape = embed(["a first text", "a second, longer one"]).shape
    shape = embed(["a third"] * 3).shape
print("policy", os.environ.get("OMP_WAIT_POLICY"), shape)
"""


def _run(
    *order: str, entry: str = "runtime", policy: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, entry, *order],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.mark.parametrize(("entry", "shape"), [("runtime", "(300, "), ("embed", "(3, ")])
def test_torch_imported_first_is_told_once_with_the_remedy(entry, shape):
    pytest.importorskip("torch")
    proc = _run("torch", "linstream", entry=entry)
    lines = [line for line in proc.stderr.splitlines() if "OMP_WAIT_POLICY" in line]
    assert len(lines) == 1, proc.stderr
    assert "libgomp.so" in lines[0] and "import linstream before torch" in lines[0], lines
    assert "Traceback" not in proc.stderr, proc.stderr
    assert f"policy PASSIVE {shape}" in proc.stdout, proc.stdout


@pytest.mark.parametrize(
    ("order", "policy"),
    [
        (("linstream", "torch"), None),  # linstream first: libgomp loads with PASSIVE
        (("linstream",), None),  # no torch: Numba's libgomp loads with PASSIVE
        (("torch", "linstream"), "ACTIVE"),  # the user's own policy: kept, nothing said
    ],
)
def test_other_orders_and_a_users_policy_say_nothing(order, policy):
    if "torch" in order:
        pytest.importorskip("torch")
    proc = _run(*order, policy=policy)
    assert "OMP_WAIT_POLICY" not in proc.stderr, proc.stderr
    assert f"policy {policy or 'PASSIVE'} (300, " in proc.stdout, proc.stdout


def test_the_library_is_found_by_its_shared_name_only(tmp_path):
    maps = tmp_path / "maps"
    line = "7f47-7f48 r-xp 0000a000 fe:00 326474                     {}\n"
    cases = {
        "/venv/site-packages/torch/lib/libgomp.so.1": True,  # PyTorch's copy
        "/usr/lib/x86_64-linux-gnu/libgomp.so.1.0.0": True,  # the system's
        "/venv/scikit_learn.libs/libgomp-a34b3233.so.1.0.0": False,  # renamed: another library
    }
    for path, found in cases.items():
        maps.write_text("7f40-7f41 r--p 00000000 fe:00 1 /usr/lib/libc.so.6\n" + line.format(path))
        assert (omp_wait.loaded_libgomp(str(maps)) == path) is found, path
    assert omp_wait.loaded_libgomp(str(tmp_path / "absent")) is None
