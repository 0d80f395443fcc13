"""One sequence of N tokens through the stateful stage; prints peak RSS (run as a subprocess).

The chunks are made lazily inside the stage from a per-chunk seed: only (seq id, chunk index,
seed) elements cross the runner's shuffle, so what grows with N is what the stage keeps, not
an input file.  Usage: python tests/helpers/pipeline_rss_job.py TOKENS CHUNK_SIZE BACKEND
"""

from __future__ import annotations

import json
import resource
import sys
import time

import apache_beam as beam
import numpy as np
from apache_beam.options.pipeline_options import PipelineOptions
from linstream.pipeline import Chunk
from linstream.pipeline.app.job import _query_metrics
from linstream.pipeline.stage.steps import RawAttentionStep
from linstream.pipeline.stage.transforms import _SequenceTransform

H, D = 1, 4


class LazyRawStep(RawAttentionStep):
    """Raw attention whose payload is [seed, T]: q, k, v are generated when the chunk is used."""

    def validate(self, data):
        seed, t = (int(x) for x in np.asarray(data))
        rng = np.random.default_rng(seed)
        q, k, v = rng.standard_normal((3, t, H, D), dtype=np.float32)
        return super().validate({"q": q, "k": k, "v": v})


def make_chunk(i, n_chunks, chunk_size, tokens):
    t = min(chunk_size, tokens - i * chunk_size)
    return Chunk("long", i, np.array([1000 + i, t], np.int64), final=i == n_chunks - 1)


class Drop(beam.DoFn):
    def process(self, result):
        return


def main() -> None:
    tokens, chunk_size, backend = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    n_chunks = -(-tokens // chunk_size)
    transform = _SequenceTransform(
        LazyRawStep(backend=backend),
        checkpoint_dir=None,
        checkpoint_every=64,
        checkpoint_keep=2,
        resume=False,
        max_buffered_chunks=64,
        idle_timeout=300.0,
        emit="last",
        progress_every_s=None,
    )
    p = beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"]))
    results, dead = (
        p
        | beam.Create(list(range(n_chunks)))
        | beam.Map(make_chunk, n_chunks, chunk_size, tokens).with_output_types(Chunk)
        | transform.with_exception_handling()
    )
    results | "DropResults" >> beam.ParDo(Drop())
    dead | "DropDead" >> beam.ParDo(Drop())
    t0 = time.perf_counter()
    res = p.run()
    res.wait_until_finish()
    wall = time.perf_counter() - t0
    counters, kernel_s = _query_metrics(res)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        json.dumps(
            {
                "tokens": counters.get("tokens", 0),
                "chunks": counters.get("chunks", 0),
                "wall_s": wall,
                "kernel_s": kernel_s,
                "peak_rss_mib": peak_kib / 1024,
            }
        )
    )


if __name__ == "__main__":
    main()
