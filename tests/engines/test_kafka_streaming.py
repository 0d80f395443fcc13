"""Streaming for real: chunks produced to a Kafka broker (JSON and Arrow messages keyed by
sequence, out of order, some twice) and read by `linstream embed --streaming` on Flink through
Beam's cross-language Kafka I/O: the expansion service built into Beam's Flink job server, the
Java harness EMBEDDED in the Flink task managers (no Docker), run by deploy/flink/launch.sh.

One job reads the first half of every sequence; its idle timer commits each sequence (no chunk
count or final chunk would) and evicts it, which a sequence returning to the same job shows: it
is restored from the checkpoint store.  The job is stopped; the second half is produced; a job
resumed from the checkpoint folder finishes every sequence.  The union of the two jobs' results
holds every chunk once, bit-identical to a batch run over the same chunks, and the checkpoints
end where the batch run's do."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from helpers.crash import judge
from helpers.engine_jobs import LINSTREAM, embed_cmd, launch_cmd, launch_env, run
from helpers.engine_servers import (
    Server,
    job_states,
    need,
    start_job_server,
)
from helpers.kafka import arrow_message, create_topic, json_message, produce, start_broker

SEQUENCES, CHUNKS, TOKENS = 4, 6, 16
FIRST = 3  # chunks of each sequence in the first half
IDLE_S = 5  # --idle-timeout: event-time seconds (here: seconds after a sequence's last read)
PROBE = "idle-probe"  # the sequence whose return after eviction the first job must restore
WAIT_S = 420  # bound on each wait for a streaming job's files (its first ones take ~1 min)


@pytest.fixture(scope="module")
def kafka_broker(tmp_path_factory):
    lib = need("kafka")
    broker = start_broker(lib, tmp_path_factory.mktemp("kafka"))
    try:
        yield broker
    finally:
        broker.stop()


class StreamingJob:
    """`linstream embed --streaming` on Flink, in its own process group, stopped as a user
    stops it (Ctrl-C), which also cancels the job on the job server (its LOOPBACK workers die
    with the command, so it could not go on)."""

    def __init__(self, server: Server, log: Path, env: dict[str, str], *extra: str) -> None:
        self.server, self.log = server, log
        with open(log, "ab") as f:
            self.proc = subprocess.Popen(
                launch_cmd("flink", *extra),
                env=env,
                stdout=f,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_for(self, what: str, ready) -> None:
        t0 = time.monotonic()
        while time.monotonic() < t0 + WAIT_S:
            if ready():
                print(f"{what}: after {time.monotonic() - t0:.0f} s")
                return
            assert self.proc.poll() is None, (
                f"the job exited ({self.proc.returncode}):\n"
                + (self.log.read_text(errors="replace")[-4000:])
            )
            time.sleep(1)
        tail = self.log.read_text(errors="replace")[-3000:]
        pytest.fail(
            f"no {what} after {WAIT_S} s; job log:\n{tail}\n"
            f"jobs on the server: {job_states(self.server)}"
            f"\nfiles:\n{self.files()}\nserver:\n{self.server.tail()}"
        )

    def files(self) -> str:
        """What the job has written so far (its output and checkpoint folders), one a line."""
        root = self.log.parent
        return "\n".join(
            f"{p.relative_to(root)} {p.stat().st_size}"
            for p in sorted(root.rglob("*"))
            if p.is_file() and "batch" not in p.relative_to(root).parts[0]
        )

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        return self.proc.returncode

    def states_after_stop(self, wait_s: float = 60) -> list[str]:
        """The states of the jobs on the server once none is running or starting (or after
        ``wait_s``)."""
        t0 = time.monotonic()
        while True:
            states = [state for _name, state in job_states(self.server)]
            if not {"RUNNING", "STARTING"} & set(states) or time.monotonic() > t0 + wait_s:
                return states
            time.sleep(1)


def _chunks(seed: int) -> dict[str, list]:
    from linstream.pipeline.app.sample import sequence_chunks

    seqs = {
        f"k-{s}": list(sequence_chunks(f"k-{s}", CHUNKS * TOKENS, TOKENS, seed + s, vocab_size=256))
        for s in range(SEQUENCES)
    }
    seqs[PROBE] = list(sequence_chunks(PROBE, CHUNKS * TOKENS, TOKENS, seed + 99, vocab_size=256))
    return seqs


def _messages(chunks: list, rng: np.random.Generator) -> list[tuple[str | None, bytes]]:
    """Shuffled, a few sent twice, JSON and Arrow (stream and file format) in turn."""
    picked = list(chunks) + [chunks[int(i)] for i in rng.integers(0, len(chunks), 3)]
    out = []
    for n, i in enumerate(rng.permutation(len(picked))):
        c = picked[int(i)]
        body = (json_message(c), arrow_message(c), arrow_message(c, file=True))[n % 3]
        out.append((c.seq_id, body))
    return out


def _results(*outs: str) -> set[tuple[str, int]]:
    from linstream.pipeline.io import read_results

    return {k for out in outs if os.path.isdir(out) for k in read_results(out)}


def _dead(out: str) -> list[tuple[str, int | None, str]]:
    from linstream.pipeline.io import read_dead_letters

    if not os.path.isdir(out):
        return []
    return [(d["seq_id"], d["chunk_index"], d["reason"]) for d in read_dead_letters(out)]


def _heads(ckpt: str) -> dict[str, dict]:
    """`linstream checkpoint inspect --json`: each sequence's newest commit, as a user sees it."""
    done = subprocess.run(
        [LINSTREAM, "checkpoint", "inspect", "--json", ckpt],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    keep = ("next_chunk", "position", "s_norm", "z_norm", "fingerprint", "error")
    return {r["seq_id"]: {k: r[k] for k in keep} for r in rows}


def _corrupt_head(ckpt: str, seq_id: str) -> Path:
    """Flip a byte in the middle of the state file that the sequence's (only) commit names."""
    (manifest,) = [
        p
        for p in Path(ckpt).rglob("*.commit.json")
        if json.loads(p.read_text()).get("seq_id") == seq_id
    ]
    state = manifest.parent / json.loads(manifest.read_text())["data_file"]
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state.write_bytes(bytes(data))
    return state


def test_kafka_stream_on_flink_matches_a_batch_run_and_resumes(kafka_broker, tiny_model, tmp_path):
    from linstream.pipeline.io import write_chunk_file

    seed = 4242
    print(f"kafka streaming seed {seed}")
    rng = np.random.default_rng(seed)
    bootstrap = f"127.0.0.1:{kafka_broker.ports['broker']}"
    topic = f"chunks-{seed}"
    create_topic(bootstrap, topic)
    seqs = _chunks(seed)
    first = [c for s, cs in seqs.items() if s != PROBE for c in cs[:FIRST]]
    second = [c for s, cs in seqs.items() if s != PROBE for c in cs[FIRST:]]
    probe = seqs[PROBE]

    # The batch run over the chunks the stream's results must equal (the probe's third chunk is
    # refused by the stream, see below, so the batch input stops before it).
    batch_in, batch_out = str(tmp_path / "batch.parquet"), str(tmp_path / "batch")
    batch_ckpt = str(tmp_path / "batch-ckpt")
    write_chunk_file(batch_in, [*first, *second, *probe[:2]])
    run(embed_cmd(tiny_model, batch_in, batch_out, batch_ckpt, "--runner=FnApiRunner"))

    ckpt = str(tmp_path / "ckpt")
    outs = [str(tmp_path / "out-0"), str(tmp_path / "out-1")]
    extra = ("--checkpoint-every", "50", "--idle-timeout", str(IDLE_S), "--window-seconds", "5")

    def env(server: Server, out: str, resume: bool) -> dict[str, str]:
        return launch_env(
            "flink",
            server,
            tiny_model,
            "",
            out,
            ckpt,
            KAFKA_BOOTSTRAP=bootstrap,
            KAFKA_TOPIC=topic,
            # Flink checkpoints every 100 ms: a checkpoint then meets the Kafka source's first
            # bundle on every try, which without --finish_bundle_before_checkpointing (passed by
            # launch.sh) held that bundle's output back and left the job reading nothing.
            CHECKPOINTING_INTERVAL_MS="100",
            RESUME="1" if resume else "0",
        )

    # Both jobs on one job server, as a user resumes on the same cluster (the first job is
    # cancelled there before the second starts).
    server = start_job_server("flink", tmp_path / "job-server")
    try:
        # -- the first job: half of every sequence, and a message that is no chunk --------------
        produce(bootstrap, topic, [*_messages(first + probe[:2], rng), ("k-0", b"not a chunk")])
        job = StreamingJob(server, tmp_path / "job-0.log", env(server, outs[0], False), *extra)
        try:
            want = {(c.seq_id, c.index) for c in [*first, *probe[:2]]}
            job.wait_for("results of the first half", lambda: _results(outs[0]) >= want)
            # The running job's staged files (the Kafka I/O's jars) are in the job server's own
            # folder, which goes with the server (Beam removes them only when a job completes).
            staged = tmp_path / "job-server" / "artifacts"
            assert any(p.is_file() for p in staged.rglob("*")), staged
            # Results are written by commits only, and no sequence reached 50 chunks or its
            # final one: the idle timer committed each, where its chunks ended.
            heads = _heads(ckpt)
            assert {s: h["next_chunk"] for s, h in heads.items()} == {
                **{s: FIRST for s in seqs if s != PROBE},
                PROBE: 2,
            }
            # Evicted after that commit: a sequence that returns is restored from the store.
            # The probe's commit is damaged, so its next chunk can only be refused
            # (restore_failed); a sequence still in Beam state would have applied it.
            _corrupt_head(ckpt, PROBE)
            produce(bootstrap, topic, [(PROBE, json_message(probe[2]))])
            job.wait_for(
                "a restore_failed dead letter for the returning sequence",
                lambda: (PROBE, 2, "restore_failed") in _dead(outs[0]),
            )
            assert ("k-0", None, "undecodable_message") in _dead(outs[0])
        finally:
            code = job.stop()
        print(f"first job stopped with exit status {code}")
        assert code == 130  # stopped by SIGINT, as the command line promises
        # and the job on the runner was cancelled with it (its LOOPBACK workers are gone)
        assert job.states_after_stop() == ["CANCELLED"]
        said = job.log.read_text(errors="replace")
        assert "stopped by SIGINT: the job was cancelled on PortableRunner too" in said, said

        # -- the rest of every sequence; a job resumed from the checkpoint folder -----------------
        produce(bootstrap, topic, _messages(second, rng))
        job = StreamingJob(server, tmp_path / "job-1.log", env(server, outs[1], True), *extra)
        try:
            want = {(c.seq_id, c.index) for c in [*first, *second, *probe[:2]]}
            job.wait_for("results of every chunk", lambda: _results(*outs) >= want)
        finally:
            job.stop()
        assert sorted(job.states_after_stop()) == ["CANCELLED", "CANCELLED"]
        # The JVM's temporary files are in the server's own folder too (Flink unpacks its RPC
        # system's jar at each start); stopping the server removes both: a run of the tests
        # leaves none behind.
        jvm_tmp = tmp_path / "job-server" / "jvm-tmp"
        assert list(jvm_tmp.glob("flink-rpc-*.jar")), sorted(jvm_tmp.iterdir())
    finally:
        server.stop()
    assert not staged.exists(), staged
    assert not jvm_tmp.exists(), jvm_tmp

    verdict = judge(batch_out, outs)
    assert verdict.ok, str(verdict)
    stream_heads, batch_heads = _heads(ckpt), _heads(batch_ckpt)
    for seq_id in seqs:
        if seq_id != PROBE:
            assert stream_heads[seq_id]["next_chunk"] == CHUNKS, seq_id
            assert stream_heads[seq_id] == batch_heads[seq_id], seq_id
