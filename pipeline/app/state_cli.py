"""`linstream state export` and `linstream checkpoint fork|rewind`: a sequence's state as data.

`state export CKPT --seq ID [--position P] --out FILE.safetensors` writes one sequence's carried
state (at its newest commit, or at a retained one) as a state file (``linstream.state.exchange``)
that `linstream embed --initial-state` starts sequences from; `state export CKPT --json` lists
what a store can export, one JSON object a line.  `checkpoint fork CKPT --seq A --as B
[--position P]` gives B a commit equal to A's (``linstream.state.fork``), and `checkpoint rewind
CKPT --seq A --position P` makes A continue from P.  Commits are read through the store's own
restore path (every check) and written through its commit path.  No Beam: every refusal is one
line and a non-zero exit status.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from .flag_values import non_negative_int

__all__ = [
    "add_fork_parsers",
    "add_state_parser",
    "cmd_export",
    "cmd_fork",
    "cmd_rewind",
]

#: A fork or rewind removes no commit (its store keeps them all): the next job's retention does.
_KEEP_ALL = 2**31


def add_state_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``state export``; each leaf sets ``func(args) -> int``."""
    parser = subparsers.add_parser(
        "state", help="export a sequence's state as a file", description=__doc__
    )
    sub = parser.add_subparsers(dest="state_command", required=True)
    export = sub.add_parser(
        "export",
        help="write one sequence's state (newest commit, or the retained one at --position) "
        "as a safetensors file for `linstream embed --initial-state`; --json lists what the "
        "store can export",
    )
    export.add_argument("root", metavar="CKPT", help="checkpoint store root: a path or URL")
    export.add_argument("--seq", metavar="ID", help="the sequence whose state to write")
    export.add_argument(
        "--position",
        type=non_negative_int,
        metavar="P",
        help="a retained commit's position (tokens); none: the newest commit",
    )
    export.add_argument("--out", metavar="FILE", help="the state file to write (.safetensors)")
    export.add_argument(
        "--json",
        action="store_true",
        help="one JSON object a line per sequence (seq_id, positions, fingerprint)",
    )
    export.set_defaults(func=cmd_export)
    return parser


def add_fork_parsers(sub: Any) -> None:
    """Register ``checkpoint fork`` and ``checkpoint rewind`` under ``checkpoint``'s
    subparsers."""
    fork = sub.add_parser(
        "fork",
        help="give sequence --as a commit equal to --seq's (at --position, else its newest): a "
        "later job over --as's input continues from there",
    )
    fork.add_argument("root", metavar="CKPT", help="checkpoint store root: a path or URL")
    fork.add_argument("--seq", metavar="A", required=True, help="the sequence to copy")
    fork.add_argument("--as", dest="as_seq", metavar="B", required=True, help="the new sequence")
    fork.add_argument(
        "--position", type=non_negative_int, metavar="P", help="a retained position of A (tokens)"
    )
    fork.add_argument(
        "--force",
        action="store_true",
        help="B has commits already: make it continue from A's state anyway",
    )
    fork.set_defaults(func=cmd_fork)
    rewind = sub.add_parser(
        "rewind",
        help="make a sequence continue from one of its retained commits (--position): its "
        "next job applies the chunks after it again",
    )
    rewind.add_argument("root", metavar="CKPT", help="checkpoint store root: a path or URL")
    rewind.add_argument("--seq", metavar="ID", required=True, help="the sequence to rewind")
    rewind.add_argument(
        "--position", type=non_negative_int, metavar="P", required=True, help="a retained position"
    )
    rewind.set_defaults(func=cmd_rewind)


def _fail(prog: str, ex: BaseException, code: int = 1) -> int:
    text = str(ex).splitlines()[0] if str(ex) else type(ex).__name__
    print(f"linstream {prog}: {text}", file=sys.stderr)
    return code


def _store(root: str) -> Any:
    from linstream.state import CheckpointStore
    from linstream.state.fork import ForkError

    store = CheckpointStore(root, keep=_KEEP_ALL, background_prune=False)
    if not store.exists():
        msg = f"expected a checkpoint store at {root}, found no folder there"
        raise ForkError(msg)
    return store


def _errors() -> tuple[type[BaseException], ...]:
    from linstream.state import CheckpointError
    from linstream.state.exchange import StateFileError
    from linstream.state.fork import ForkError

    return (CheckpointError, ForkError, StateFileError, OSError)


def cmd_export(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Write the state file (or, with ``--json``, list what can be exported)."""
    out = out or sys.stdout
    prog = "state export"
    if args.json:
        if args.out or args.seq is not None or args.position is not None:
            return _fail(prog, ValueError("--json lists the store; it takes no --seq/--out"), 2)
    elif not args.out or args.seq is None:
        return _fail(prog, ValueError("expected --seq ID and --out FILE (or --json)"), 2)
    try:
        store = _store(args.root)
        if args.json:
            return _list(store, out)
        from linstream.state.exchange import write_state_file
        from linstream.state.fork import select_commit

        head = select_commit(store, str(args.seq), args.position)
        size = write_state_file(args.out, head.state)
    except _errors() as ex:
        return _fail(prog, ex)
    st = head.state
    print(
        f"exported sequence {st.seq_id!r} at position {st.position} (next chunk "
        f"{st.next_chunk}, {len(st.tensors)} tensors, {st.dtype}) to {args.out} ({size:,} bytes)",
        file=out,
    )
    return 0


def _list(store: Any, out: TextIO) -> int:
    from linstream.state import CheckpointError

    bad = 0
    for seq_id in store.sequences():
        try:
            commits = store.commits(seq_id)
        except CheckpointError as ex:
            print(f"BAD {ex.path or seq_id}: {type(ex).__name__}: {ex.reason}", file=sys.stderr)
            bad += 1
            continue
        readable = [c for c in commits if c.problem is None]
        rec = {
            "seq_id": seq_id,
            "positions": sorted({c.position for c in readable}),
            "fingerprint": readable[0].fingerprint if readable else None,
        }
        print(json.dumps(rec, sort_keys=True), file=out)
    return 1 if bad else 0


def cmd_fork(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Commit A's state (at P) as B's newest commit."""
    return _fork(
        "checkpoint fork", args.root, args.seq, args.as_seq, args.position, args.force, out
    )


def cmd_rewind(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Commit A's state at P as A's newest commit."""
    return _fork("checkpoint rewind", args.root, args.seq, args.seq, args.position, False, out)


def _fork(
    prog: str,
    root: str,
    seq_id: str,
    new_id: str,
    position: int | None,
    force: bool,
    out: TextIO | None,
) -> int:
    from linstream.state.fork import fork

    out = out or sys.stdout
    try:
        store = _store(root)
        head = fork(store, seq_id, new_id, position, force=force)
    except _errors() as ex:
        return _fail(prog, ex)
    st = head.state
    what = "rewound" if new_id == seq_id else f"forked to {new_id!r} from"
    print(
        f"{what} sequence {seq_id!r} at position {st.position} (next chunk {st.next_chunk}); "
        f"its next job continues from there",
        file=out,
    )
    return 0
