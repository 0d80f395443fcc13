"""Helpers for the pipeline tests: run a transform on the pinned local runner, collect outputs."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable
from typing import Any, Never

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from linstream.pipeline.elements import ChunkResultCoder, DeadLetterCoder

from helpers.stage_runs import Run


class _Dump(beam.DoFn):
    """Write each element to its own file (works across worker processes)."""

    def __init__(self, directory: str, coder: Any) -> None:
        self.directory, self.coder = directory, coder

    # Emits nothing: Beam (from 2.78) refuses a `process` annotated `-> None` in this module.
    def process(self, element: Any) -> Iterable[Never]:
        os.makedirs(self.directory, exist_ok=True)
        path = os.path.join(self.directory, uuid.uuid4().hex)
        with open(path, "wb") as f:
            f.write(self.coder.encode(element))
        return ()


def load_dumped(directory: str, coder: Any) -> list[Any]:
    if not os.path.isdir(directory):
        return []
    out = []
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            out.append(coder.decode(f.read()))
    return out


def run_transform(
    chunks: Iterable[Any] | beam.PTransform,
    transform: Any,
    tmp_path: Any,
    options: list[str] | None = None,
) -> Run:
    """Apply `transform.with_exception_handling()` to `chunks` (a list, or a source such as a
    TestStream) on the runner in `options`, FnApiRunner when none is named."""
    from linstream.pipeline.app.job import _query_metrics

    opts = list(options or [])
    if not any(o.startswith("--runner") for o in opts):
        opts.append("--runner=FnApiRunner")
    tag = uuid.uuid4().hex[:8]
    rdir = os.path.join(str(tmp_path), f"results-{tag}")
    ddir = os.path.join(str(tmp_path), f"dead-{tag}")
    p = beam.Pipeline(options=PipelineOptions(opts))
    source = chunks if isinstance(chunks, beam.PTransform) else beam.Create(list(chunks))
    results, dead = p | source | transform.with_exception_handling()
    results | "DumpResults" >> beam.ParDo(_Dump(rdir, ChunkResultCoder()))
    dead | "DumpDead" >> beam.ParDo(_Dump(ddir, DeadLetterCoder()))
    res = p.run()
    res.wait_until_finish()
    counters, _ = _query_metrics(res)
    return Run(
        load_dumped(rdir, ChunkResultCoder()), load_dumped(ddir, DeadLetterCoder()), counters
    )
