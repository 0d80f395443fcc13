"""What the one-line API hands back: its rows as a pyarrow Table in the schema and column order
of `linstream embed`'s results, and the progress bar (tqdm, on stderr) it shows meanwhile."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from linstream.pipeline.result_metadata import COMPUTE_DTYPE_KEY as COMPUTE_DTYPE_KEY
from linstream.pipeline.result_metadata import with_compute_dtype
from linstream.pipeline.stage.spans.rows import spans_table

__all__ = ["COMPUTE_DTYPE_KEY", "progress_bar", "results_table"]


@dataclass(frozen=True, slots=True)
class _Row:
    """A result row with `ChunkResult`'s attributes (ChunkResult's module imports Beam)."""

    seq_id: str
    index: int
    start_position: int
    output: np.ndarray


def results_table(
    rows: Sequence[tuple[str, int, int, np.ndarray]],
    width: int,
    *,
    per_token: bool,
    compute_dtype: str | None = None,
) -> pa.Table:
    """(seq_id, chunk_index, start_position, vector or [tokens, width] array) rows as a Table,
    built as `linstream embed` builds its result files (`spans_table`); the compute dtype the
    rows were computed in, when given, in its schema metadata (COMPUTE_DTYPE_KEY)."""
    results: Any = [_Row(seq, int(idx), int(start), out) for seq, idx, start, out in rows]
    return with_compute_dtype(spans_table(results, per_token=per_token, width=width), compute_dtype)


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: int | None, progress: bool | None) -> Any:
    """A tqdm bar over tokens on stderr: shown when asked, or (None) where stderr is a terminal."""
    show = sys.stderr.isatty() if progress is None else bool(progress)
    if not show:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, unit="tok", unit_scale=True, desc="linstream.embed", file=sys.stderr)
