"""The C heap kept for the host forward's temporaries (`linstream.ops.model.heap`), seen from a
fresh process as the OS counts it: after a host forward, a pattern of large arrays of mixed
sizes (as a chunk's projections and activations) allocated, written and freed again faults in no
new pages, on the main thread or another (a Beam worker's); with LINSTREAM_KEEP_HEAP=0, or where
the user set glibc's own variables, the heap is left as glibc keeps it, and the same pattern
faults its pages in again each time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")

_SCRIPT = textwrap.dedent(
    """
    import json, resource, threading
    import numpy as np
    from linstream.ops.model.fla import load_model
    from linstream.ops.model import heap

    model = load_model(__import__("sys").argv[1])
    model.embed_chunk(np.arange(20), None)  # a host forward

    def once():  # arrays of 3-30 MiB, two alive at a time, each written through
        alive = []
        for mib in (3, 24, 9, 30, 16, 5):
            a = np.empty(mib << 18, np.float32)
            a[:] = 1.0
            alive = [*alive[-1:], a]

    def faults(rounds):
        once()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(rounds):
            once()
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    main = faults(5)
    # on another thread (its own arena, as a Beam worker's): the same pattern
    got = []
    worker = threading.Thread(target=lambda: got.append(faults(5)))
    worker.start()
    worker.join()
    print(json.dumps({"kept": heap.keep_heap(), "faults": main, "thread_faults": got[0]}))
    """
)


def _run(folder, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    clean.pop("LINSTREAM_KEEP_HEAP", None)
    r = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(folder)],
        capture_output=True, text=True, timeout=300, env={**clean, **env}, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from helpers.fla_folders import TINY_CONFIGS, write_folder

    return write_folder(tmp_path_factory.mktemp("heap") / "m", TINY_CONFIGS["gla"], seed=1)


def test_after_a_host_forward_large_temporaries_reuse_the_heap(folder):
    """On the main thread and on another one (a thread arena's heaps, which glibc unmaps when
    wholly free unless the top pad keeps them)."""
    kept = _run(folder)
    off = _run(folder, LINSTREAM_KEEP_HEAP="0")
    print(f"page faults over 5 rounds: kept {kept}, as glibc keeps it {off}")
    assert kept["kept"] is True and off["kept"] is False
    pages = (30 << 20) // os.sysconf("SC_PAGE_SIZE")  # the largest array's pages (30 MiB)
    assert kept["faults"] < pages // 10
    assert kept["thread_faults"] < pages // 10
    # the pattern does fault without it (the checks can fail): on the main thread more than
    # the largest array, on the other at least twice the bound above
    assert off["faults"] > pages
    assert off["thread_faults"] > 2 * (pages // 10)


def test_the_users_own_glibc_settings_are_left_alone(folder):
    got = _run(folder, MALLOC_TRIM_THRESHOLD_="1048576")
    assert got["kept"] is False
