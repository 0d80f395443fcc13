"""Numba's on-disk cache serves every kernel to the next process.

A second process on the same cache folder compiles nothing and adds no file (the additive
kernel once captured jitted helpers in its closure: Numba keys a closure's entry by the pickled
closure values, which differ in every process, so each process compiled it again and added one
more entry).  The serial and the parallel version of each kernel are separate entries: a process
that finds only the serial version cached compiles the parallel one, instead of loading the serial
code under the parallel name (Numba keys its cache by name, line, bytecode and closure values,
not by compile options)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from linstream.ops.additive import numba as nb
from linstream.ops.dplr import numba as dplr
from linstream.ops.model import kernels as mk
from linstream.ops.model.fla import fused
from linstream.ops.model.fla import rwkv7_passes as rwkv7
from linstream.ops.rules import gather

pytestmark = pytest.mark.e2e  # whole jobs, subprocesses or servers: `make check` leaves it out

# Runs one version of the model's bias + activation pass and of the rules' gather, and prints
# what the dispatchers loaded from the cache.
_SCRIPT = """
import json, sys
import numpy as np
from linstream.ops.model import kernels as mk
from linstream.ops.rules import gather
parallel = sys.argv[1] == "parallel"
u = np.linspace(-3, 3, 6, dtype=np.float32).reshape(2, 3)
mk._BIAS_ACT[parallel](u, np.zeros(3, np.float32), 1)
x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 2, 3)
out = np.empty((2, 4, 3), np.float32)
gather._heads_kernels[parallel](x, 2, False, False, out)
stats = {
    name: (sum(d.stats.cache_hits.values()), sum(d.stats.cache_misses.values()))
    for name, d in (("activation", mk._BIAS_ACT[parallel]),
                    ("gather", gather._heads_kernels[parallel]))
}
print(json.dumps(stats))
"""


def _run(version, cache_dir):
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, version],
        env={**os.environ, "NUMBA_CACHE_DIR": str(cache_dir)},
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


_WORKLOAD = Path(__file__).parents[1] / "helpers" / "numba_workload.py"
# every module with jitted kernels, and the versions the workload must have compiled in it
_KERNEL_MODULES = {
    "linstream.ops.additive.numba": ("serial", "parallel"),
    "linstream.ops.decay.numba": (),
    "linstream.ops.decay.vector_numba": (),
    "linstream.ops.delta.numba": (),
    "linstream.ops.dplr.numba": ("serial", "parallel"),
    "linstream.ops.rules.gather": ("serial", "parallel"),
    "linstream.ops.model.kernels": ("serial", "parallel"),
    "linstream.ops.model.fla.fused": ("serial", "parallel"),
    "linstream.ops.model.fla.rwkv7_passes": ("serial", "parallel"),
    "linstream.ops.additive.naive_numba": (),
}


def _workload(cache_dir):
    proc = subprocess.run(
        [sys.executable, str(_WORKLOAD)],
        env={
            **os.environ,
            "NUMBA_CACHE_DIR": str(cache_dir),
            "PYTHONPATH": str(_WORKLOAD.parents[1]),
        },
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _files(folder):
    return sorted(
        (str(p.relative_to(folder)), p.stat().st_size) for p in folder.rglob("*") if p.is_file()
    )


def test_a_second_process_compiles_nothing_and_adds_no_file(tmp_path):
    first = _workload(tmp_path)
    print("first process compiled:", first)
    # the cache was empty: the first process compiled every kernel, both versions of each
    for module, versions in _KERNEL_MODULES.items():
        names = [c for c in first["compiled"] if c.startswith(module + ":")]
        assert names, f"nothing of {module} compiled in an empty cache"
        for version in versions:
            assert any(n.endswith("." + version) for n in names), (module, version, names)
    files = _files(tmp_path)
    second = _workload(tmp_path)
    assert second["compiled"] == [], "a second process on the same cache compiled"
    third = _workload(tmp_path)
    assert third["compiled"] == []
    assert _files(tmp_path) == files, "the cache folder changed after the first process"


def test_serial_cache_is_not_loaded_as_the_parallel_kernel(tmp_path):
    first = _run("serial", tmp_path)
    assert first == {"activation": [0, 1], "gather": [0, 1]}  # compiled, cache was empty
    second = _run("parallel", tmp_path)
    assert second == {"activation": [0, 1], "gather": [0, 1]}  # compiled its own
    third = _run("parallel", tmp_path)
    assert third == {"activation": [1, 0], "gather": [1, 0]}  # and the cache still serves it


def test_every_kernel_pair_has_its_own_cache_files():
    """Without compiling: each (d_k, d_v) pair's serial and parallel kernels, and the other
    kernels' pairs (the rules' gather, the model's fused passes), are cached under different
    names."""
    pairs = [
        (nb._causal_kernel(16, 7, False), nb._causal_kernel(16, 7, True)),
        (gather._heads_kernels[False], gather._heads_kernels[True]),
        (mk._NORM[False], mk._NORM[True]),
        (mk._ADD_NORM[False], mk._ADD_NORM[True]),
        (mk._BIAS_ACT[False], mk._BIAS_ACT[True]),
        (fused._SWIGLU[False], fused._SWIGLU[True]),
        (fused._SILU[False], fused._SILU[True]),
        (dplr._KERNEL[False], dplr._KERNEL[True]),
        *((k[False], k[True]) for k in (rwkv7._SHIFT_MIX, rwkv7._KEYS, rwkv7._GROUP_NORM_OUT)),
        *((k[False], k[True]) for k in (rwkv7._LAYER_NORM, rwkv7._DECAY, rwkv7._SQRELU)),
        (rwkv7._V_RESIDUAL[False], rwkv7._V_RESIDUAL[True]),
    ]
    for serial, parallel in pairs:
        assert serial._cache._cache_file._index_name != parallel._cache._cache_file._index_name
