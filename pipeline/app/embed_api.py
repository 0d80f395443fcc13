"""The one-line API: `embed(texts_or_paths, model=..., emit=...)`, and `Resumable(folder)`.

    from linstream.pipeline import embed
    vectors = embed(["a text", "another one"])               # numpy [2, d_model]
    table = embed(Path("my-texts/"), emit="mean")            # pyarrow Table, one row per chunk

The same model runtime, model files, tokenizers and chunking as `linstream embed`, in this
process, without Beam (nothing here imports it): each sequence runs chunk by chunk with its
state carried from one chunk to the next, so a long text or file costs one chunk's memory (a
file read by the built-in byte tokenizer is read one chunk at a time).  Results are bit-equal to
`linstream embed`'s for the same input and options.  A progress bar (tqdm) shows where a
terminal is attached.  Beam stays the way to scale out; this is the way to try it.

`Resumable(checkpoint_dir, ...)` does the same over a checkpoint folder, in the store and state
format of `linstream embed --checkpoint-dir`: each sequence continues from its newest commit,
chunks the folder already holds are skipped (a changed one raises), and the state is committed
every `checkpoint_every` chunks and at each sequence's end.  So an interrupted call continues
where it stopped, a `linstream embed --resume` continues what a call started, and a call
continues what `linstream embed` started (with the same model, tokenizer and chunk size).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from .api_inputs import Source, sources
from .api_results import progress_bar, results_table

__all__ = ["EMITS", "Resumable", "embed"]

#: `emit` values, as `linstream embed --emit`: one vector per sequence (the default here: one
#: row per text, as sentence-transformers' encode), per chunk (mean, last), or per token.
EMITS = ("sequence", "mean", "last", "tokens")
#: Tokens run through the model at a time inside a chunk (the stage's block, for equal bits).
_BLOCK_TOKENS = 8192


def embed(
    inputs: Any,
    model: Any = "builtin:default",
    *,
    emit: str = "sequence",
    chunk_tokens: int = 2048,
    tokenizer: str | None = None,
    backend: str = "auto",
    state_dtype: Any = np.float64,
    as_table: bool = False,
    progress: bool | None = None,
    compute_dtype: Any = None,
) -> Any:
    """Embed texts, files or token-id arrays; returns a NumPy array or a pyarrow Table.

    inputs: a text; a path (`pathlib.Path`: a file, or a folder whose files are read as
        `linstream embed --input` reads them); a list of texts, paths or token-id arrays; or a
        mapping from sequence ids to them.  Each text, file or array is one sequence.
    model: `builtin:default`, a .safetensors model file, or a loaded model (`load_model`); the
        tokenizer defaults to the one its file names, as in `linstream embed`.
    emit: "sequence" (one vector per sequence, the mean over all its tokens: a float32 array
        [n, d_model], or [d_model] for a single text), or "mean" / "last" / "tokens" (per
        chunk or per token: a pyarrow Table with the columns of `linstream embed`'s results:
        seq_id, chunk_index, start_position, embedding or embeddings).
    chunk_tokens, tokenizer, backend, state_dtype: as the `linstream embed` flags of those
        names (the tokenizer defaults to the one the model names, else builtin:bytes).
    as_table: a Table for emit="sequence" too (with each sequence's id).
    progress: a progress bar on stderr; None: where stderr is a terminal.
    compute_dtype: as `linstream embed --compute-dtype` (float32 by default; "bfloat16" for a
        checkpoint folder); for a model given by name (a loaded model keeps its own).

    Bad input raises ValueError (or TypeError) naming the sequence, before any work.
    """
    job = _Job.make(model, emit, chunk_tokens, tokenizer, backend, state_dtype, compute_dtype)
    return job.run(inputs, as_table=as_table, progress=progress)


class Resumable:
    """`embed` over a checkpoint folder that `linstream embed --checkpoint-dir` can share.

    ``Resumable("ckpt/", model, emit=...).embed(inputs)`` restores each sequence from its newest
    commit in ``checkpoint_dir``, skips the chunks it holds (a chunk whose content changed since
    raises ValueError: "the input for sequence X changed since its checkpoint"), embeds the
    rest and commits every ``checkpoint_every`` chunks and at each sequence's final chunk.  The
    result holds what this call embedded; with emit="sequence", every sequence's vector (a
    finished one's from its checkpoint).  ``restore_fallback``: continue past a corrupt newest
    commit from the one before, as `--restore-fallback`.  Another writer of the same sequence
    (a running job) makes the commit raise (`DivergentStateError`).
    """

    def __init__(
        self,
        checkpoint_dir: str,
        model: Any = "builtin:default",
        *,
        emit: str = "sequence",
        chunk_tokens: int = 2048,
        tokenizer: str | None = None,
        backend: str = "auto",
        state_dtype: Any = np.float64,
        checkpoint_every: int = 16,
        restore_fallback: bool = False,
        compute_dtype: Any = None,
    ) -> None:
        from linstream.state import CheckpointStore

        if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int):
            msg = f"checkpoint_every: expected a whole number >= 1, got {checkpoint_every!r}"
            raise ValueError(msg)
        if checkpoint_every < 1:
            msg = f"checkpoint_every: expected a whole number >= 1, got {checkpoint_every}"
            raise ValueError(msg)
        self._job = _Job.make(
            model, emit, chunk_tokens, tokenizer, backend, state_dtype, compute_dtype
        )
        self.checkpoint_dir = str(checkpoint_dir)
        self._store = CheckpointStore(self.checkpoint_dir)
        self._every = checkpoint_every
        self._fallback = bool(restore_fallback)

    def embed(self, inputs: Any, *, as_table: bool = False, progress: bool | None = None) -> Any:
        """As `embed(inputs, ...)` with this folder's checkpoints (see the class docstring)."""
        store = _Store(self._store, self._every, self._fallback)
        try:
            return self._job.run(inputs, as_table=as_table, progress=progress, store=store)
        finally:
            self._store.flush()

    def close(self) -> None:
        self._store.close()

    def __enter__(self) -> Resumable:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class _Store:
    store: Any
    every: int
    fallback: bool


@dataclass
class _Sequence:
    """One sequence's state while it runs: what a commit records, and its outputs."""

    seq_id: str
    state: Any
    window: Any
    next_chunk: int = 0
    final_index: int = -1
    commit_no: int = 0
    committed_next: int = 0
    committed_position: int = 0
    total: np.ndarray | None = None  # emit="sequence": the float64 sum of its outputs
    rows: list[tuple[int, int, np.ndarray]] = field(default_factory=list)
    vector: np.ndarray | None = None  # emit="sequence": its mean, once it is finished
    digest: bytes = b""  # the content digest of the chunk being applied


@dataclass
class _Job:
    model: Any
    emit: str
    chunk_tokens: int
    tokenizer: Any
    backend: str
    state_dtype: np.dtype

    @classmethod
    def make(
        cls,
        model: Any,
        emit: str,
        chunk_tokens: int,
        tokenizer: str | None,
        backend: str,
        state_dtype: Any,
        compute_dtype: Any = None,
    ) -> _Job:
        from linstream.ops import load_model
        from linstream.pipeline.io.tokenizers import TextTokenizer, resolve_tokenizer

        if emit not in EMITS:
            msg = f"emit: expected one of {', '.join(EMITS)}, got {emit!r}"
            raise ValueError(msg)
        by_name = isinstance(model, (str, os.PathLike))
        compute = np.float32 if compute_dtype is None else compute_dtype
        loaded = load_model(os.fspath(model), compute_dtype=compute) if by_name else model
        # Where the model came from (a loaded model's file): the tokenizer its file names.
        source = getattr(loaded, "source", None)
        spec = source if isinstance(source, str) and not source.startswith("<") else None
        tok = resolve_tokenizer(tokenizer, spec)
        vocab = loaded.config.vocab_size
        if loaded.config.input_kind == "tokens" and vocab is not None:
            tok.check_fits(int(vocab), spec or "the model")
        dtype = np.dtype(state_dtype)
        if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
            msg = f"state_dtype: expected float64 or float32, got {dtype}"
            raise ValueError(msg)
        assert isinstance(tok, TextTokenizer)
        return cls(loaded, emit, chunk_tokens, tok, backend, dtype)

    # -- one call -------------------------------------------------------------------------------
    def run(
        self,
        inputs: Any,
        *,
        as_table: bool,
        progress: bool | None,
        store: _Store | None = None,
    ) -> Any:
        todo, single = sources(inputs, self.tokenizer, self.chunk_tokens, self.model)
        known = [s.tokens for s in todo]
        total = None if any(t is None for t in known) else sum(t or 0 for t in known)
        bar = progress_bar(total, progress)
        try:
            done = [self._sequence(src, store, bar.update) for src in todo]
        finally:
            bar.close()
        if self.emit == "sequence" and not as_table:
            found = [d.vector for d in done if d.vector is not None]
            vectors = np.stack(found) if found else np.zeros((0, self.width), np.float32)
            return vectors[0] if single else vectors
        return self._table(done)

    @property
    def width(self) -> int:
        return int(self.model.config.d_model)

    def _sequence(self, src: Source, store: _Store | None, tick: Callable[[int], Any]) -> _Sequence:
        seq = self._restore(src.seq_id, store)
        for idx, data, final in src.chunks():
            tick(len(data))
            if self._skip(seq, idx, data, final):
                continue
            self._apply(seq, idx, data, final)
            due = seq.state.next_chunk - seq.committed_next >= (store.every if store else 1)
            if store is not None and (due or final):
                self._commit(seq, store)
        if self.emit == "sequence" and seq.vector is None and seq.final_index >= 0:
            seq.vector = self._finished_vector(seq)
        return seq

    # -- restore, skip, apply, commit: as the stateful stage does them ---------------------------
    def _restore(self, seq_id: str, store: _Store | None) -> _Sequence:
        from linstream.pipeline.stage.digests import DigestWindow
        from linstream.state import SequenceState

        shape = tuple(int(n) for n in self.model.state_shape)
        fingerprint = str(self.model.fingerprint)
        head, where = None, ""
        if store is not None:
            where = store.store.root
            head = store.store.head(
                seq_id, fingerprint=fingerprint, fallback=store.fallback, expected_shape=shape
            )
        if head is None:
            st = SequenceState.initial(seq_id, shape, fingerprint, dtype=self.state_dtype)
            return _Sequence(seq_id, st, DigestWindow(None))
        st, hist = head.state, head.history
        total = np.frombuffer(hist.output_sum, "<f8").copy() if hist.output_sum else None
        if self.emit == "sequence" and total is None and st.position > 0:
            msg = (
                f"sequence {seq_id!r}: its checkpoint in {where} was made with "
                "another emit than 'sequence', so the mean over all its tokens cannot be formed; "
                "use emit='mean' (or 'last', 'tokens'), or an empty checkpoint folder"
            )
            raise ValueError(msg)
        return _Sequence(
            seq_id,
            st,
            DigestWindow(hist.digests),
            next_chunk=st.next_chunk,
            final_index=hist.final_chunk,
            commit_no=max(hist.commit, head.newest_commit),
            committed_next=st.next_chunk,
            committed_position=st.position,
            total=total,
        )

    def _skip(self, seq: _Sequence, idx: int, data: np.ndarray, final: bool) -> bool:
        """Whether chunk ``idx`` is one the sequence holds already (checked against its digest)."""
        from linstream.pipeline.stage.digests import chunk_digest

        if seq.final_index >= 0 and idx > seq.final_index:
            msg = (
                f"the input for sequence {seq.seq_id!r} changed since its checkpoint: it was "
                f"finished at chunk {seq.final_index}, and the input now has chunk {idx}"
            )
            raise ValueError(msg)
        if idx >= seq.state.next_chunk:
            seq.digest = chunk_digest(data, final)
            return False
        applied = seq.window.get(idx, seq.state.next_chunk)
        if applied is not None and applied != chunk_digest(data, final):
            msg = (
                f"the input for sequence {seq.seq_id!r} changed since its checkpoint (chunk "
                f"{idx} differs from the one applied: other content or another final flag)"
            )
            raise ValueError(msg)
        return True

    def _apply(self, seq: _Sequence, idx: int, data: np.ndarray, final: bool) -> None:
        from linstream.state import SequenceState

        st = seq.state
        layers = st.layers()
        n = len(data)
        parts: list[np.ndarray] = []
        total: np.ndarray | None = None
        out = np.zeros(0, np.float32)
        for lo in range(0, n, _BLOCK_TOKENS):
            out, layers = self.model.embed_chunk(
                data[lo : lo + _BLOCK_TOKENS], layers, backend=self.backend
            )
            if not (np.isfinite(out).all() and all(np.isfinite(a.S).all() for a in layers)):
                msg = (
                    f"sequence {seq.seq_id!r}, chunk {idx}: the result overflowed to Inf or NaN "
                    "(inputs too large)"
                )
                raise ValueError(msg)
            if self.emit == "tokens":
                parts.append(out)
            elif self.emit in ("mean", "sequence"):
                s = out.sum(axis=0, dtype=np.float64)
                total = s if total is None else total + s
            else:
                parts = [out[-1:]]
        fp = str(self.model.fingerprint)
        seq.state = SequenceState.from_layers(seq.seq_id, st.position + n, idx + 1, layers, fp)
        seq.window.push(seq.digest)
        if final:
            seq.final_index = idx
        if self.emit == "sequence":
            assert total is not None
            seq.total = total if seq.total is None else seq.total + total
            if final:
                seq.vector = (seq.total / seq.state.position).astype(np.float32)
            return
        if self.emit == "mean":
            assert total is not None
            emitted = np.asarray(total / n, dtype=out.dtype)
        elif self.emit == "last":
            emitted = np.ascontiguousarray(parts[0][0])
        else:
            emitted = parts[0] if len(parts) == 1 else np.concatenate(parts)
        seq.rows.append((idx, st.position, emitted))

    def _commit(self, seq: _Sequence, store: _Store) -> None:
        from linstream.state import CommitOutcome, History

        st = seq.state
        outsum = b""
        if self.emit == "sequence" and seq.total is not None:
            outsum = np.ascontiguousarray(seq.total, "<f8").tobytes()
        history = History(
            seq.commit_no + 1,
            seq.committed_position,
            seq.final_index if 0 <= seq.final_index < st.next_chunk else -1,
            seq.window.data,
            None,
            outsum,
        )
        outcome = store.store.commit(st, history)  # DivergentStateError: another writer
        if outcome == CommitOutcome.EQUAL_WITHIN_TOLERANCE:  # a twin's commit: go on from it
            kept = store.store.read_chain(
                seq.seq_id, history.commit, fingerprint=str(self.model.fingerprint)
            )
            seq.state = kept.state
        seq.commit_no = history.commit
        seq.committed_next = seq.state.next_chunk
        seq.committed_position = seq.state.position

    def _finished_vector(self, seq: _Sequence) -> np.ndarray:
        """The mean of a sequence that its checkpoint holds whole."""
        assert seq.total is not None
        return (seq.total / seq.state.position).astype(np.float32)

    # -- the result -----------------------------------------------------------------------------
    def _table(self, done: list[_Sequence]) -> pa.Table:
        """The rows as `linstream embed` writes them (its results' schema and column order)."""
        if self.emit == "sequence":
            rows = [(d.seq_id, d.final_index, 0, d.vector) for d in done if d.vector is not None]
        else:
            rows = [(d.seq_id, i, p, v) for d in done for i, p, v in d.rows]
        return results_table(rows, self.width, per_token=self.emit == "tokens")
