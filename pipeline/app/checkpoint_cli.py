"""`linstream checkpoint inspect|verify|gc|fork|rewind`: look into and tidy a checkpoint store
(no Beam); fork and rewind live in state_cli.py.

A store's files are untrusted: every bad file (damaged, truncated, nested or oversized JSON, a
directory/FIFO/device in a file's place, a symbolic link, a state that would decompress beyond
what it holds) is one line naming the file and the error, and the exit status is non-zero;
nothing is followed out of the store, no FIFO is opened, nothing prints a traceback.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable
from typing import Any, TextIO

from .closed_stdout import tolerate_closed_stdout

__all__ = ["add_checkpoint_parser", "cmd_gc", "cmd_inspect", "cmd_verify", "main"]


def add_checkpoint_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``checkpoint inspect ROOT [--seq ID]``, ``verify``, ``gc``, ``fork`` and
    ``rewind``.

    ``subparsers`` is what ``ArgumentParser.add_subparsers()`` returned; each leaf sets
    ``func(args) -> int`` (the exit status).
    """
    parser = subparsers.add_parser(
        "checkpoint", help="inspect or verify a checkpoint store", description=__doc__
    )
    sub = parser.add_subparsers(dest="checkpoint_command", required=True)
    inspect = sub.add_parser("inspect", help="table of the sequences and their newest commit")
    inspect.add_argument("root", metavar="ROOT", help="store root: a path or fsspec URL")
    inspect.add_argument("--seq", metavar="ID", help="show only this sequence id")
    inspect.add_argument(
        "--json",
        action="store_true",
        help="one JSON object a line per sequence (seq_id, position, next_chunk, commits, "
        "positions, bytes, fingerprint, s_norm, z_norm, error) instead of the table",
    )
    inspect.set_defaults(func=cmd_inspect)
    verify = sub.add_parser(
        "verify",
        help="check every commit, and that the output files each names are where this store's "
        "jobs write them; exit 1 listing each bad file and why",
    )
    verify.add_argument("root", metavar="ROOT", help="store root: a path or fsspec URL")
    verify.set_defaults(func=cmd_verify)
    gc = sub.add_parser(
        "gc",
        help="remove orphan data files and stale temporaries older than the grace period, "
        "and commits beyond the newest --keep per sequence",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    gc.add_argument("root", metavar="ROOT", help="store root: a path or fsspec URL")
    gc.add_argument(
        "--grace-seconds",
        type=float,
        default=3600.0,
        metavar="S",
        help="keep orphans younger than this (a commit in flight writes its data file first): "
        "longer than any commit of a running job takes",
    )
    gc.add_argument("--keep", type=int, default=2, metavar="N", help="commits kept per sequence")
    gc.add_argument(
        "--keep-every-tokens",
        type=int,
        default=None,
        metavar="N",
        help="also keep each sequence's first commit at or past every multiple of N tokens "
        "(as `linstream embed --keep-every-tokens`); recorded in the store, so later jobs and "
        "gc keep it without the flag; 0: none from now on; not given: the recorded N",
    )
    gc.add_argument("--dry-run", action="store_true", help="list what would go; remove nothing")
    gc.set_defaults(func=cmd_gc)
    from .state_cli import add_fork_parsers

    add_fork_parsers(sub)
    return parser


def _open(root: str, err: TextIO) -> Any:
    from linstream.state import CheckpointStore

    store = CheckpointStore(root)
    if not store.exists():
        print(f"linstream checkpoint: no checkpoint store at {root} (not a folder)", file=err)
        return None
    return store


def _fmt_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _one_line_errors(cmd: Callable[..., int]) -> Callable[..., int]:
    """A store problem no per-file check caught becomes one line and exit status 1."""

    @functools.wraps(cmd)
    def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
        from linstream.state import CheckpointError

        try:
            return cmd(args, out)
        except (CheckpointError, OSError) as ex:
            print(f"linstream checkpoint: {type(ex).__name__}: {ex}", file=sys.stderr)
            return 1

    return run


@_one_line_errors
def cmd_inspect(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Print sequence, position, next chunk, commits, bytes, fingerprint and state norms."""
    from linstream.state import CheckpointError

    out = out or sys.stdout
    store = _open(args.root, sys.stderr)
    if store is None:
        return 2
    seq_ids = [args.seq] if args.seq is not None else store.sequences()
    if getattr(args, "json", False):
        for seq_id in seq_ids:
            print(json.dumps(_inspect_record(store, seq_id), sort_keys=True), file=out)
        return 0
    header = ("sequence", "position", "next_chunk", "commits", "bytes", "fingerprint", "|S|", "|z|")
    rows: list[tuple[str, ...]] = []
    bad = 0
    for seq_id in seq_ids:
        try:
            commits = store.commits(seq_id)
        except CheckpointError as ex:  # e.g. its folder is a symbolic link
            print(f"BAD {ex.path or seq_id}: {type(ex).__name__}: {ex.reason}", file=sys.stderr)
            bad += 1
            rows.append((seq_id, "?", "?", "?", "?", "?", "?", "?"))
            continue
        if not commits:
            rows.append((seq_id, "-", "-", "0", "0 B", "-", "-", "-"))
            continue
        total = sum(c.size or 0 for c in commits)
        row: tuple[str, ...] | None = None
        for c in commits:  # newest readable commit
            try:
                st = (  # by chain number: a commit whose manifest is unreadable has no position
                    store.read_commit(seq_id, c.position)
                    if c.commit is None
                    else store.read_chain(seq_id, c.commit).state
                )
            except CheckpointError as ex:
                print(
                    f"BAD {ex.path or c.manifest_path}: {type(ex).__name__}: {ex.reason}",
                    file=sys.stderr,
                )
                bad += 1
                continue
            s_norm, z_norm = st.norms()
            row = (
                seq_id,
                str(st.position),
                str(st.next_chunk),
                str(len(commits)),
                _fmt_bytes(total),
                st.fingerprint[:12],
                f"{s_norm:.6g}",
                f"{z_norm:.6g}",
            )
            break
        if row is None:
            row = (seq_id, "?", "?", str(len(commits)), _fmt_bytes(total), "?", "?", "?")
        rows.append(row)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip(), file=out)
    return 1 if bad else 0


def _inspect_record(store: Any, seq_id: str) -> dict[str, Any]:
    """One sequence for `inspect --json`: its newest readable commit (None fields when none)."""
    from linstream.state import CheckpointError

    commits = store.commits(seq_id)
    rec: dict[str, Any] = {
        "seq_id": seq_id,
        "commits": len(commits),
        "positions": sorted({c.position for c in commits if c.problem is None}),
        "bytes": sum(c.size or 0 for c in commits),
        "position": None,
        "next_chunk": None,
        "fingerprint": None,
        "s_norm": None,
        "z_norm": None,
        "error": None,
    }
    errors = []
    for c in commits:
        try:
            st = store.read_commit(seq_id, c.position)
        except CheckpointError as ex:
            errors.append(str(ex))
            continue
        s_norm, z_norm = st.norms()
        rec.update(
            position=int(st.position),
            next_chunk=int(st.next_chunk),
            fingerprint=st.fingerprint,
            s_norm=float(s_norm),
            z_norm=float(z_norm),
        )
        break
    if errors:
        rec["error"] = "; ".join(errors)
    return rec


@_one_line_errors
def cmd_gc(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Remove orphans older than the grace period and commits beyond ``--keep``."""
    from linstream.state import CheckpointStore

    out = out or sys.stdout
    if args.keep < 2:
        print("linstream checkpoint gc: --keep must be at least 2", file=sys.stderr)
        return 2
    every = getattr(args, "keep_every_tokens", None)
    if every is not None and every < 0:
        print("linstream checkpoint gc: --keep-every-tokens must be at least 0", file=sys.stderr)
        return 2
    if _open(args.root, sys.stderr) is None:
        return 2
    store = CheckpointStore(args.root, keep=args.keep)
    if args.dry_run:  # lists orphans only; the record is left as it is
        orphans = store.orphans()
        for path in orphans:
            print(f"orphan {path}", file=out)
        print(f"dry run: {len(orphans)} orphan file(s) under {args.root}", file=out)
        return 0
    note = store.settle_keep_every(every)
    if note:
        print(f"linstream checkpoint gc: {note}", file=sys.stderr)
    removed = store.gc(grace_seconds=args.grace_seconds)
    for path in removed:
        print(f"removed {path}", file=out)
    print(f"gc: removed {len(removed)} file(s) under {args.root}", file=out)
    return 0


@_one_line_errors
def cmd_verify(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Check every commit (and the output files it names: their form, and that their folder
    is one this store's jobs marked as theirs); print ``BAD path: error: reason`` lines and
    return 1 if any."""
    from linstream.pipeline.stage.spans import span_check
    from linstream.state import CheckpointError

    out = out or sys.stdout
    store = _open(args.root, sys.stderr)
    if store is None:
        return 2
    problems = store.verify(check=span_check(store.location))
    n_commits = 0
    for seq_id in store.sequences():
        try:
            n_commits += len(store.commits(seq_id))
        except CheckpointError:  # already among the problems
            continue
    for p in problems:
        print(f"BAD {p.path}: {p.error}: {p.reason}", file=out)
    orphans = store.orphans()
    if orphans:
        print(f"note: {len(orphans)} orphan file(s) without a manifest (removed by gc)", file=out)
    if problems:
        print(f"{len(problems)} bad commit(s) under {args.root}", file=out)
        return 1
    print(f"ok: {n_commits} commit(s) verified under {args.root}", file=out)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``linstream checkpoint ...`` on its own (for tests and ``python -m``)."""
    parser = argparse.ArgumentParser(prog="linstream")
    add_checkpoint_parser(parser.add_subparsers(dest="command", required=True))
    with tolerate_closed_stdout():
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
        return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
