"""The embed job's own sinks in streaming: several windows, every result and dead letter on
disk in its own files; results in row groups, not one per chunk; dead letters published."""

from __future__ import annotations

import json
import os
import uuid

import apache_beam as beam
import numpy as np
import pyarrow.parquet as pq
import pytest
from apache_beam.io.gcp.pubsub import PubsubMessage
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_stream import TestStream as _TestStream
from apache_beam.transforms.window import TimestampedValue
from linstream.pipeline.app.job import build_embed_pipeline
from linstream.pipeline.app.options import EmbedConfig
from linstream.pipeline.elements import ChunkResult, DeadLetter
from linstream.pipeline.io import WriteResults, publish, read_dead_letters, read_results
from linstream.pipeline.io import streaming as streaming_sources
from linstream.pipeline.io.publish import PublishDeadLetters

pytestmark = pytest.mark.e2e  # whole jobs, subprocesses or servers: `make check` leaves it out

WINDOW = 10.0
TOPIC = "projects/p/topics/dead"


class FilePublisher:
    """A Pub/Sub publisher stand-in: each message becomes a file (visible across threads and
    processes); ``publish`` returns a resolved future as the real client's does."""

    class _Done:
        def result(self, timeout: float | None = None) -> str:
            return "ok"

    def __init__(self, folder: str) -> None:
        self.folder = folder
        os.makedirs(folder, exist_ok=True)

    def publish(self, topic: str, data: bytes, **attributes: str) -> _Done:
        with open(os.path.join(self.folder, uuid.uuid4().hex), "w", encoding="utf-8") as f:
            json.dump({"topic": topic, "data": data.decode(), "attributes": attributes}, f)
        return self._Done()


def published(folder: str) -> list[dict]:
    if not os.path.isdir(folder):
        return []
    out = []
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            out.append(json.load(f))
    return out


def _msg(seq: str, index: int, tokens: list[int], final: bool = False) -> PubsubMessage:
    data = {"seq_id": seq, "chunk_index": index, "final": final, "tokens": tokens}
    return PubsubMessage(json.dumps(data).encode(), {"seq_id": seq})


def test_windows_of_results_and_dead_letters_all_reach_disk(tmp_path, tiny_model_path, monkeypatch):
    rng = np.random.default_rng(21)
    print("seed 21")
    good: dict[tuple[str, int], int] = {}
    stream = _TestStream()
    bad = 0
    for w in range(3):  # three windows, each with good chunks, a bad token and a bad message
        batch = []
        t0 = w * WINDOW + 1
        for s in range(2):
            seq = f"w{w}s{s}"
            for i in range(3):
                n = int(rng.integers(1, 6))
                batch.append(
                    TimestampedValue(_msg(seq, i, rng.integers(0, 256, n).tolist(), i == 2), t0 + i)
                )
                good[(seq, i)] = n
        batch.append(TimestampedValue(_msg(f"w{w}bad", 0, [9999], True), t0))  # unknown token
        batch.append(TimestampedValue(PubsubMessage(b"\xffnot json", {}), t0))  # undecodable
        bad += 2
        stream = stream.add_elements(batch).advance_watermark_to((w + 1) * WINDOW + 0.5)
    stream = stream.advance_watermark_to_infinity()

    def fake_read(pipeline, args):
        return pipeline | "FakePubSub" >> stream

    pub_dir = str(tmp_path / "published")
    monkeypatch.setattr(streaming_sources, "_read_pubsub", fake_read)
    monkeypatch.setattr(publish, "_pubsub_publisher", lambda: FilePublisher(pub_dir))
    out = str(tmp_path / "out")
    args = {
        "streaming": True,
        "pubsub_subscription": "projects/p/subscriptions/s",
        "dead_letter_topic": TOPIC,
        "output": out,
        "model": tiny_model_path,
        "backend": "numpy",
        "emit": "tokens",  # one embedding per token: the lengths below identify each chunk
        "window_seconds": WINDOW,
        "idle_timeout": 5.0,
        "progress_every": 0,
    }
    p = beam.Pipeline(options=PipelineOptions(["--runner=BundleBasedDirectRunner", "--streaming"]))
    build_embed_pipeline(p, EmbedConfig.from_dict(args))
    p.run().wait_until_finish()

    results = read_results(out)
    assert {k: len(v[1]) for k, v in results.items()} == good
    dead = read_dead_letters(out)
    assert len(dead) == bad, dead
    assert sorted(d["reason"] for d in dead if d["seq_id"].endswith("bad")) == ["unknown_token"] * 3
    # One set of files per window: three windows' names, none overwriting another.
    for sub, n in (("results", 3), ("dead_letters", 3)):
        names = os.listdir(os.path.join(out, sub))
        windows = {"-".join(name.split("-")[2:4]) for name in names}
        assert len(windows) == n, names
    # Every dead letter was also published, once, as the same JSON object.
    sent = published(pub_dir)
    assert {m["topic"] for m in sent} == {TOPIC}
    assert sorted(json.loads(m["data"])["seq_id"] for m in sent) == sorted(
        d["seq_id"] for d in dead
    )


def test_batch_results_share_row_groups(tmp_path):
    results = [
        ChunkResult(f"s{i % 3}", i, 4 * i, np.full((4, 8), i, np.float32)) for i in range(40)
    ]
    out = str(tmp_path / "out")
    p = beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"]))
    _ = (
        p
        | beam.Create(results).with_output_types(ChunkResult)
        | WriteResults(out, 8, "tokens", row_group_bytes=4 * 4 * 8 * 10)
    )
    p.run().wait_until_finish()
    files = [os.path.join(out, "results", n) for n in os.listdir(os.path.join(out, "results"))]
    groups = [
        pq.ParquetFile(f).metadata.row_group(g).num_rows
        for f in files
        for g in range(pq.ParquetFile(f).num_row_groups)
    ]
    assert sum(groups) == 40
    # ~10 results of 128 B each per row group (the byte target), not 40 one-row groups.
    assert max(groups) >= 8 and len(groups) <= 8, groups
    got = read_results(out)
    assert sorted(got) == sorted((r.seq_id, r.index) for r in results)


def test_publish_step_sends_each_dead_letter(tmp_path):
    folder = str(tmp_path / "sent")
    letters = [DeadLetter(f"s{i}", i, "bad_shape", f"message {i}") for i in range(5)]
    p = beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"]))
    _ = (
        p
        | beam.Create(range(len(letters)))
        | beam.Map(lambda i: letters[i]).with_output_types(DeadLetter)
        | PublishDeadLetters(TOPIC, lambda: FilePublisher(folder))
    )
    p.run().wait_until_finish()
    sent = published(folder)
    assert sorted(json.loads(m["data"])["message"] for m in sent) == [d.message for d in letters]
    assert all(m["attributes"]["reason"] == "bad_shape" for m in sent)


def test_readers_also_read_the_flat_layout_of_earlier_versions(tmp_path):
    from linstream.pipeline.io import results_to_table

    old = [ChunkResult("a", 0, 0, np.ones((2, 4), np.float32))]
    new = [ChunkResult("a", 1, 2, np.full((3, 4), 2, np.float32))]
    pq.write_table(results_to_table(old, 4, "tokens"), tmp_path / "results-00000-of-00001.parquet")
    (tmp_path / "results" / "q61").mkdir(parents=True)
    pq.write_table(results_to_table(new, 4, "tokens"), tmp_path / "results" / "q61" / "x.parquet")
    (tmp_path / "results" / ".pending-x.parquet").write_bytes(b"not parquet: hidden, skipped")
    got = read_results(str(tmp_path))
    assert sorted(got) == [("a", 0), ("a", 1)] and got[("a", 1)][0] == 2
    (tmp_path / "dead_letters.jsonl").write_text('{"seq_id": "a", "reason": "gap"}\n')
    (tmp_path / "dead_letters").mkdir()
    (tmp_path / "dead_letters" / "d.jsonl").write_text('{"seq_id": "b", "reason": "gap"}\n')
    assert sorted(d["seq_id"] for d in read_dead_letters(str(tmp_path))) == ["a", "b"]
