"""Row ranges on helper threads: a partition, errors raised in the caller, no wait on a busy
helper, and the model's embeddings the same on any thread layout and from many callers."""

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from linstream.ops import load_model
from linstream.ops.model import blas as mb
from linstream.ops.model.threads import MIN_ROWS, row_split


@pytest.mark.parametrize("threads", [2, 3, 5])
@pytest.mark.parametrize("t", [1, MIN_ROWS, 2 * MIN_ROWS, 2 * MIN_ROWS + 1, 5000])
def test_ranges_partition_the_rows(threads, t):
    seen = np.zeros(t, int)
    lock = threading.Lock()

    def fn(rows):
        with lock:
            seen[rows] += 1

    row_split(threads)(fn, t)
    np.testing.assert_array_equal(seen, 1)


def test_one_thread_has_no_split():
    assert row_split(1) is None


def test_an_error_in_any_range_reaches_the_caller():
    def fn(rows):
        if rows.start > 0:
            msg = f"bad rows {rows.start}"
            raise ValueError(msg)

    with pytest.raises(ValueError, match="bad rows"):
        row_split(2)(fn, 2 * MIN_ROWS)


def test_the_caller_runs_what_a_busy_helper_cannot_take():
    """With the only helper held by another caller's range, a split still finishes, every
    range on the calling thread, while the helper is still held."""
    split = row_split(2)
    release, started = threading.Event(), threading.Event()

    def hold(rows):
        if threading.current_thread() is not threading.main_thread():
            started.set()
            release.wait()

    # The helper is let go after 30 s whatever happens: a split that waits for it returns only
    # then, and finds `release` set.
    watchdog = threading.Timer(30, release.set)
    watchdog.start()
    first = threading.Thread(target=lambda: split(hold, 2 * MIN_ROWS))
    first.start()  # its caller thread is not the main thread: both its ranges hold
    assert started.wait(30)
    ran_on = []
    split(lambda rows: ran_on.append(threading.current_thread()), 2 * MIN_ROWS)
    held = not release.is_set()
    release.set()
    watchdog.cancel()
    first.join(30)
    assert held, "the split waited for the busy helper"
    assert ran_on == [threading.main_thread()] * 2


@pytest.fixture(scope="module")
def model():
    return load_model("builtin:default")


def test_embeddings_do_not_depend_on_the_thread_layout(model, monkeypatch):
    x = np.random.default_rng(5).integers(0, 4096, 4 * MIN_ROWS + 3)
    whole = {}
    for threads in (1, 2, 4):
        monkeypatch.setattr(mb._single_threaded_blas, "_threads", threads)
        whole[threads] = model.embed_chunk(x, None, backend="numba")
    # Row ranges change the products' shapes, and BLAS may round a product of other shapes
    # differently: each layout is within the float32 runtime's 2e-5 per token of the exact
    # model (tests/ops/model/test_model_torch.py), so two layouts are within twice that.
    for threads in (2, 4):
        e, ref = whole[threads][0], whole[1][0]
        err = np.linalg.norm(e - ref, axis=1) / np.linalg.norm(ref, axis=1)
        assert err.max() <= 4e-5, (threads, float(err.max()))
        for a, b in zip(whole[threads][1], whole[1][1], strict=True):
            np.testing.assert_allclose(a.S, b.S, rtol=4e-5, atol=4e-5 * np.abs(b.S).max())


def test_many_callers_share_the_helpers(model, monkeypatch):
    monkeypatch.setattr(mb._single_threaded_blas, "_threads", 2)
    rng = np.random.default_rng(6)
    seqs = [rng.integers(0, 4096, int(rng.integers(1, 4 * MIN_ROWS))) for _ in range(12)]
    alone = [model.embed_chunk(s, None)[0] for s in seqs]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda s: model.embed_chunk(s, None)[0], seqs))
    for a, b in zip(alone, together, strict=True):  # the same ranges, whichever thread ran them
        np.testing.assert_array_equal(a, b)
