"""What `linstream embed` does when its folders are not empty: the rules of a second run.

Checked where the job is launched, before anything runs or is deleted (a refusal is a usage
error: one line, exit status 2, naming the folder and the flag that would proceed):

--output (its ``results/`` and ``dead_letters/``), by `--output-mode`:
  new        (the default) a folder that holds results or dead letters is refused, unless
             `--resume` continues the job that wrote them there (as `append`);
  append     this job's rows are added to those there;
  overwrite  ``results/``, ``dead_letters/`` and the folder's record are deleted first (nothing
             else in the folder); refused with `--resume`, whose skipped chunks would then have
             no results anywhere.
  Whatever the mode, one results folder holds one schema, one model and one chunking: the
  folder's record (`linstream.pipeline.io.output_record`) says which, and rows of another
  `--emit`, width, model or `--chunk-tokens` are refused, not mixed in.
--checkpoint-dir: a store that holds checkpoints needs `--resume` (a job without it would start
  every sequence again at chunk 0 over a history the store already has); with it, chunks the
  store holds are skipped and a changed chunk is a `conflicting_duplicate` dead letter.

`check_output_folder` applies the rules that need no model and `OutputFolder.plan` the rest
(reading only); `OutputPlan.apply()` deletes (overwrite) and writes the folder's record right
before the run; `OutputPlan.rows_written()` counts, after the
run, the rows of the result files this job added.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from linstream.pipeline.errors import UsageError
from linstream.pipeline.io.output_record import (
    RECORD_NAME,
    OutputContents,
    OutputRecord,
    clear_output,
    output_contents,
    read_record,
    result_rows,
    write_record,
)
from linstream.pipeline.stage.config import EMIT_MODES

if TYPE_CHECKING:
    from linstream.state import CheckpointStore

    from .options import EmbedConfig

__all__ = ["OutputFolder", "OutputPlan", "check_checkpoint_dir", "check_output_folder"]


def check_checkpoint_dir(config: EmbedConfig, store: CheckpointStore) -> None:
    """Refuse a checkpoint store (``config.checkpoint_dir``, opened by the caller) that already
    holds sequences when `--resume` is not given."""
    if config.resume:
        return
    held = store.sequences() if store.exists() else []
    if held:
        ckpt = config.checkpoint_dir
        msg = (
            f"--checkpoint-dir {ckpt} already holds checkpoints of {len(held):,} sequence(s) "
            f"(e.g. {held[0]!r}); add --resume to continue them (the chunks they hold are "
            "skipped), or use an empty --checkpoint-dir"
        )
        raise UsageError(msg)


@dataclass(frozen=True)
class OutputPlan:
    """An output folder checked for this job (`check_output`): what `apply` does to it before
    the run, and the result files it held."""

    output: str
    record: OutputRecord
    overwrite: bool
    before: frozenset[str]

    def apply(self) -> None:
        """Right before the run: `--output-mode overwrite` deletes the folder's own parts, and
        the folder's record is written (the folder made)."""
        if self.overwrite:
            clear_output(self.output)
        write_record(self.output, self.record)

    def rows_written(self) -> int:
        """Rows of the result files that appeared under ``results/`` since the check."""
        contents = output_contents(self.output)
        new = [p for p in contents.result_files if p not in self.before]
        return result_rows(contents, new)


@dataclass(frozen=True)
class OutputFolder:
    """What ``--output`` held when it was checked (`check_output_folder`)."""

    config: EmbedConfig
    contents: OutputContents | None  # None: --output-mode overwrite (not looked into)
    held: OutputRecord | None

    def plan(self, model: Any, *, chunk_tokens: int | None) -> OutputPlan:
        """The folder's plan for rows of ``model``, cut into chunks of ``chunk_tokens`` tokens
        (None: the input came as chunks): UsageError when the folder holds rows of another
        schema, model or chunking."""
        config = self.config
        width = int(model.config.d_model)
        mine = OutputRecord.for_job(
            config.emit,
            width,
            config.model,
            str(model.fingerprint),
            chunk_tokens,
            str(config.compute_dtype),
        )
        out = str(config.output)
        if self.contents is None:
            return OutputPlan(out, mine, True, frozenset())
        held = self.held
        if held is None and self.contents.result_files:  # a folder from before records
            schema = self.contents.results_schema()
            held = None if schema is None else OutputRecord.of_schema(schema)
        if held is not None and not self.contents.empty:
            _check_fits(out, held, mine, resume=bool(config.resume))
            if set(mine.compute_dtypes) - set(held.compute_dtypes):  # a resume in a new mode
                mine = replace(mine, compute_dtypes=held.compute_dtypes + mine.compute_dtypes)
        return OutputPlan(out, mine, False, frozenset(self.contents.result_files))


def check_output_folder(config: EmbedConfig) -> OutputFolder:
    """The `--output-mode` rules that need no model (UsageError): overwrite with `--resume`; a
    malformed record; a folder that holds results when the mode is `new` and the job does not
    resume.  Reads only; `OutputFolder.plan` checks the rows' fit once the model is loaded."""
    out = str(config.output)
    mode = config.output_mode
    if mode == "overwrite" and config.resume:
        msg = (
            "--output-mode overwrite with --resume would delete the results of the chunks the "
            "checkpoints hold, which a resumed job skips and does not write again; use another "
            "--output, or drop --resume to start over in an empty --checkpoint-dir"
        )
        raise UsageError(msg)
    if mode == "overwrite":
        return OutputFolder(config, None, None)
    try:
        contents = output_contents(out)
        held = read_record(out)
    except ValueError as ex:  # a malformed record
        msg = f"--output {out}: {ex}; use another --output, or --output-mode overwrite"
        raise UsageError(msg) from ex
    if not contents.empty and mode == "new" and not config.resume:
        resume = " or --resume to continue the job" if config.checkpoint_dir else ""
        msg = (
            f"--output {out} already holds the results of an earlier job "
            f"({contents.describe()}); use another --output, --output-mode append to add "
            f"this job's rows to them, --output-mode overwrite to replace them{resume}"
        )
        raise UsageError(msg)
    return OutputFolder(config, contents, held)


def _check_fits(out: str, held: OutputRecord, mine: OutputRecord, *, resume: bool) -> None:
    """Refuse rows of another schema, emit or model than those ``out`` holds, and rows of
    another compute dtype unless the job resumes its checkpoints (which continue in any mode)."""
    fix = "use another --output, or --output-mode overwrite to replace them"
    if held.columns != mine.columns or (held.emit in EMIT_MODES and held.emit != mine.emit):
        msg = (
            f"--output {out} holds results written with {held.describe()}; this job writes "
            f"{mine.describe()}: one results folder holds one schema ({RECORD_NAME}); {fix}"
        )
        raise UsageError(msg)
    if held.fingerprint and held.fingerprint != mine.fingerprint:
        msg = (
            f"--output {out} holds embeddings of model {held.model} (fingerprint "
            f"{held.fingerprint[:12]}), this job's model is {mine.model} (fingerprint "
            f"{mine.fingerprint[:12]}): embeddings of two models do not mix in one folder; {fix}"
        )
        raise UsageError(msg)
    if held.compute_dtypes and not resume and held.compute_dtypes != mine.compute_dtypes:
        modes = " and ".join(held.compute_dtypes)
        same = f"--compute-dtype {modes}, " if len(held.compute_dtypes) == 1 else ""
        msg = (
            f"--output {out} holds embeddings computed in {modes}; this job computes in "
            f"{' and '.join(mine.compute_dtypes)} (--compute-dtype): rows of two compute dtypes "
            f"differ and nothing in a row says which it is ({RECORD_NAME}); use {same}another "
            f"--output, or --output-mode overwrite to replace them"
        )
        raise UsageError(msg)
    if (
        None not in (held.chunk_tokens, mine.chunk_tokens)
        and held.chunk_tokens != mine.chunk_tokens
    ):
        msg = (
            f"--output {out} holds chunks of {held.chunk_tokens:,} tokens (--chunk-tokens "
            f"{held.chunk_tokens}); this job cuts chunks of {mine.chunk_tokens:,}: one chunk index "
            f"would name two spans of a sequence ({RECORD_NAME}); use --chunk-tokens "
            f"{held.chunk_tokens}, another --output, or --output-mode overwrite to replace them"
        )
        raise UsageError(msg)
