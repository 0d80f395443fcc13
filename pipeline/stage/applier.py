"""Applying one chunk to a sequence's state: bounded work, refusals with a reason, counters.

A chunk longer than ``max_chunk_tokens`` is refused (``too_large``) before anything is allocated
for it; a shorter one runs through the step in blocks of ``block_tokens`` tokens, each block
continuing the state of the one before (exactly what sending those blocks as chunks would do),
so the step's working memory is bounded by a block whatever the chunk's length.  The chunk's own
output (one vector per token with ``emit="tokens"``) is what remains proportional to its length;
with ``mean``/``last`` the blocks are reduced as they go.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from linstream.pipeline.values import ChunkResult
from linstream.state import SequenceState, pack_layers, pack_state

from .counters import Counters
from .progress import Progress
from .steps import BadInput, ChunkStep

__all__ = ["Applied", "Applier", "Refused", "Working", "is_int"]


def is_int(x: Any) -> bool:
    return isinstance(x, int | np.integer) and not isinstance(x, bool | np.bool_)


class Working:
    """A sequence's state after a chunk, kept as the step's per-layer states: packed for Beam
    state straight from the layers (`pack_layers`: no stacked copy), stacked into one
    `SequenceState` only when one is asked for (a commit), and continued from by the next
    chunk as it is.  A step whose state has a form of its own (``stacks_layers`` False), or
    layers `pack_layers` does not take, get the state built at once."""

    def __init__(
        self,
        step: ChunkStep,
        before: SequenceState | Working,
        layers: list[Any],
        tokens: int,
        next_chunk: int,
    ) -> None:
        self.step, self.layers = step, layers
        self.seq_id: str = before.seq_id
        self.position: int = before.position + tokens
        self.next_chunk: int = next_chunk
        self._state: SequenceState | None = None
        self._packed = (
            pack_layers(self.seq_id, self.position, next_chunk, layers, step.fingerprint)
            if step.stacks_layers
            else None
        )
        if self._packed is None:  # raises ValueError / TypeError as the step's `advanced` does
            self._state = step.advanced(
                as_state(before), layers, tokens=tokens, next_chunk=next_chunk
            )

    def state(self) -> SequenceState:
        if self._state is None:
            self._state = SequenceState.from_layers(
                self.seq_id, self.position, self.next_chunk, self.layers, self.step.fingerprint
            )
        return self._state

    def pack(self) -> bytes:
        """The state's working-copy bytes (those of `pack_state(state())`)."""
        return self._packed if self._packed is not None else pack_state(self.state())


def as_state(st: SequenceState | Working) -> SequenceState:
    return st.state() if isinstance(st, Working) else st


@dataclass
class Applied:
    state: Working
    result: ChunkResult


@dataclass
class Refused:
    reason: str
    message: str


def _slice(data: Any, lo: int, hi: int) -> Any:
    if isinstance(data, Mapping):
        return {k: v[lo:hi] for k, v in data.items()}
    return data[lo:hi]


def _all_finite(out: Any, layers: Any) -> bool:
    """Finite outputs and states (per layer: an AttentionState's S and z, or named arrays)."""
    return bool(np.isfinite(out).all()) and all(
        bool(np.isfinite(a).all())
        for layer in layers
        for a in (layer.values() if isinstance(layer, Mapping) else (layer.S, layer.z))
    )


#: Diagnostic: when set, every applied chunk appends "seq_id<TAB>chunk_index" to this file (the
#: crash harness counts the chunks a stopped job had applied but not committed).
TRACE_ENV = "LINSTREAM_TRACE_APPLIED"


class Applier:
    """Runs a step over one chunk (see the module docstring)."""

    def __init__(
        self,
        step: ChunkStep,
        counters: Counters,
        progress: Progress,  # linstream.pipeline.stage.progress
        *,
        emit: str,
        max_chunk_tokens: int,
        block_tokens: int,
    ) -> None:
        self.step, self.m, self.progress = step, counters, progress
        self.emit, self.max_tokens, self.block = emit, max_chunk_tokens, block_tokens
        trace = os.environ.get(TRACE_ENV)
        self._trace = (
            os.open(trace, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if trace else None
        )

    def apply(
        self, seq_id: str, idx: int, data: Any, st: SequenceState | Working | None
    ) -> Applied | Refused:
        n = self.step.tokens(data)
        if n > self.max_tokens:
            return Refused(
                "too_large",
                f"expected at most {self.max_tokens:,} tokens in a chunk (max_chunk_tokens), "
                f"got {n:,}; split it into smaller chunks",
            )
        try:
            if st is None:
                st = self.step.initial_state(seq_id, data)
        except (ValueError, TypeError) as ex:  # e.g. a zero-sized head or width
            return Refused("bad_shape", f"{type(ex).__name__}: {ex}")
        parts: list[np.ndarray] = []
        total: np.ndarray | None = None
        t0 = time.perf_counter()
        try:
            if isinstance(st, Working) and self.step.stacks_layers:
                layers = st.layers  # the previous chunk's, as the step returned them
            else:
                layers = self.step.carried(as_state(st))
            for lo in range(0, n, self.block):
                out, layers = self.step.apply(_slice(data, lo, min(n, lo + self.block)), layers)
                if not _all_finite(out, layers):
                    # Finite inputs can still overflow (values near the float range): the chunk
                    # is refused and the sequence keeps the state it had before it.
                    return Refused(
                        "non_finite",
                        "expected finite outputs and state, but the chunk's result overflowed "
                        "to Inf or NaN (inputs too large)",
                    )
                if self.emit == "tokens":
                    parts.append(out)
                elif self.emit in ("mean", "sequence"):
                    s = out.sum(axis=0, dtype=np.float64)
                    total = s if total is None else total + s
                else:
                    parts = [out[-1:]]
        except BadInput as bad:
            return Refused(bad.reason, bad.message)
        except (ValueError, TypeError, FloatingPointError) as ex:
            return Refused("compute_error", f"{type(ex).__name__}: {ex}")
        self.m.kernel_time.update(int((time.perf_counter() - t0) * 1e6))
        dtype = parts[0].dtype if parts else out.dtype
        if self.emit == "mean":
            assert total is not None
            emitted = np.asarray(total / n, dtype=dtype)
        elif self.emit == "sequence":  # the chunk's float64 sum: the stage keeps the running sum
            assert total is not None
            emitted = total
        elif self.emit == "last":
            emitted = np.ascontiguousarray(parts[0][0])
        else:
            emitted = parts[0] if len(parts) == 1 else np.concatenate(parts)
        try:
            new = Working(self.step, st, layers, n, idx + 1)
        except (ValueError, TypeError) as ex:
            return Refused("compute_error", f"{type(ex).__name__}: {ex}")
        self.m.chunks.inc()
        self.m.tokens.inc(n)
        self.progress.add(n)
        if self._trace is not None:
            os.write(self._trace, f"{seq_id}\t{idx}\n".encode())
        return Applied(new, ChunkResult(seq_id, idx, st.position, emitted))
