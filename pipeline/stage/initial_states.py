"""The state files a job's sequences start from (`--initial-state`, ``embed(initial_state=)``).

`InitialStates` holds the job's choice: one file for every sequence (a shared preamble computed
once), and files for named sequences (``SEQ=FILE``).  `for_sequence` gives the state a sequence
without a commit starts from: the file's state, read with every check of
``linstream.state.exchange`` against the step's own state spec (its zero state's tensors, dtype
and model fingerprint), renamed to the sequence, at the file's position (tokens go on being
counted from there: a position-dependent model continues as it would) and chunk 0 of the new
input.  Each file is read once per process (and checked once per spec).

`parse_initial_state` reads the flag's values; `check_files` reads every file against a spec
before a job starts, so that a bad one is one line before any work.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from typing import Any

from linstream.state import SequenceState
from linstream.state.exchange import StateSpec, read_state_file

__all__ = [
    "InitialStates",
    "check_files",
    "initial_state_pairs",
    "model_spec",
    "parse_initial_state",
]


def parse_initial_state(values: Iterable[str]) -> tuple[tuple[str | None, str], ...]:
    """``--initial-state`` values: ``FILE`` (every sequence) or ``SEQ=FILE`` (that sequence);
    ``=FILE`` is every sequence too (a file whose name holds ``=``).  ValueError for an empty
    file name or two files for one sequence."""
    out: dict[str | None, str] = {}
    for value in values:
        seq, sep, path = value.partition("=")
        key: str | None = seq if sep and seq else None
        path = path if sep else value
        if not path:
            msg = f"--initial-state {value!r}: expected FILE or SEQ=FILE, got no file"
            raise ValueError(msg)
        if key in out and out[key] != path:
            who = "every sequence" if key is None else f"sequence {key!r}"
            msg = f"--initial-state: expected one file for {who}, got {out[key]} and {path}"
            raise ValueError(msg)
        out[key] = path
    return tuple(out.items())


def initial_state_pairs(value: Any) -> tuple[tuple[str | None, str], ...]:
    """``embed(initial_state=...)``: a path (every sequence) or a mapping of sequence ids to
    paths (TypeError for anything else)."""
    if value is None:
        return ()
    if isinstance(value, str | os.PathLike):
        return ((None, os.fspath(value)),)
    if isinstance(value, Mapping):
        pairs = []
        for k, v in value.items():
            if not isinstance(k, str) or not isinstance(v, str | os.PathLike):
                msg = (
                    "initial_state: expected a path or a mapping of sequence ids to paths, got "
                    f"{k!r:.40}: {v!r:.40}"
                )
                raise TypeError(msg)
            pairs.append((k, os.fspath(v)))
        return tuple(pairs)
    msg = (
        "initial_state: expected a path or a mapping of sequence ids to paths, got "
        f"{type(value).__name__}"
    )
    raise TypeError(msg)


def check_files(pairs: Iterable[tuple[str | None, str]], spec: StateSpec) -> None:
    """Read every file against ``spec`` (StateFileError, one line, for the first bad one)."""
    for _seq, path in pairs:
        read_state_file(path, spec)


def model_spec(model: Any, state_dtype: Any) -> StateSpec:
    """The spec of a loaded model's state (`StreamingModel.state_layout`) in ``state_dtype``:
    what the stage's step carries for it."""
    zero = SequenceState.initial("", model.state_layout(), str(model.fingerprint), state_dtype)
    return StateSpec.of(zero)


class InitialStates:
    """The files of a job's ``initial_state`` pairs (see the module docstring)."""

    def __init__(self, pairs: Iterable[tuple[str | None, str]]) -> None:
        self.files = dict(pairs)
        self._read: dict[tuple[str, StateSpec], SequenceState] = {}

    def __bool__(self) -> bool:
        return bool(self.files)

    def path_for(self, seq_id: str) -> str | None:
        return self.files.get(seq_id, self.files.get(None))

    def for_sequence(self, seq_id: str, zero: SequenceState) -> SequenceState | None:
        """The state ``seq_id`` starts from (None: no file for it); ``zero``: the step's zero
        state for it (its spec is what the file must hold).  StateFileError for a bad file."""
        path = self.path_for(seq_id)
        if path is None:
            return None
        spec = StateSpec.of(zero)
        st = self._read.get((path, spec))
        if st is None:
            st = self._read[(path, spec)] = read_state_file(path, spec)
        return dataclasses.replace(st, seq_id=seq_id, next_chunk=0)
