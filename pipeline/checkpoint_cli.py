"""`linstream checkpoint inspect|verify`: look into a checkpoint store (no Beam imported).

A store's files are untrusted: every bad file (damaged, truncated, nested or oversized JSON, a
directory/FIFO/device in a file's place, a symbolic link, a state that would decompress beyond
what it holds) is one line naming the file and the error, and the exit status is non-zero;
nothing is followed out of the store, no FIFO is opened, nothing prints a traceback.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from typing import Any, TextIO

__all__ = ["add_checkpoint_parser", "cmd_inspect", "cmd_verify", "main"]


def add_checkpoint_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``checkpoint inspect ROOT [--seq ID]`` and ``checkpoint verify ROOT``.

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
    inspect.set_defaults(func=cmd_inspect)
    verify = sub.add_parser(
        "verify", help="check every commit; exit 1 listing each bad file and why"
    )
    verify.add_argument("root", metavar="ROOT", help="store root: a path or fsspec URL")
    verify.set_defaults(func=cmd_verify)
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


@_one_line_errors
def cmd_verify(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Check every commit; print ``BAD path: error: reason`` lines and return 1 if any."""
    from linstream.state import CheckpointError

    out = out or sys.stdout
    store = _open(args.root, sys.stderr)
    if store is None:
        return 2
    problems = store.verify()
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
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
