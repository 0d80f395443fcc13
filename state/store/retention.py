"""Retention in a checkpoint store: commits beyond ``keep`` are removed, in a background thread
after a commit returns (deletes can be slow) or at once."""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging

from linstream.state.errors import CheckpointError

from .folders import StoreFolders
from .paths import data_name_commit, parse_data_name

__all__ = ["Retention"]

log = logging.getLogger("linstream.state")


class Retention:
    """Keeps the ``keep`` newest commits of each sequence of ``folders``; with ``background``,
    in one thread of its own (`flush` waits for it, `close` stops it: it restarts on use)."""

    def __init__(self, folders: StoreFolders, keep: int, *, background: bool = True) -> None:
        self.folders, self.keep, self.background = folders, keep, background
        self._pruner: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: list[concurrent.futures.Future[list[str]]] = []

    def schedule(self, seq_dir: str) -> None:
        """Prune ``seq_dir`` (in the background thread, or now)."""
        if not self.background:
            self.prune(seq_dir)
            return
        if self._pruner is None:
            self._pruner = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="linstream-prune"
            )
        self._pending = [f for f in self._pending if not f.done()]
        self._pending.append(self._pruner.submit(self._prune_logged, seq_dir))

    def _prune_logged(self, seq_dir: str) -> list[str]:
        try:
            return self.prune(seq_dir)
        except Exception:  # a failed delete only delays retention; gc() retries it
            log.warning("pruning old commits in %s failed", seq_dir, exc_info=True)
            return []

    def flush(self) -> None:
        """Wait for background pruning scheduled so far."""
        pending, self._pending = self._pending, []
        for f in pending:
            f.result()

    def close(self) -> None:
        """Flush and stop the background thread (it restarts when pruning is scheduled)."""
        self.flush()
        if self._pruner is not None:
            self._pruner.shutdown(wait=True)
            self._pruner = None

    def prune(self, seq_dir: str) -> list[str]:
        """Drop commits beyond the ``keep`` newest: commit file first, then its data file(s).

        Output files a commit finalized are results, not checkpoint data: never removed here.
        """
        folders, fs = self.folders, self.folders.fs
        names = fs.list_dir(seq_dir)
        files = folders.commit_files(seq_dir, names)
        removed: list[str] = []
        doomed = files[self.keep :]
        if not doomed:
            return removed
        kept_data: set[str] = set()
        for path, n, pos in files[: self.keep]:
            with contextlib.suppress(CheckpointError, FileNotFoundError):
                kept_data.add(folders.parse_commit(path, n, pos).data_file)
        doomed_positions: set[int] = set()
        doomed_data: set[str] = set()
        for path, n, pos in reversed(doomed):
            if pos is not None:
                doomed_positions.add(pos)
            else:
                with contextlib.suppress(CheckpointError, FileNotFoundError):
                    m = folders.parse_commit(path, n, pos)
                    doomed_positions.add(m.position)
                    doomed_data.add(m.data_file)
            fs.remove(path)
            removed.append(path)
        # Data files go by ownership, as the chain says: those the removed commits named, those
        # of commit numbers up to the highest removed one (writers that lost those numbers, or
        # crashed before creating them: any writer still after one is refused), and files
        # without a number (format 1) at a removed position.  Never a kept commit's file.
        last = max((n for _, n, _ in doomed if n is not None), default=0)
        for name in names:
            number = data_name_commit(name)
            ours = (
                name in doomed_data
                or (number is not None and number <= last)
                or (number is None and parse_data_name(name) in doomed_positions)
            )
            if ours and name not in kept_data:
                fs.remove(f"{seq_dir}/{name}")
                removed.append(f"{seq_dir}/{name}")
        return removed
