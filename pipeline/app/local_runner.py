"""The in-process runner's state cache, sized as every other Beam worker sizes it.

Beam's SDK harness (the worker on Dataflow, Flink, Spark and the portable runner) sizes its
user-state cache from the pipeline option ``--max_cache_memory_usage_mb``, default 0: no cache.
FnApiRunner's in-process worker ignores the option and builds its cache from a module constant
(``worker_handlers.STATE_CACHE_SIZE_MB``, 100 MB).  A cached value is weighed on every put and
load by a deep object-size walk that also lists the globals of every loaded module (about 2,500
with Beam), 1.5-2.5 ms a call whatever the value's size; the embed stage reads and writes one
state cell per sequence and bundle, so at small chunks the weighing alone was 10-20% of the
job's CPU time.  ``state_cache_for(options)`` applies the option to the in-process worker for
one run, so a local run caches as a cloud worker does (by default: not at all).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from apache_beam.options.pipeline_options import PipelineOptions, WorkerOptions
from apache_beam.runners.portability.fn_api_runner import worker_handlers

__all__ = ["state_cache_for"]

_LOCK = threading.Lock()
_inside = 0  # runs inside state_cache_for now
_original = worker_handlers.STATE_CACHE_SIZE_MB


@contextlib.contextmanager
def state_cache_for(options: PipelineOptions) -> Iterator[int]:
    """Within the block, FnApiRunner's in-process worker gets a state cache of
    ``--max_cache_memory_usage_mb`` MB (Beam's default 0: none); yields that size.

    The runner reads the size when it builds its worker, at the start of ``run()``.  Runs that
    overlap in one process share the setting (the latest one's); the last one out restores
    FnApiRunner's own."""
    global _inside, _original
    mb = max(0, int(options.view_as(WorkerOptions).max_cache_memory_usage_mb or 0))
    with _LOCK:
        if _inside == 0:
            _original = worker_handlers.STATE_CACHE_SIZE_MB
        _inside += 1
        worker_handlers.STATE_CACHE_SIZE_MB = mb
    try:
        yield mb
    finally:
        with _LOCK:
            _inside -= 1
            if _inside == 0:
                worker_handlers.STATE_CACHE_SIZE_MB = _original
