"""`linstream` with faults injected from the environment, for the crash and fault tests.

Run as ``python -m helpers.fault_cli ARGS...`` (``tests/`` on ``PYTHONPATH``): the same command
line as ``linstream ARGS...``, in one process (the in-process runner), with:

``LINSTREAM_FAULT_FREEZE=WHERE:N:FLAG``
    the process stops itself (SIGSTOP, as a frozen or swapped-out writer) at the N-th time it
    reaches WHERE, after writing FLAG (atomically: a test waits for it, then knows where the
    process stands; the file holds one JSON object).  WHERE is ``before-commit``: a commit of a
    sequence that has been committed before, once its output span's pending file is durable
    and before its commit file is created (FLAG names the sequence, the commit number and the
    pending file); or ``before-publish``: after a commit, before its span is published (FLAG
    names the sequence and both files).  The test resumes it with SIGCONT (or kills it).
``LINSTREAM_FAULT_CLOCK_SKEW_S=SECONDS``
    ``time.time()`` runs SECONDS ahead (negative: behind) of the machine's clock.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Any

__all__ = ["install", "main"]


def _freeze(flag: str, info: dict[str, Any]) -> None:
    tmp = f"{flag}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump({**info, "pid": os.getpid()}, f)
    os.replace(tmp, flag)
    os.kill(os.getpid(), signal.SIGSTOP)


def _install_freeze(spec: str) -> None:
    where, n_text, flag = spec.split(":", 2)
    wanted = int(n_text)
    seen = [0]
    lock = threading.Lock()

    def due() -> bool:
        with lock:
            seen[0] += 1
            return seen[0] == wanted

    if where == "before-commit":
        from linstream.state.store.checkpoint_store import CheckpointStore

        real_commit = CheckpointStore.commit

        def commit(self: Any, st: Any, history: Any = None, *, ready: Any = None) -> Any:
            if history is not None and history.commit >= 2 and due():
                if ready is not None:
                    ready()  # the span's pending file is durable
                span = history.outputs
                _freeze(
                    flag,
                    {
                        "seq_id": st.seq_id,
                        "commit": history.commit,
                        "pending": None if span is None else span.pending,
                    },
                )
            return real_commit(self, st, history, ready=ready)

        CheckpointStore.commit = commit  # type: ignore[method-assign]
    elif where == "before-publish":
        from linstream.pipeline.stage.spans import SpanWriter
        from linstream.pipeline.stage.spans.names import member_name

        real_before = SpanWriter._before_publish

        def before_publish(self: Any, group: Any) -> None:
            if group.seqs and due():
                seq_id, rows = sorted(group.seqs.items())[0]
                root = self._fs.root
                info = {"seq_id": seq_id, "file": f"{root}/{member_name(group.id, 0)}"}
                _freeze(flag, {**info, "pending": rows.pending})
            real_before(self, group)

        SpanWriter._before_publish = before_publish  # type: ignore[method-assign]
    else:
        msg = f"LINSTREAM_FAULT_FREEZE: expected before-commit or before-publish, got {where!r}"
        raise ValueError(msg)


def install() -> None:
    """Install the faults the environment asks for."""
    skew = os.environ.get("LINSTREAM_FAULT_CLOCK_SKEW_S")
    if skew:
        real_time = time.time
        offset = float(skew)
        time.time = lambda: real_time() + offset
    spec = os.environ.get("LINSTREAM_FAULT_FREEZE")
    if spec:
        _install_freeze(spec)


def main() -> int:
    install()
    from linstream.pipeline.app.cli import main as cli_main

    return int(cli_main(sys.argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
