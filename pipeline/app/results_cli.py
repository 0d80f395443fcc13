"""`linstream results inspect OUTPUT`: what an output folder's results hold, per sequence (no Beam).

Per sequence: its chunks (rows) and their range, the chunk indexes missing below its last one
(gaps: chunks not embedded, or not yet), rows that name one chunk twice (jobs appended into one
folder), its tokens, whether its final chunk was applied, and the L2 norms of its embeddings
(min, mean, max).  Tokens and finality are the checkpoint store's word (`--checkpoint-dir`, the
store the job committed to: each sequence's newest commit); without it, tokens are what the
rows tell (the last chunk's start, plus its length with `--emit tokens`) and finality is
unknown.  `--json` prints one JSON object a line per sequence instead of the table.

`--plot FILE.png` (matplotlib: `pip install 'linstream[plot]'`) draws, per sequence, the cosine
similarity of each chunk's embedding to the previous chunk's along the position (the token
where the chunk starts): where a long document changes topic, the curve dips.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any, TextIO

import numpy as np

__all__ = ["SequenceSummary", "add_results_parser", "cmd_inspect", "summarize"]

#: Sequences drawn in one plot (the ones with the most chunks; the legend says how many more).
MAX_PLOTTED = 12
#: Gaps listed per sequence in --json (their count is always given).
MAX_GAPS_LISTED = 100


def add_results_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``results inspect OUTPUT [--checkpoint-dir PATH] [--json] [--plot PNG]``."""
    parser = subparsers.add_parser(
        "results", help="inspect an output folder's results", description=__doc__
    )
    sub = parser.add_subparsers(dest="results_command", required=True)
    p = sub.add_parser(
        "inspect",
        help="per sequence: chunks, gaps, tokens, final, embedding norms (--json, --plot)",
    )
    p.add_argument("output", metavar="OUTPUT", help="the job's --output (a path or URL)")
    p.add_argument(
        "--checkpoint-dir",
        metavar="PATH",
        help="the job's checkpoint store: each sequence's tokens and whether it is final",
    )
    p.add_argument("--seq", metavar="ID", help="show only this sequence id")
    p.add_argument("--json", action="store_true", help="one JSON object a line per sequence")
    p.add_argument(
        "--plot",
        metavar="PNG",
        help="draw each sequence's chunk-to-chunk cosine similarity along its position",
    )
    p.set_defaults(func=cmd_inspect)
    return parser


@dataclass(frozen=True)
class SequenceSummary:
    """One sequence of an output folder (`--json` prints these fields)."""

    seq_id: str
    chunks: int  # distinct chunk indexes
    first_chunk: int
    last_chunk: int
    gaps: int  # chunk indexes missing below the last one
    missing: list[int]  # the first MAX_GAPS_LISTED of them
    duplicates: int  # rows beyond one per chunk index
    tokens: int | None  # the store's position, or what the rows tell (None: not known)
    tokens_at_least: int  # the last chunk's start + 1, what the rows alone prove
    final: bool | None  # the store's word (None: no store given, or it has no commit)
    norm_min: float
    norm_mean: float
    norm_max: float


@dataclass
class _Rows:
    seq_ids: np.ndarray
    index: np.ndarray
    start: np.ndarray
    vectors: np.ndarray  # [rows, d] float32 (a chunk's mean with --emit tokens)
    lengths: np.ndarray | None  # tokens per row (--emit tokens only)


def _read(output: str) -> _Rows:
    """Every result row under ``<output>/results`` (hidden and temporary files left out), or
    in ``output`` itself when it names that results folder."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from linstream.pipeline.io.output_files import RESULTS_DIR, visible_files

    named = output.rstrip("/")
    folder = f"{named}/{RESULTS_DIR}"
    fs, paths = visible_files(folder)
    if not paths and named.rsplit("/", 1)[-1] == RESULTS_DIR:  # the results folder itself
        fs, paths = visible_files(named)
    if not paths:
        msg = f"no result files under {folder} (OUTPUT: the job's --output folder)"
        raise FileNotFoundError(msg)
    tables = []
    for path in paths:
        if fs is None:
            tables.append(pq.read_table(path))
        else:
            with fs.open(path, "rb") as f:
                tables.append(pq.read_table(f))
    table = pa.concat_tables(tables, promote_options="default")
    seq_ids = np.asarray(table.column("seq_id").to_pylist(), dtype=object)
    index = table.column("chunk_index").to_numpy()
    start = table.column("start_position").to_numpy()
    if "embeddings" in table.column_names:  # --emit tokens: per chunk, its tokens' mean
        col = table.column("embeddings").combine_chunks()
        width = col.type.value_type.list_size
        offsets = col.offsets.to_numpy()
        flat = col.values.values.to_numpy().reshape(-1, width).astype(np.float64)
        lengths = np.diff(offsets)
        sums = np.add.reduceat(flat, offsets[:-1], axis=0) if len(flat) else flat
        vectors = (sums / np.maximum(lengths, 1)[:, None]).astype(np.float32)
        return _Rows(seq_ids, index, start, vectors, lengths)
    col = table.column("embedding").combine_chunks()
    width = col.type.list_size
    vectors = col.values.to_numpy().reshape(-1, width)
    return _Rows(seq_ids, index, start, vectors, None)


def _store_facts(checkpoint_dir: str | None, seq_ids: list[str]) -> dict[str, tuple[int, bool]]:
    """{seq_id: (tokens, final)} from each sequence's newest readable commit."""
    if not checkpoint_dir:
        return {}
    from linstream.state import CheckpointError, CheckpointStore

    store = CheckpointStore(checkpoint_dir, background_prune=False)
    facts: dict[str, tuple[int, bool]] = {}
    try:
        if not store.exists():
            msg = f"--checkpoint-dir {checkpoint_dir}: no checkpoint store there"
            raise FileNotFoundError(msg)
        for seq_id in seq_ids:
            try:
                head = store.head(seq_id, fingerprint=None, fallback=True)
            except CheckpointError:
                continue
            if head is not None:
                facts[seq_id] = (int(head.state.position), head.history.final_chunk >= 0)
    finally:
        store.close()
    return facts


def _sequences(rows: _Rows) -> Iterator[tuple[str, np.ndarray]]:
    """(seq_id, its rows' positions in chunk order)."""
    order = np.lexsort((rows.index, rows.seq_ids.astype(str)))
    ids = rows.seq_ids[order]
    cuts = np.flatnonzero(ids[1:] != ids[:-1]) + 1
    for part in np.split(order, cuts):
        if len(part):
            yield str(rows.seq_ids[part[0]]), part


def summarize(
    output: str, checkpoint_dir: str | None = None, seq: str | None = None
) -> tuple[list[SequenceSummary], _Rows]:
    """The summaries of the sequences under ``<output>/results`` (and the rows read)."""
    rows = _read(output)
    per_seq = [(s, p) for s, p in _sequences(rows) if seq is None or s == seq]
    facts = _store_facts(checkpoint_dir, [s for s, _ in per_seq])
    out = []
    for seq_id, part in per_seq:
        index = rows.index[part]
        unique = np.unique(index)
        last = int(unique[-1])
        missing = sorted(set(range(last + 1)) - {int(i) for i in unique})
        norms = np.linalg.norm(rows.vectors[part].astype(np.float64), axis=1)
        at_least = int(rows.start[part][-1]) + 1
        tokens = None
        if rows.lengths is not None:
            tokens = int(rows.start[part][-1]) + int(rows.lengths[part][-1])
        final = None
        if seq_id in facts:
            tokens, final = facts[seq_id]
        out.append(
            SequenceSummary(
                seq_id,
                len(unique),
                int(unique[0]),
                last,
                len(missing),
                missing[:MAX_GAPS_LISTED],
                len(index) - len(unique),
                tokens,
                at_least,
                final,
                float(norms.min()),
                float(norms.mean()),
                float(norms.max()),
            )
        )
    return out, rows


def _table(summaries: list[SequenceSummary], out: TextIO) -> None:
    header = ("sequence", "chunks", "range", "gaps", "dups", "tokens", "final", "|e| min/mean/max")
    lines = [header]
    for s in summaries:
        tokens = f"{s.tokens:,}" if s.tokens is not None else f">= {s.tokens_at_least:,}"
        final = "?" if s.final is None else ("yes" if s.final else "no")
        norms = f"{s.norm_min:.4g} / {s.norm_mean:.4g} / {s.norm_max:.4g}"
        lines.append(
            (
                s.seq_id,
                f"{s.chunks:,}",
                f"{s.first_chunk}..{s.last_chunk}",
                f"{s.gaps:,}",
                f"{s.duplicates:,}",
                tokens,
                final,
                norms,
            )
        )
    widths = [max(len(r[i]) for r in lines) for i in range(len(header))]
    for r in lines:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip(), file=out)


def _cosines(rows: _Rows, part: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(position of chunk i, cosine of chunk i's embedding to chunk i-1's) for each chunk whose
    predecessor is there (one row per chunk index: the first of doubled ones)."""
    index = rows.index[part]
    keep = np.concatenate([[True], index[1:] != index[:-1]])
    part, index = part[keep], index[keep]
    vec = rows.vectors[part].astype(np.float64)
    norm = np.linalg.norm(vec, axis=1)
    follows = np.flatnonzero(index[1:] == index[:-1] + 1) + 1
    cos = np.einsum("ij,ij->i", vec[follows], vec[follows - 1])
    cos /= np.maximum(norm[follows] * norm[follows - 1], np.finfo(np.float64).tiny)
    return rows.start[part][follows], cos


def _plot(rows: _Rows, summaries: list[SequenceSummary], png: str, output: str) -> int:
    """Draw the plot into ``png``; how many sequences it draws."""
    try:
        import matplotlib
    except ImportError as ex:
        msg = "--plot needs matplotlib: pip install 'linstream[plot]'"
        raise ModuleNotFoundError(msg) from ex
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_id = dict(_sequences(rows))
    drawn = sorted(summaries, key=lambda s: (-s.chunks, s.seq_id))[:MAX_PLOTTED]
    fig, ax = plt.subplots(figsize=(10, 5), dpi=100)
    n = 0
    for s in drawn:
        x, y = _cosines(rows, by_id[s.seq_id])
        if len(x):
            ax.plot(x, y, marker=".", linewidth=1, label=s.seq_id)
            n += 1
    more = len(summaries) - len(drawn)
    ax.set_xlabel("position (tokens before the chunk)")
    ax.set_ylabel("cosine similarity to the previous chunk")
    ax.set_title(
        f"{output}: each chunk's embedding against the previous chunk's"
        + (f" ({more} more sequence(s) not drawn)" if more > 0 else "")
    )
    if n:
        ax.legend(fontsize="small", loc="best")
    else:
        ax.text(
            0.5, 0.5, "no sequence has two chunks in a row", ha="center", transform=ax.transAxes
        )
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)
    return n


def cmd_inspect(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Print the summaries (a table, or JSON lines); draw the plot with --plot."""
    out = out or sys.stdout
    try:
        summaries, rows = summarize(args.output, args.checkpoint_dir, args.seq)
    except FileNotFoundError as ex:
        print(f"linstream results: {ex}", file=sys.stderr)
        return 2
    if args.seq is not None and not summaries:
        print(f"linstream results: no sequence {args.seq!r} in {args.output}", file=sys.stderr)
        return 2
    if args.json:
        for s in summaries:
            print(json.dumps(asdict(s), sort_keys=True), file=out)
    else:
        _table(summaries, out)
    if args.plot:
        try:
            drawn = _plot(rows, summaries, args.plot, args.output)
        except ModuleNotFoundError as ex:
            print(f"linstream results: {ex}", file=sys.stderr)
            return 2
        print(
            f"linstream results: plot of {drawn} sequence(s) written to {args.plot}",
            file=sys.stderr,
        )
    return 0
