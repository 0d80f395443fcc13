"""The serial and the parallel version of each kernel are separate entries in Numba's on-disk
cache: a process that finds only the serial version cached compiles the parallel one, instead of
loading the serial code under the parallel name (Numba keys its cache by name, line, bytecode and
closure values, not by compile options)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from linstream.ops.additive import numba as nb
from linstream.ops.model import kernels as mk
from linstream.ops.rules import gather

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
    ]
    for serial, parallel in pairs:
        assert serial._cache._cache_file._index_name != parallel._cache._cache_file._index_name
