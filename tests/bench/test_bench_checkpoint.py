"""Checkpoint commit + restore vs. raw write + fsync + read of the same bytes, in one run.

    .venv/bin/python -m pytest tests/bench/test_bench_checkpoint.py -m bench -s -p no:randomly

State: L=4, H=8, F=d_v=64, float64 (S 1 MiB + z 16 KiB).  Rival: write the encoded bytes to a new
file, fsync it, close, read them back.  Repetitions alternate between the two so load on the
machine hits both alike; medians and their ratio are printed.  Target: ratio <= 2.  A third
rival, "protocol floor", does only the I/O of the commit protocol (two fsynced temporaries, two
links, one folder fsync, read back): what any durable create-if-absent commit costs here.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import threading
import time

import numpy as np
import pytest
from linstream.state import CheckpointStore, SequenceState, decode_state, encode_state

pytestmark = pytest.mark.bench

L, H, F, DV = 4, 8, 64, 64
REPS = 41
FP = "b" * 64


def _raw(path: str, data: bytes) -> bytes:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    with open(path, "rb") as f:
        return f.read()


def _floor(folder: str, i: int, data: bytes, manifest: bytes) -> bytes:
    """The I/O of the commit protocol alone (no encoding, hashing or checks): data and manifest
    to fsynced temporaries (concurrently), link both, fsync the folder, read the data back."""
    box: list[int] = []
    th = threading.Thread(target=lambda: box.append(_write_fsync(f"{folder}/.d{i}", data)))
    th.start()
    _write_fsync(f"{folder}/.m{i}", manifest)
    th.join()
    os.link(f"{folder}/.d{i}", f"{folder}/d{i}")
    os.link(f"{folder}/.m{i}", f"{folder}/m{i}")
    fd = os.open(folder, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    with open(f"{folder}/d{i}", "rb") as f:
        return f.read()


def _write_fsync(path: str, data: bytes) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    return len(data)


_cpu: dict[str, list[float]] = {}


def _timed(fn, *args, cpu_key=None, **kwargs):
    c0 = time.process_time()
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    dt = time.perf_counter() - t0
    if cpu_key is not None:  # CPU seconds of this process (all threads) in the call
        _cpu.setdefault(cpu_key, []).append(time.process_time() - c0)
    return dt, out


def test_bench_commit_restore_vs_raw(tmp_path):
    rng = np.random.default_rng(0)
    base = SequenceState(
        "bench", 0, 0, rng.standard_normal((L, H, F, DV)), rng.uniform(1, 2, (L, H, F)), FP
    )
    data = encode_state(base)
    store = CheckpointStore(str(tmp_path / "store"))
    raw_dir = tmp_path / "raw"
    raw_dir.mkdir()
    floor_dir = tmp_path / "floor"
    floor_dir.mkdir()
    steps = ("raw", "protocol floor", "commit+restore", "commit", "restore", "encode", "decode")
    t: dict[str, list[float]] = {k: [] for k in steps}
    for i in range(REPS + 1):
        st = dataclasses.replace(base, position=i + 1, next_chunk=i + 1)

        def ours(st=st):
            tc, outcome = _timed(store.commit, st, cpu_key="commit")
            tr, back = _timed(store.restore, "bench", fingerprint=FP, cpu_key="restore")
            # Retention's deletes (a background thread) finish here, outside the timings, like
            # the rivals' own unlinks: they must not run during another rival's timing.
            store.flush()
            assert outcome == "committed" and back == st
            return tc, tr

        def raw(i=i):
            path = str(raw_dir / f"{i}.bin")
            dt, back = _timed(_raw, path, data, cpu_key="raw")
            assert len(back) == len(data)
            os.unlink(path)
            return dt

        def floor(i=i):
            dt, back = _timed(_floor, str(floor_dir), i, data, b"m" * 480)
            assert len(back) == len(data)
            for name in (f"d{i}", f"m{i}", f".d{i}", f".m{i}"):
                os.unlink(floor_dir / name)
            return dt

        if i % 2:
            tc, tr = ours()
            traw = raw()
            tfloor = floor()
        else:
            tfloor = floor()
            traw = raw()
            tc, tr = ours()
        if i == 0:
            continue  # warm-up
        t["raw"].append(traw)
        t["protocol floor"].append(tfloor)
        t["commit"].append(tc)
        t["restore"].append(tr)
        t["commit+restore"].append(tc + tr)
        t["encode"].append(_timed(encode_state, st)[0])
        t["decode"].append(_timed(decode_state, data)[0])

    med = {k: statistics.median(v) * 1e3 for k, v in t.items()}
    ratio = med["commit+restore"] / med["raw"]
    print()
    print(f"state {L}x{H}x{F}x{DV} float64, file {len(data)} bytes, {REPS} reps, medians (ms)")
    print("| step | median ms | × raw |")
    print("|---|---:|---:|")
    for k in steps:
        print(f"| {k} | {med[k]:.3f} | {med[k] / med['raw']:.2f} |")
    cpu = {k: statistics.median(v[1:]) * 1e3 for k, v in _cpu.items()}  # [0] = warm-up
    print(
        f"CPU ms (process time, all threads): raw {cpu['raw']:.3f}, commit {cpu['commit']:.3f}, "
        f"restore {cpu['restore']:.3f}"
    )
    _cpu.clear()
    print(f"ratio commit+restore / raw = {ratio:.2f} (target <= 2)")
    floor_ratio = med["commit+restore"] / med["protocol floor"]
    print(f"ratio commit+restore / protocol floor = {floor_ratio:.2f}")
    assert ratio < 6, "checkpointing got much slower than raw I/O"
