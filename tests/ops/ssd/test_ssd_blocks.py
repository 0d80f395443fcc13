"""The SSD kernel's head blocks (`linstream.ops.ssd.numba`: a group's heads go to the threads in
blocks of BLOCK_COLUMNS // P heads, the state's products one per chunk and block): groups of
several blocks, the last one shorter, against transformers' own scan within the derived tolerance
of tests/helpers/ssd_cases.py (nothing added: a block changes which columns one product call
holds, not the terms or the order of any output's sum, and the decay of the state's part is
applied to its product's row instead of to C's row, one rounding either way); and the bits of a
call are the same on the calling thread alone and on Numba's threads (the blocks are fixed by the
shapes, never by the thread count).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", reason="transformers is a test extra (make test installs it)")

from helpers.ssd_cases import case, streamed, tolerances, worst  # noqa: E402
from linstream.ops.numba_tools import only_version  # noqa: E402
from linstream.ops.ssd import numba as ssd_numba  # noqa: E402

INF = (0.0, float("inf"))


@pytest.mark.parametrize("columns", [8, 24])  # P = 8: blocks of 1 and of 3 heads (5 a group)
@pytest.mark.parametrize(
    "dtypes", [(np.float32, np.float32), (np.float64, np.float64)], ids=["f32", "f64"]
)
def test_groups_of_several_blocks_equal_transformers_scan(monkeypatch, columns, dtypes):
    cdt, sdt = dtypes
    monkeypatch.setattr(ssd_numba, "BLOCK_COLUMNS", columns)
    rng = np.random.default_rng(41)
    g, hpg, p, n = 2, 5, 8, 16
    blocks = ssd_numba._head_blocks(g, g * hpg, p)
    per = columns // p
    assert blocks.shape[0] == g * -(-hpg // per)  # several blocks a group, the last shorter
    kw = case(rng, 90, g, hpg, p, n)
    ref = tolerances(kw, INF, cdt, sdt)
    y, s = streamed(kw, INF, [0, 37, 90], cdt, sdt, 16)
    err, err_s = worst(y, ref["y64"]), worst(s, ref["s64"])
    print(f"blocks {blocks.tolist()}: error {err:.3g} (tol {ref['tol']:.3g}), state {err_s:.3g}")
    assert err <= ref["tol"] and err_s <= ref["tol_s"]


def test_the_bits_do_not_depend_on_the_threads():
    """A call large enough for Numba's threads (24 heads of 64: 6 blocks) run by its parallel
    and by its serial version gives the same bits."""
    rng = np.random.default_rng(5)
    kw = {k: np.asarray(v, np.float32) for k, v in case(rng, 200, 1, 24, 64, 32).items()}
    threadpoolctl = pytest.importorskip("threadpoolctl")
    threadpool_limits = threadpoolctl.threadpool_limits
    runs = []
    for parallel in (True, False):
        state = np.zeros((24, 64, 32), np.float32)
        with only_version(parallel), threadpool_limits(1, user_api="blas"):  # as in the model
            y = ssd_numba.ssd_chunks(
                kw["x"], kw["dt"], kw["a"], kw["b"], kw["c"], kw["d"], state,
                dt_bias=kw["dt_bias"], chunk_size=64,
            )  # fmt: skip
        runs.append((y, state))
    assert np.abs(runs[0][1]).max() > 0
    assert np.array_equal(runs[0][0], runs[1][0]) and np.array_equal(runs[0][1], runs[1][1])
