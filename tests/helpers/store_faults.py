"""Helpers for tests of code that keeps state: damage files, and commit from many processes.

Shipped in the package (like bytewax's test helpers) so pipeline tests can use them too.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_mod
from typing import Any

__all__ = [
    "HOSTILE_CASES",
    "CommitWorkers",
    "commit_concurrently",
    "compressed_state_file",
    "flip_bit",
    "make_hostile_commit",
    "random_named_state",
    "random_state",
    "rewrite_state_file",
    "truncate",
    "write_raw_commit",
]


def truncate(path: str, size: int) -> None:
    """Cut the local file at ``path`` to ``size`` bytes."""
    with open(path, "r+b") as f:
        f.truncate(size)


def flip_bit(path: str, offset: int, bit: int = 0) -> None:
    """Flip one bit of the local file at ``path``."""
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ (1 << bit)]))


def random_state(
    seed: int,
    shape: tuple[int, int, int, int] = (2, 2, 3, 4),
    *,
    seq_id: str = "seq",
    position: int = 7,
    next_chunk: int = 1,
    fingerprint: str = "f" * 64,
    dtype: Any = "float64",
) -> Any:
    """A ``SequenceState`` with random finite values (z positive, as a sum of φ(k) is)."""
    import numpy as np
    from linstream.state.sequence_state import SequenceState

    rng = np.random.default_rng(seed)
    S = rng.standard_normal(shape).astype(dtype)
    z = rng.uniform(0.5, 2.0, shape[:3]).astype(dtype)
    return SequenceState(seq_id, position, next_chunk, S, z, fingerprint)


def _commit_worker(barrier: Any, tasks: Any, results: Any, index: int) -> None:
    from linstream.state.codec import decode_state
    from linstream.state.store.checkpoint_store import CheckpointStore

    results.put((index, "ready"))
    while True:
        task = tasks.get()
        if task is None:
            return
        root, payload = task
        try:
            st = decode_state(payload)
            store = CheckpointStore(root)
            barrier.wait(timeout=60)
            outcome: str = str(store.commit(st))
        except Exception as ex:  # reported to the parent, which asserts on it
            outcome = f"{type(ex).__name__}: {ex}"
        results.put((index, outcome))


class CommitWorkers:
    """``n`` spawned processes that commit together: each round, every worker decodes its
    payload, waits at a shared barrier, then commits.  Reusable across rounds (spawning is the
    slow part); use as a context manager."""

    def __init__(self, n: int, *, timeout: float = 120.0) -> None:
        ctx = mp.get_context("spawn")
        self.n = n
        self.timeout = timeout
        self._barrier = ctx.Barrier(n)
        self._results = ctx.Queue()
        self._tasks = [ctx.Queue() for _ in range(n)]
        self._procs = [
            ctx.Process(
                target=_commit_worker,
                args=(self._barrier, self._tasks[i], self._results, i),
                daemon=True,
            )
            for i in range(n)
        ]
        for proc in self._procs:
            proc.start()
        for _ in range(n):
            self._results.get(timeout=timeout)

    def commit_all(self, root: str, payloads: list[bytes]) -> list[str]:
        """One outcome per payload, in order: a ``CommitOutcome`` value or ``"Error: msg"``."""
        if len(payloads) != self.n:
            msg = f"expected {self.n} payloads (one per worker), received {len(payloads)}"
            raise ValueError(msg)
        for q, payload in zip(self._tasks, payloads, strict=True):
            q.put((root, payload))
        out: dict[int, str] = {}
        try:
            for _ in range(self.n):
                index, outcome = self._results.get(timeout=self.timeout)
                out[index] = outcome
        except queue_mod.Empty:
            pass
        return [out.get(i, "timeout") for i in range(self.n)]

    def close(self) -> None:
        for q in self._tasks:
            q.put(None)
        for proc in self._procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()

    def __enter__(self) -> CommitWorkers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def commit_concurrently(root: str, payloads: list[bytes], *, timeout: float = 120.0) -> list[str]:
    """Commit each payload from its own spawned process, all released at once (see
    ``CommitWorkers``)."""
    with CommitWorkers(len(payloads), timeout=timeout) as workers:
        return workers.commit_all(root, payloads)


def random_named_state(
    seed: int,
    layers: int = 2,
    extra: dict[str, tuple[int, ...]] | None = None,
    *,
    S: tuple[int, int, int] = (2, 3, 4),
    seq_id: str = "seq",
    position: int = 7,
    next_chunk: int = 1,
    fingerprint: str = "f" * 64,
    dtype: Any = "float64",
) -> Any:
    """A ``SequenceState`` of named tensors (format 3) as an fla model carries: S [L, *S] without
    z, and ``extra`` tensors [L, *shape] (default: three short-convolution tails)."""
    import numpy as np
    from linstream.state.sequence_state import SequenceState

    rng = np.random.default_rng(seed)
    shapes = {"conv_q": (3, 8), "conv_k": (3, 8), "conv_v": (3, 16)} if extra is None else extra
    tensors = {n: rng.standard_normal((layers, *s)).astype(dtype) for n, s in shapes.items()}
    St = rng.standard_normal((layers, *S)).astype(dtype)
    return SequenceState(seq_id, position, next_chunk, St, None, fingerprint, tensors)


def write_raw_commit(
    root: str, seq_id: str, position: int, data: bytes, /, **manifest_fields: Any
) -> tuple[str, str]:
    """Write ``data`` as the commit of ``seq_id`` at ``position`` under the local ``root``, with a
    consistent format-2 manifest whose size and sha256 match ``data`` (so restore reaches the
    checks inside the file): commit number ``position + 1`` unless ``commit=`` says otherwise,
    so that newer positions are newer commits.  ``manifest_fields`` override fields (``history``
    too).  Returns (manifest path, data path)."""
    import hashlib
    from dataclasses import replace

    from linstream.state.codec import FORMAT_VERSION, MIN_READER_VERSION
    from linstream.state.store.manifest import History, Manifest
    from linstream.state.store.paths import commit_name, data_name, encode_seq_dir

    sha = hashlib.sha256(data).hexdigest()
    commit = manifest_fields.pop("commit", position + 1)
    m = Manifest(
        format_version=FORMAT_VERSION,
        min_reader_version=MIN_READER_VERSION,
        seq_id=seq_id,
        position=position,
        next_chunk=manifest_fields.pop("next_chunk", 1),
        fingerprint=manifest_fields.pop("fingerprint", "f" * 64),
        dtype=manifest_fields.pop("dtype", "float64"),
        shape=manifest_fields.pop("shape", (2, 2, 3, 4)),
        data_file=data_name(position, sha),
        size=len(data),
        sha256=sha,
        digest=manifest_fields.pop("digest", "sha256:" + "0" * 64),
        history=History(commit=commit, parent_position=0, final_chunk=-1, digests=b""),
    )
    m = replace(m, **manifest_fields)
    folder = os.path.join(root, encode_seq_dir(seq_id))
    os.makedirs(folder, exist_ok=True)
    dpath = os.path.join(folder, m.data_file)
    mpath = os.path.join(folder, commit_name(commit))
    with open(dpath, "wb") as f:
        f.write(data)
    with open(mpath, "wb") as f:
        f.write(m.to_bytes())
    return mpath, dpath


def rewrite_state_file(
    data: bytes,
    *,
    metadata: dict[str, str] | None = None,
    columns: dict[str, Any] | None = None,
) -> bytes:
    """Re-encode Arrow state bytes with schema metadata entries and/or columns replaced
    (forging files that the codec itself would never write)."""
    import pyarrow as pa

    reader = pa.ipc.open_file(pa.py_buffer(data))
    batch = reader.get_batch(0)
    meta = dict(reader.schema.metadata or {})
    for key, value in (metadata or {}).items():
        meta[f"linstream.{key}".encode()] = value.encode()
    arrays = {name: batch.column(name) for name in batch.schema.names}
    arrays.update(columns or {})
    table = pa.RecordBatch.from_pydict(arrays).replace_schema_metadata(meta)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_batch(table)
    return bytes(sink.getvalue().to_pybytes())


def compressed_state_file(data: bytes, codec: str = "zstd") -> bytes:
    """The same state file with its record batch body compressed (which linstream never
    writes): a few KB that Arrow would decompress to the full tensor size."""
    import pyarrow as pa

    reader = pa.ipc.open_file(pa.py_buffer(data))
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=codec)
    with pa.ipc.new_file(sink, reader.schema, options=options) as writer:
        writer.write_batch(reader.get_batch(0))
    return bytes(sink.getvalue().to_pybytes())


#: What ``make_hostile_commit`` can build, and the error a reader must name for each.
HOSTILE_CASES = {
    "deep_manifest": "CorruptCheckpointError",
    "huge_int_manifest": "CorruptCheckpointError",
    "manifest_is_dir": "NotARegularFileError",
    "data_is_dir": "NotARegularFileError",
    "manifest_is_fifo": "NotARegularFileError",
    "data_is_fifo": "NotARegularFileError",
    "linked_folder": "UnsafePathError",
    "linked_manifest": "UnsafePathError",
    "linked_data": "UnsafePathError",
    "compressed_bomb": "StateBoundsError",
}


def make_hostile_commit(root: str, st: Any, case: str, outside: str) -> list[str]:
    """Commit ``st`` under the local store ``root``, then turn it into ``case`` (a key of
    ``HOSTILE_CASES``).  ``outside`` is a folder outside the root that links point into (it
    gets a valid copy of the commit, so following a link would succeed).  Returns the paths
    a reader must name (manifest or data file, or the linked folder)."""
    import json

    import numpy as np
    from linstream.state.codec import decode_with_header, encode_state
    from linstream.state.sequence_state import SequenceState
    from linstream.state.store.checkpoint_store import CheckpointStore

    if case == "compressed_bomb":
        shape = (1, 1, 2048, 2048)  # 32 MiB of float64 S in a file of a few KB
        big = SequenceState(
            st.seq_id,
            st.position,
            st.next_chunk,
            np.zeros(shape),
            np.ones(shape[:3]),
            st.fingerprint,
        )
        data = compressed_state_file(encode_state(big))
        header = decode_with_header(encode_state(big))[1]
        mpath, dpath = write_raw_commit(
            root,
            st.seq_id,
            st.position,
            data,
            next_chunk=st.next_chunk,
            fingerprint=st.fingerprint,
            shape=shape,
            digest=header.digest,
        )
        return [dpath]
    store = CheckpointStore(root, background_prune=False)
    store.commit(st)
    info = store.commits(st.seq_id)[0]
    mpath, dpath = info.manifest_path, str(info.data_path)
    folder = os.path.dirname(mpath)
    if case in ("linked_folder", "linked_manifest", "linked_data"):
        CheckpointStore(outside, background_prune=False).commit(st)
        twin = os.path.join(outside, os.path.basename(folder))
        if case == "linked_folder":
            for name in os.listdir(folder):
                os.unlink(os.path.join(folder, name))
            os.rmdir(folder)
            os.symlink(twin, folder)
            return [folder]
        path = mpath if case == "linked_manifest" else dpath
        os.unlink(path)
        os.symlink(os.path.join(twin, os.path.basename(path)), path)
        return [path]
    if case in ("deep_manifest", "huge_int_manifest"):
        with open(mpath, "rb") as f:
            fields = json.loads(f.read())
        if case == "deep_manifest":
            raw = b'{"x": ' + b"[" * 30_000 + b"]" * 30_000 + b"}"
        else:
            fields["position"] = 0  # replaced by 5,000 digits below
            raw = (
                json.dumps(fields).encode().replace(b'"position": 0', b'"position": ' + b"9" * 5000)
            )
        with open(mpath, "wb") as f:
            f.write(raw)
        return [mpath]
    path = mpath if case.startswith("manifest") else dpath
    os.unlink(path)
    if case.endswith("_dir"):
        os.mkdir(path)
    elif case.endswith("_fifo"):
        os.mkfifo(path)
    else:
        msg = f"unknown case {case!r}; expected one of {sorted(HOSTILE_CASES)}"
        raise ValueError(msg)
    return [path]


def reseal_manifest(fields: dict[str, Any]) -> dict[str, Any]:
    """A format-2 manifest object edited by a test, with its ``check`` recomputed (a forged but
    self-consistent manifest, so that the checks behind the check sum are reached)."""
    from linstream.state.store.manifest import _check_of

    body = {k: v for k, v in fields.items() if k != "check"}
    return body | {"check": _check_of(body)}
