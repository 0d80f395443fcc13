"""The model runtime on several threads: BLAS held at one thread from any thread, and many
callers sharing one model get what each gets alone."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from linstream.ops import load_model
from linstream.ops.model import blas as mb


@pytest.fixture(scope="module")
def model():
    return load_model("builtin:default")


def test_the_blas_limit_holds_and_is_restored_from_any_thread():
    """threadpoolctl ignores all but one "controlling" thread for a pthreads OpenBLAS: a limit
    set on a worker thread must still take effect, and its end restore the count."""
    libs = mb._blas_libraries()
    before = [lib.get_num_threads() for lib in libs]
    seen = []

    def inside():
        with mb._single_threaded_blas():
            seen.append([lib.get_num_threads() for lib in libs])

    inside()  # the main thread first, as a model's first chunk would
    with ThreadPoolExecutor(1) as pool:
        pool.submit(inside).result()
    assert seen == [[1] * len(libs)] * 2
    assert [lib.get_num_threads() for lib in libs] == before


@pytest.mark.parametrize("threads", [1, 2])
def test_many_callers_share_one_model(model, monkeypatch, threads):
    """Callers on 4 threads at once (BLAS held at one thread by the first in, restored by the
    last out, when the process has more than one) get exactly what each gets alone."""
    monkeypatch.setattr(mb._single_threaded_blas, "_threads", threads)
    libs = mb._blas_libraries()
    before = [lib.get_num_threads() for lib in libs]
    rng = np.random.default_rng(6)
    print("seed 6")
    seqs = [rng.integers(0, 4096, int(rng.integers(1, 200))) for _ in range(12)]
    alone = [model.embed_chunk(s, None) for s in seqs]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda s: model.embed_chunk(s, None), seqs))
    for (e1, s1), (e2, s2) in zip(alone, together, strict=True):
        np.testing.assert_array_equal(e1, e2)
        for a, b in zip(s1, s2, strict=True):
            np.testing.assert_array_equal(a.S, b.S)
            np.testing.assert_array_equal(a.z, b.z)
    assert [lib.get_num_threads() for lib in libs] == before
