"""A short chunk's packed products on spinning helper threads (`packed_batch`), as a caller meets
them: a batch writes exactly what its calls write one after another (the same MKL calls on the
same operands, whoever runs each), a batch it does not take is left whole to the caller, two
callers at once both get their products, a forked child runs batches of its own, and
LINSTREAM_SPIN_US=0 turns the helpers off.  The model's bits on 1, 2 and 3 threads, with the
helpers in between, are tests/ops/fla/test_fla_bf16.py's (bfloat16) and
tests/ops/fla/test_fla_mkl_packed.py's.  Skipped where MKL cannot pack the dtype."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import textwrap
import threading

import ml_dtypes
import numpy as np
import pytest
from helpers.mkl_engines import can_pack
from linstream.ops.model.fla import mkl, packed_batch
from linstream.ops.model.fla.mkl import Cell, Group

SEED = 20261206
BF16 = np.dtype(ml_dtypes.bfloat16)


def _dtype(name: str) -> np.dtype:
    if not can_pack(name):
        pytest.skip(f"MKL cannot pack {name} weights here")
    return BF16 if name == "bfloat16" else np.dtype(np.float32)


def _layer(rng: np.random.Generator, dt: np.dtype, m: int) -> tuple[list, list[np.ndarray]]:
    """A batch like a short chunk's: a weight in two column ranges (one call each), a fused
    projection's parts each whole (a Group of its ranges' calls), an empty column range, a
    product with k = 0 (MKL makes no call: zeros); x a range of a bigger array's rows."""
    calls, outs = [], []
    for n, k, ranges, whole in [
        (300, 96, [slice(0, 150), slice(150, 300)], False),
        (64, 200, [slice(0, 64)], True),
        (130, 96, [slice(0, 0), slice(0, 130)], True),
        (40, 0, [slice(0, 40)], False),
    ]:
        w = rng.standard_normal((n, k), dtype=np.float32).astype(dt)
        x = rng.standard_normal((m + 3, k), dtype=np.float32).astype(dt)[2 : m + 2]
        packed = mkl.Packed(w, ranges)
        out = np.full((m, n), np.nan, np.float32)
        cells = [Cell(packed, x, j, out) for j in range(len(ranges))]
        calls += [Group(cells)] if whole else cells
        outs.append(out)
    return calls, outs


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("threads", [2, 3])
def test_a_batch_writes_what_its_calls_write_one_after_another(dtype, threads):
    """300 batches in a row (the helpers spinning between them, taking some products), 1 to 255
    rows: every output bit for bit the calls' own, run on this thread."""
    dt = _dtype(dtype)
    rng = np.random.default_rng(SEED)
    print("seed", SEED)
    for i in range(300):
        m = (1, 17, 64, 255)[i % 4]
        calls, outs = _layer(rng, dt, m)
        assert packed_batch.run(calls, threads)
        got = [o.copy() for o in outs]
        for o in outs:
            o.fill(np.nan)
        for call in calls:
            call()
        for a, b in zip(got, outs, strict=True):
            assert np.array_equal(a, b), (i, m)
        assert np.all(outs[-1] == 0)  # k = 0: zeros, not left unwritten


def test_a_batch_it_does_not_take_is_left_whole_to_the_caller(monkeypatch):
    """A long chunk's products (the pool runs them), a call that is not MKL's packed product
    (alone, or in a group as another engine's short-chunk part), one thread: False, and nothing
    written."""
    dt = _dtype("float32")
    rng = np.random.default_rng(SEED)
    long_calls, long_outs = _layer(rng, dt, 256)
    calls, outs = _layer(rng, dt, 64)
    assert not packed_batch.run(long_calls, 2)
    assert not packed_batch.run([*calls, lambda: None], 2)
    assert not packed_batch.run([*calls, Group([lambda: None])], 2)
    assert not packed_batch.run(calls, 1)
    assert all(np.isnan(o).all() for o in long_outs + outs)


def test_two_callers_at_once_both_get_their_products():
    """Two threads each run 200 batches at the same time: one has the helpers, the other's
    batches are declined while it does (and run here one after another, as the pool would)."""
    dt = _dtype("float32")
    results: dict[int, list[bool]] = {}

    def caller(seed: int) -> None:
        rng = np.random.default_rng(seed)
        ok = []
        for _ in range(200):
            calls, outs = _layer(rng, dt, 64)
            if not packed_batch.run(calls, 2):
                for call in calls:
                    call()
            got = [o.copy() for o in outs]
            for call in calls:
                call()
            ok.append(all(np.array_equal(a, b) for a, b in zip(got, outs, strict=True)))
        results[seed] = ok

    threads = [threading.Thread(target=caller, args=(s,)) for s in (SEED, SEED + 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert all(all(ok) and len(ok) == 200 for ok in results.values())
    assert len(results) == 2


def _child(conn) -> None:  # pragma: no cover - runs in the forked child
    rng = np.random.default_rng(SEED)
    calls, outs = _layer(rng, np.dtype(np.float32), 64)
    ran = packed_batch.run(calls, 2)
    conn.send((ran, [o.copy() for o in outs]))


def test_a_forked_child_runs_batches_of_its_own():
    """The parent's helpers (threads) do not survive a fork: the child starts its own, and its
    batch is the calls' own products."""
    dt = _dtype("float32")
    calls, _ = _layer(np.random.default_rng(SEED + 2), dt, 64)
    assert packed_batch.run(calls, 2)  # the parent's helpers are running
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    p = ctx.Process(target=_child, args=(child,))
    p.start()
    ran, got = parent.recv()
    p.join(timeout=60)
    calls, outs = _layer(np.random.default_rng(SEED), dt, 64)
    for call in calls:
        call()
    assert ran
    assert p.exitcode == 0
    assert all(np.array_equal(a, b) for a, b in zip(got, outs, strict=True))


def test_spinning_helpers_can_be_turned_off():
    """LINSTREAM_SPIN_US=0: every batch is declined (the pool runs it) and no helper thread
    starts; the default starts one per extra thread; a value that is not a number is one line,
    and the default."""
    _dtype("float32")
    script = textwrap.dedent(
        """
        import threading, numpy as np
        from linstream.ops.model.fla import mkl, packed_batch
        w = np.ones((64, 32), np.float32)
        out = np.zeros((8, 64), np.float32)
        p = mkl.Packed(w, [slice(0, 32), slice(32, 64)])
        cells = [mkl.Cell(p, np.ones((8, 32), np.float32), j, out) for j in (0, 1)]
        ran = packed_batch.run(cells, 3)
        helpers = sum(t.name.startswith("linstream-packed") for t in threading.enumerate())
        print(ran, helpers, float(out.sum()))
        """
    )
    lines, errors = {}, {}
    for value in ("0", None, "fast"):
        env = {**__import__("os").environ}
        env.pop("LINSTREAM_SPIN_US", None)
        if value is not None:
            env["LINSTREAM_SPIN_US"] = value
        out = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
        )
        assert out.returncode == 0, out.stderr
        lines[value], errors[value] = out.stdout.split(), out.stderr.strip().splitlines()
    assert lines["0"] == ["False", "0", "0.0"]
    assert lines[None] == ["True", "2", str(8 * 64 * 32.0)]
    assert lines["fast"] == lines[None]  # not a number: the default, said in one line
    assert errors["0"] == errors[None] == []
    assert len(errors["fast"]) == 1
    assert "LINSTREAM_SPIN_US='fast': expected microseconds" in errors["fast"][0]
