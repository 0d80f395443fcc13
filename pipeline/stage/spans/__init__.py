"""Output spans: the results a checkpoint commit finalizes, written as part of that commit and
published per output group (writer.py says how, and why a crash loses none and doubles none).

    writer       SpanWriter: a commit's pending file, the open group published at a bundle's end,
                 a span rolled forward or back on restore, orphans tidied by commit number
    group_files  a results folder's group files: rows published into them exactly once, a
                 committed span's rows found there or in its pending files
    names        the names of output files, and `span_check`: a manifest's span names only those
    rows         output rows as Arrow tables, their Parquet bytes and the rows' digest
    legacy       the per-sequence spans of earlier versions: rolled forward or back, never written

The stage's commits (commits.py) are their one writer.  They reach the checkpoint store through
its public surface only (`linstream.state.store`), and import no Beam.
"""

from .writer import GROUP_BYTES, RESULTS_DIR, SpanWriter, Staged, span_check, spans_table

__all__ = ["GROUP_BYTES", "RESULTS_DIR", "SpanWriter", "Staged", "span_check", "spans_table"]
