"""The one-line API: `embed(texts_or_paths, model=..., emit=...)`, and `Resumable(folder)`.

    from linstream.pipeline import embed
    vectors = embed(["a text", "another one"])               # numpy [2, d_model]
    table = embed(Path("my-texts/"), emit="mean")            # pyarrow Table, one row per chunk
    table, dead = embed(Path("my-texts/"), emit="mean", return_dead_letters=True)

It runs the stateful stage of `linstream embed` itself (`SequenceStage`, with the same
`EmbedStep` and checkpoint commits), in this process, with one key's state held in memory
(`cells.memory_cells`) instead of a runner's: each sequence runs chunk by chunk with its state
carried from one chunk to the next, so a long text or file costs one chunk's memory.  Inputs
are cut and files read by the command line's own code (api_inputs.py).  So the results and the
dead letters are `linstream embed`'s for the same input and options, bit for bit.  Texts and
arrays need no Beam (nothing on their path imports it); reading files goes through Beam's
filesystems.  A progress bar (tqdm) shows where a terminal is attached.  Beam stays the way to
scale out; this is the way to try it.

Dead letters (a file that is not text, an empty one, a chunk the model cannot take) are never
dropped: by default they raise `DeadLetterError` (a ValueError) once every input has run,
carrying them and the others' result; with ``return_dead_letters=True`` the call returns
``(result, dead_letters)``, as Beam's ``with_exception_handling()`` returns the failures
beside the results.  What the caller passes directly (an empty text, token ids outside the
vocabulary) is refused before any work, with a ValueError naming the sequence.

`Resumable(checkpoint_dir, ...)` does the same over a checkpoint folder, in the store and state
format of `linstream embed --checkpoint-dir` (the stage restores, skips, commits and checks
exactly as the job does): each sequence continues from its newest commit, chunks the folder
already holds are skipped (a changed one is a `conflicting_duplicate` dead letter), and the
state is committed every `checkpoint_every` chunks and at each sequence's end.  So an
interrupted call continues where it stopped, a `linstream embed --resume` continues what a call
started, and a call continues what `linstream embed` started (with the same model, tokenizer
and chunk size).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from linstream.pipeline.stage.config import StageConfig
from linstream.pipeline.values import ChunkResult, DeadLetter

from .api_inputs import Source, sources
from .api_results import progress_bar, results_table

__all__ = ["EMITS", "DeadLetterError", "Resumable", "embed"]

#: `emit` values, as `linstream embed --emit`: one vector per sequence (the default here: one
#: row per text, as sentence-transformers' encode), per chunk (mean, last), or per token.
EMITS = ("sequence", "mean", "last", "tokens")


class DeadLetterError(ValueError):
    """Inputs that could not be embedded (a call without ``return_dead_letters=True``).

    ``dead_letters``: the `DeadLetter`s (seq_id, chunk_index, reason, message), as
    `linstream embed` writes them to its ``dead_letters/`` folder.  ``result``: what the other
    inputs gave, in the form the call asked for.
    """

    def __init__(self, dead_letters: list[DeadLetter], result: Any) -> None:
        self.dead_letters = dead_letters
        self.result = result
        counts = Counter(d.reason for d in dead_letters)
        reasons = ", ".join(f"{r} {n}" for r, n in sorted(counts.items()))
        shown = "; ".join(d.message for d in dead_letters[:3])
        more = f"; and {len(dead_letters) - 3} more" if len(dead_letters) > 3 else ""
        msg = (
            f"dead letters: {len(dead_letters)} ({reasons}): {shown}{more}. Pass "
            "return_dead_letters=True to get the other inputs' result beside them (this "
            "error's .result and .dead_letters hold both)"
        )
        super().__init__(msg)


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
    return_dead_letters: bool = False,
    compute_dtype: Any = None,
    threads: int | None = None,
    initial_state: Any = None,
) -> Any:
    """Embed texts, files or token-id arrays; returns a NumPy array or a pyarrow Table.

    inputs: a text; a path (`pathlib.Path`: a file, or a folder whose files are read as
        `linstream embed --input` reads them: compressed files decompressed, a file that is
        not UTF-8 text, unreadable or empty a dead letter); a list of texts, paths or token-id
        arrays; or a mapping from sequence ids to them.  Each text, file or array is one
        sequence.
    model: `builtin:default`, a .safetensors model file, a checkpoint folder in fla's format,
        or a loaded model (`load_model`); the tokenizer defaults to the one it names, as in
        `linstream embed`.
    emit: "sequence" (one vector per sequence, the mean over all its tokens: a float32 array
        [n, d_model], or [d_model] for a single text), or "mean" / "last" / "tokens" (per
        chunk or per token: a pyarrow Table with the columns of `linstream embed`'s results:
        seq_id, chunk_index, start_position, embedding or embeddings; the compute dtype the
        rows were computed in is in its schema metadata, ``b"linstream.compute_dtype"``).
    chunk_tokens, tokenizer, backend, state_dtype: as the `linstream embed` flags of those
        names (the tokenizer defaults to the one the model names, else builtin:bytes).
    as_table: a Table for emit="sequence" too (with each sequence's id).
    progress: a progress bar on stderr; None: where stderr is a terminal.
    return_dead_letters: return ``(result, dead_letters)``, the list of `DeadLetter`s (empty
        for clean input) beside the result; the array form then holds the embedded sequences
        in input order (``as_table=True`` names them).  Without it, dead letters raise
        `DeadLetterError` after every input has run (it holds the result and them).
    compute_dtype: as `linstream embed --compute-dtype` (float32 by default; "bfloat16" for a
        checkpoint folder), for a model given by name or path (with a loaded model: its own mode, or
        ValueError).
    threads: as `linstream embed --threads`: the threads of the kernels (Numba) and of BLAS,
        and the model runtime's row split, in this process from this call on (process-wide,
        as `torch.set_num_threads`; `limit_threads`); None: as they are (every core).
    initial_state: as `linstream embed --initial-state`: a state file (`linstream state
        export`) every sequence starts from, or a mapping of sequence ids to state files; the
        tokens continue the file's position.  A file that is not a state of this model and
        ``state_dtype`` raises `StateFileError` (a ValueError) before any work, with the line
        the command prints.  Not with emit="sequence" (a per-chunk emit: "mean", "last",
        "tokens").

    What is passed directly and cannot be embedded (an empty text, token ids outside the
    model's vocabulary) raises ValueError (or TypeError) naming the sequence, before any work.
    """
    job = _Job.make(
        model, emit, chunk_tokens, tokenizer, backend, state_dtype, compute_dtype, threads
    )
    return job.run(
        inputs,
        StageConfig(emit=emit, initial_state=job.initial_states(initial_state)),
        as_table=as_table,
        progress=progress,
        return_dead_letters=return_dead_letters,
    )


class Resumable:
    """`embed` over a checkpoint folder that `linstream embed --checkpoint-dir` can share.

    ``Resumable("ckpt/", model, emit=...).embed(inputs)`` restores each sequence from its newest
    commit in ``checkpoint_dir``, skips the chunks it holds (a chunk whose content changed since
    is a `conflicting_duplicate` dead letter: "the input for sequence X changed since its
    checkpoint"), embeds the rest and commits every ``checkpoint_every`` chunks and at each
    sequence's final chunk, as `linstream embed --checkpoint-dir ... --resume` does.  The
    result holds what this call embedded; with emit="sequence", every sequence's vector (a
    finished one's from its checkpoint).  Dead letters as in `embed` (``return_dead_letters``).
    ``restore_fallback``: continue past a corrupt newest commit from the one before, as
    `--restore-fallback`.  Another writer of the same sequence (a running job) makes its
    chunks `fenced` dead letters.  ``threads`` and ``initial_state``: as in `embed` (a
    sequence with a commit resumes from it; the file is for the others).  ``keep_every_tokens``:
    as `linstream embed --keep-every-tokens`.
    """

    def __init__(
        self,
        checkpoint_dir: str | os.PathLike[str],
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
        threads: int | None = None,
        initial_state: Any = None,
        keep_every_tokens: int | None = None,
    ) -> None:
        if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int):
            msg = f"checkpoint_every: expected a whole number >= 1, got {checkpoint_every!r}"
            raise ValueError(msg)
        if checkpoint_every < 1:
            msg = f"checkpoint_every: expected a whole number >= 1, got {checkpoint_every}"
            raise ValueError(msg)
        self._job = _Job.make(
            model, emit, chunk_tokens, tokenizer, backend, state_dtype, compute_dtype, threads
        )
        self.checkpoint_dir = os.fspath(checkpoint_dir)
        self._config = StageConfig(
            checkpoint_dir=self.checkpoint_dir,
            checkpoint_every=checkpoint_every,
            resume=True,
            emit=emit,
            restore_fallback=bool(restore_fallback),
            initial_state=self._job.initial_states(initial_state),
            keep_every_tokens=keep_every_tokens,
        )

    def embed(
        self,
        inputs: Any,
        *,
        as_table: bool = False,
        progress: bool | None = None,
        return_dead_letters: bool = False,
    ) -> Any:
        """As `embed(inputs, ...)` with this folder's checkpoints (see the class docstring)."""
        return self._job.run(
            inputs,
            self._config,
            as_table=as_table,
            progress=progress,
            return_dead_letters=return_dead_letters,
        )

    def close(self) -> None:
        """Nothing stays open between calls (each call opens the store and closes it)."""

    def __enter__(self) -> Resumable:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _NoTimer:
    """The idle timer of a sequence the call runs whole: the call ends it itself (`on_idle`)."""

    def set(self, event_time_us: int) -> None:
        pass


@dataclass
class _Job:
    step: Any  # EmbedStep
    emit: str
    chunk_tokens: int
    tokenizer: Any  # TextTokenizer

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
        threads: int | None = None,
    ) -> _Job:
        from linstream.pipeline.io.tokenizers import resolve_tokenizer
        from linstream.pipeline.stage.steps import EmbedStep

        if emit not in EMITS:
            msg = f"emit: expected one of {', '.join(EMITS)}, got {emit!r}"
            raise ValueError(msg)
        if threads is not None:  # before the model is loaded, as `linstream embed` does
            from linstream.ops.model.thread_limit import limit_threads

            limit_threads(threads)
        dtype = np.dtype(state_dtype)
        if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
            msg = f"state_dtype: expected float64 or float32, got {dtype}"
            raise ValueError(msg)
        by_name = isinstance(model, (str, os.PathLike))
        # the step loads a model given by name, in the compute mode (as the job's step does)
        given = os.fspath(model) if by_name else model
        step = EmbedStep(given, backend, dtype, compute_dtype=compute_dtype)
        loaded = step.model
        # Where the model came from (a loaded model's file): the tokenizer its file names.
        source = getattr(loaded, "source", None)
        spec = source if isinstance(source, str) and not source.startswith("<") else None
        tok = resolve_tokenizer(tokenizer, spec)
        vocab = loaded.config.vocab_size
        if loaded.config.input_kind == "tokens" and vocab is not None:
            tok.check_fits(int(vocab), spec or "the model")
        return cls(step, emit, chunk_tokens, tok)

    def initial_states(self, value: Any) -> tuple[tuple[str | None, str], ...]:
        """``initial_state=`` as the stage's pairs, every file read against this job's model
        first (`StateFileError` for a bad one, before any work)."""
        from linstream.pipeline.stage.initial_states import check_files, initial_state_pairs
        from linstream.state.exchange import StateSpec

        pairs = initial_state_pairs(value)
        if pairs:
            check_files(pairs, StateSpec.of(self.step.initial_state("", None)))
        return pairs

    # -- one call -------------------------------------------------------------------------------
    def run(
        self,
        inputs: Any,
        config: StageConfig,
        *,
        as_table: bool,
        progress: bool | None,
        return_dead_letters: bool,
    ) -> Any:
        from linstream.pipeline.stage.sequence_stage import SequenceStage

        model = self.step.model
        todo, single = sources(inputs, self.tokenizer, self.chunk_tokens, model)
        known = [s.tokens for s in todo]
        total = None if any(t is None for t in known) else sum(t or 0 for t in known)
        stage = SequenceStage(self.step, config)
        results: list[ChunkResult] = []
        dead: list[DeadLetter] = []
        bar = progress_bar(total, progress)
        try:
            stage.setup()
            for src in todo:
                self._sequence(stage, src, bar.update, results, dead)
        finally:
            bar.close()
            try:
                stage.finish_bundle()  # every commit durable
            finally:
                stage.teardown()
        width = int(model.config.d_model)
        if self.emit == "sequence" and not as_table:
            found = [r.output for r in results]
            vectors = np.stack(found) if found else np.zeros((0, width), np.float32)
            result: Any = vectors[0] if single and len(found) == 1 else vectors
        else:
            rows = [(r.seq_id, r.index, r.start_position, r.output) for r in results]
            result = results_table(
                rows, width, per_token=self.emit == "tokens", compute_dtype=self.step.compute_dtype
            )
        if return_dead_letters:
            return result, dead
        if dead:
            raise DeadLetterError(dead, result)
        return result

    def _sequence(
        self,
        stage: Any,
        src: Source,
        tick: Callable[[int], Any],
        results: list[ChunkResult],
        dead: list[DeadLetter],
    ) -> None:
        """One sequence through the stage, its key's state in memory: its results and dead
        letters, as the job gives them (a batch job's idle timer ends every sequence)."""
        from linstream.pipeline.stage.cells import memory_cells
        from linstream.pipeline.stage.records import NO_TIMER_US

        cells, timer = memory_cells(), _NoTimer()
        mine: list[ChunkResult] = []
        sent = False
        for item in src.chunks():
            if isinstance(item, DeadLetter):  # the reader's: a file that could not be read
                mine = []  # read part way: the job's reader keeps none of the file
                dead.append(item)
                break
            tick(len(item.data))
            sent = True
            outputs = stage.process(src.seq_id, item, cells, event_time_us=NO_TIMER_US, timer=timer)
            _keep(outputs, mine, dead)
        if sent:
            if self.emit == "sequence" and not mine:
                finished = stage.finished_output(src.seq_id, cells)  # from its checkpoint
                if finished is not None:
                    mine.append(finished)
            _keep(stage.on_idle(src.seq_id, cells), mine, dead)
        results += mine


def _keep(outputs: Iterable[Any], results: list[ChunkResult], dead: list[DeadLetter]) -> None:
    for out in outputs:
        if isinstance(out, DeadLetter):
            dead.append(out)
        else:
            results.append(out)
