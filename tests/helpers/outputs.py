"""Judge the union of several jobs' written results against one uninterrupted run: every chunk
exactly once, bit-identical.  Output folders may be local paths or fsspec URLs (s3://, gs://)."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Verdict", "judge", "result_rows"]


def _visible_result_files(output: str) -> tuple[Any, list[str]]:
    """(fsspec filesystem or None, the published result files under ``<output>/results``):
    hidden names (a part starting with "." or "_": pending files, marks) left out."""
    root = output.rstrip("/") + "/results"
    if "://" in root and not root.startswith("file://"):
        import fsspec

        fs, path = fsspec.core.url_to_fs(root)
        try:
            found = fs.find(path)
        except FileNotFoundError:
            found = []
        path = path.rstrip("/")
        rel = [(p, p[len(path) :].lstrip("/")) for p in found if p.startswith(path)]
    else:
        fs, path = None, root.removeprefix("file://")
        rel = []
        for folder, _dirs, files in os.walk(path):
            for name in files:
                full = os.path.join(folder, name)
                rel.append((full, os.path.relpath(full, path)))
    visible = [p for p, r in rel if not any(part.startswith((".", "_")) for part in r.split("/"))]
    return fs, sorted(visible)


def result_rows(output: str) -> list[tuple[tuple[str, int], int, bytes]]:
    """Every row of every published result file under ``output``: (key, start, vector bytes)."""
    import numpy as np
    import pyarrow.parquet as pq

    rows = []
    fs, paths = _visible_result_files(output)
    for path in paths:
        if fs is None:
            table = pq.read_table(path)
        else:
            with fs.open(path, "rb") as f:
                table = pq.read_table(f)
        col = "embeddings" if "embeddings" in table.column_names else "embedding"
        for s, i, p, v in zip(
            table.column("seq_id").to_pylist(),
            table.column("chunk_index").to_pylist(),
            table.column("start_position").to_pylist(),
            table.column(col).to_pylist(),
            strict=True,
        ):
            rows.append(((s, int(i)), int(p), np.asarray(v, np.float32).tobytes()))
    return rows


@dataclass
class Verdict:
    """How the union of all jobs' outputs compares with one uninterrupted run."""

    lost: list[tuple[str, int]] = field(default_factory=list)
    duplicated: list[tuple[str, int]] = field(default_factory=list)
    mismatched: list[tuple[str, int]] = field(default_factory=list)
    unexpected: list[tuple[str, int]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.mismatched or self.unexpected)

    def __str__(self) -> str:
        return (
            f"lost {len(self.lost)}, duplicated {len(self.duplicated)}, mismatched "
            f"{len(self.mismatched)}, unexpected {len(self.unexpected)} "
            f"(first: {(self.lost + self.duplicated + self.mismatched + self.unexpected)[:5]})"
        )


def judge(reference_out: str, outputs: list[str]) -> Verdict:
    """The union of ``outputs``' results against ``reference_out``'s."""
    ref = {k: (p, v) for k, p, v in result_rows(reference_out)}
    rows = [r for out in outputs for r in result_rows(out)]
    counts = Counter(k for k, _, _ in rows)
    verdict = Verdict()
    verdict.duplicated = sorted(k for k, n in counts.items() if n > 1)
    verdict.lost = sorted(set(ref) - set(counts))
    verdict.unexpected = sorted(set(counts) - set(ref))
    verdict.mismatched = sorted({k for k, p, v in rows if k in ref and ref[k] != (p, v)})
    return verdict
