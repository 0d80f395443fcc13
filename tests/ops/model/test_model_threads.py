"""Row ranges on helper threads: fixed by the chunk's length alone, a partition, errors raised in
the caller, no wait on a busy helper, and the model's embeddings the same bits on any thread
count and from many callers."""

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from linstream.ops import load_model
from linstream.ops.model import blas as mb
from linstream.ops.model.threads import MIN_ROWS, RANGE_ROWS, row_ranges, row_split
from threadpoolctl import threadpool_limits

LENGTHS = [1, MIN_ROWS, 2 * MIN_ROWS, 2 * MIN_ROWS + 1, 4 * RANGE_ROWS - 1, 4 * RANGE_ROWS, 20000]


@pytest.mark.parametrize("threads", [1, 2, 3, 5])
@pytest.mark.parametrize("t", LENGTHS)
def test_ranges_partition_the_rows_the_same_on_any_thread_count(threads, t):
    """Every row once, in the ranges of row_ranges(t) whatever the thread count: the ranges (and
    so the products' shapes and their rounding) depend on the chunk's length alone."""
    seen = np.zeros(t, int)
    ran = []
    lock = threading.Lock()

    def fn(rows):
        with lock:
            seen[rows] += 1
            ran.append((rows.start, rows.stop))

    row_split(threads)(fn, t)
    np.testing.assert_array_equal(seen, 1)
    assert sorted(ran) == [(r.start, r.stop) for r in row_ranges(t)]


def test_range_counts():
    """One range for short chunks, two up to 2 × RANGE_ROWS rows, then powers of two of at least
    RANGE_ROWS rows (ranges differ by one row at most)."""
    counts = {t: len(row_ranges(t)) for t in LENGTHS}
    assert counts == {
        1: 1, MIN_ROWS: 1, 2 * MIN_ROWS: 2, 2 * MIN_ROWS + 1: 2, 4 * RANGE_ROWS - 1: 2,
        4 * RANGE_ROWS: 4, 20000: 16,
    }  # fmt: skip
    for t in LENGTHS:
        sizes = {r.stop - r.start for r in row_ranges(t)}
        assert max(sizes) - min(sizes) <= 1


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


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("n", [1, 2, 7])
def test_each_runs_every_call_once_and_raises_the_first_error(threads, n):
    ran = []
    lock = threading.Lock()

    def call(i):
        with lock:
            ran.append(i)

    split = row_split(threads)
    split.each([lambda i=i: call(i) for i in range(n)])
    assert sorted(ran) == list(range(n))

    def bad():
        raise ValueError("bad call")

    with pytest.raises(ValueError, match="bad call"):
        split.each([bad] + [lambda: None] * (n - 1))


@pytest.fixture(scope="module")
def model():
    return load_model("builtin:default")


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_embeddings_are_the_same_bits_on_any_thread_count(model, monkeypatch, backend):
    """BLAS rounds a product over a range of rows differently from the same rows of a product
    over all of them (and its own threads differently again), so the rows of a chunk run in
    ranges fixed by its length on any thread count: the bits never depend on it."""
    x = np.random.default_rng(5).integers(0, 4096, 4 * MIN_ROWS + 3)
    whole = {}
    for threads in (1, 2, 4):  # a process whose BLAS has this many threads
        monkeypatch.setattr(mb._single_threaded_blas, "_threads", threads)
        with threadpool_limits(limits=threads, user_api="blas"):
            whole[threads] = model.embed_chunk(x, None, backend=backend)
    for threads in (2, 4):
        np.testing.assert_array_equal(whole[threads][0], whole[1][0])
        for a, b in zip(whole[threads][1], whole[1][1], strict=True):
            np.testing.assert_array_equal(a.S, b.S)
            np.testing.assert_array_equal(a.z, b.z)


def test_many_callers_share_the_helpers(model, monkeypatch):
    monkeypatch.setattr(mb._single_threaded_blas, "_threads", 2)
    rng = np.random.default_rng(6)
    seqs = [rng.integers(0, 4096, int(rng.integers(1, 4 * MIN_ROWS))) for _ in range(12)]
    alone = [model.embed_chunk(s, None)[0] for s in seqs]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda s: model.embed_chunk(s, None)[0], seqs))
    for a, b in zip(alone, together, strict=True):  # the same ranges, whichever thread ran them
        np.testing.assert_array_equal(a, b)
