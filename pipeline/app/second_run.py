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
  Whatever the mode, one results folder holds one schema and one model: the folder's record
  (`linstream.pipeline.io.output_record`) says which, and rows of another `--emit`, width or
  model are refused, not mixed in.
--checkpoint-dir: a store that holds checkpoints needs `--resume` (a job without it would start
  every sequence again at chunk 0 over a history the store already has); with it, chunks the
  store holds are skipped and a changed chunk is a `conflicting_duplicate` dead letter.

`OutputPlan.rows_written()` counts, after the run, the rows of the result files this job added.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from linstream.pipeline.errors import UsageError
from linstream.pipeline.io.output_record import (
    RECORD_NAME,
    OutputRecord,
    clear_output,
    output_contents,
    read_record,
    result_rows,
    write_record,
)
from linstream.state import CheckpointStore

from .options import EMIT_CHOICES, EmbedConfig

__all__ = ["OutputPlan", "check_checkpoint_dir", "prepare_output"]


def check_checkpoint_dir(config: EmbedConfig) -> None:
    """Refuse a checkpoint store that already holds sequences when `--resume` is not given."""
    if not config.checkpoint_dir or config.resume:
        return
    store = CheckpointStore(config.checkpoint_dir, background_prune=False)
    try:
        held = store.sequences() if store.exists() else []
    finally:
        store.close()
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
    """An output folder checked for this job: the result files it held before the run."""

    output: str
    before: frozenset[str]

    def rows_written(self) -> int:
        """Rows of the result files that appeared under ``results/`` since the check."""
        contents = output_contents(self.output)
        new = [p for p in contents.result_files if p not in self.before]
        return result_rows(contents, new)


def prepare_output(config: EmbedConfig, model: Any) -> OutputPlan:
    """Apply the `--output-mode` rules to ``config.output`` for rows of ``model``; write the
    folder's record.  UsageError (nothing deleted) when the folder cannot take this job's rows."""
    out = str(config.output)
    mode = config.output_mode
    if mode == "overwrite" and config.resume:
        msg = (
            "--output-mode overwrite with --resume would delete the results of the chunks the "
            "checkpoints hold, which a resumed job skips and does not write again; use another "
            "--output, or drop --resume to start over in an empty --checkpoint-dir"
        )
        raise UsageError(msg)
    width = int(model.config.d_model)
    mine = OutputRecord.for_job(config.emit, width, config.model, str(model.fingerprint))
    try:
        contents = output_contents(out)
        held = read_record(out)
    except ValueError as ex:  # a malformed record
        msg = f"--output {out}: {ex}; use another --output, or --output-mode overwrite"
        raise UsageError(msg) from ex
    if mode == "overwrite":
        clear_output(out)
        before: frozenset[str] = frozenset()
    else:
        if not contents.empty and mode == "new" and not config.resume:
            resume = " or --resume to continue the job" if config.checkpoint_dir else ""
            msg = (
                f"--output {out} already holds the results of an earlier job "
                f"({contents.describe()}); use another --output, --output-mode append to add "
                f"this job's rows to them, --output-mode overwrite to replace them{resume}"
            )
            raise UsageError(msg)
        if held is None and contents.result_files:  # a folder from before records
            schema = contents.results_schema()
            held = None if schema is None else OutputRecord.of_schema(schema)
        if held is not None and not contents.empty:
            _check_fits(out, held, mine)
        before = frozenset(contents.result_files)
    write_record(out, mine)
    return OutputPlan(out, before)


def _check_fits(out: str, held: OutputRecord, mine: OutputRecord) -> None:
    """Refuse rows of another schema, emit or model than those ``out`` holds."""
    fix = "use another --output, or --output-mode overwrite to replace them"
    if held.columns != mine.columns or (held.emit in EMIT_CHOICES and held.emit != mine.emit):
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
