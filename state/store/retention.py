"""Retention in a checkpoint store: commits beyond ``keep`` are removed, in a background thread
after a commit returns (deletes can be slow) or at once; with ``keep_every_tokens`` N, the first
commit at or past each multiple of N tokens is kept too (positions a sequence can be rewound
to)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging

from linstream.state.errors import CheckpointError

from .folders import CommitFile, StoreFolders
from .paths import data_name_commit, parse_data_name

__all__ = ["Retention"]

log = logging.getLogger("linstream.state")


class Retention:
    """Keeps the ``keep`` newest commits of each sequence of ``folders``, and with
    ``keep_every_tokens`` N > 0 the first commit at or past each multiple of N tokens (by
    position; of two commits at one position, the newer); with ``background``, in one thread
    of its own (`flush` waits for it, `close` stops it: it restarts on use)."""

    def __init__(
        self,
        folders: StoreFolders,
        keep: int,
        *,
        background: bool = True,
        keep_every_tokens: int = 0,
    ) -> None:
        if isinstance(keep_every_tokens, bool) or not isinstance(keep_every_tokens, int):
            msg = f"keep_every_tokens: expected an int >= 0, received {keep_every_tokens!r}"
            raise TypeError(msg)
        if keep_every_tokens < 0:
            msg = f"keep_every_tokens: expected an int >= 0, received {keep_every_tokens}"
            raise ValueError(msg)
        self.folders, self.keep, self.background = folders, keep, background
        self.keep_every_tokens = keep_every_tokens
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
        kept_files = files[: self.keep] + self._milestones(files[self.keep :], files)
        doomed = [f for f in files if f not in kept_files]
        if not doomed:
            return removed
        kept_data: set[str] = set()
        for path, n, pos in kept_files:
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

    def _milestones(self, older: list[CommitFile], files: list[CommitFile]) -> list[CommitFile]:
        """Of ``older`` (commits beyond the newest ``keep``), those ``keep_every_tokens`` keeps:
        for each multiple m of N up to the newest position, the commit of ``files`` with the
        lowest position >= m (the newer of two at one position), when it is among ``older``.
        A commit whose manifest cannot be read is not kept for this."""
        every = self.keep_every_tokens
        if every <= 0 or not older:
            return []
        at: list[tuple[int, int, CommitFile]] = []  # (position, order: newest first, file)
        for order, (path, n, pos) in enumerate(files):
            try:
                position = self.folders.parse_commit(path, n, pos).position
            except (CheckpointError, FileNotFoundError):
                continue
            at.append((position, order, (path, n, pos)))
        at.sort()
        kept: list[CommitFile] = []
        below = -1  # the highest position before this one: a multiple m in (below, p] is p's
        for position, _order, file in at:
            if position == below:
                continue  # the newer commit at this position came first
            if position // every > max(below, 0) // every and file in older:
                kept.append(file)
            below = position
        return kept
