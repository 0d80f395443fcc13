"""The checkpoint store: durable, validated, retained commits of ``SequenceState`` values.

Layout under the root (a local path or any fsspec URL)::

    ROOT/<seq folder>/<commit:020d>.commit.json        commit number n (format 2)
    ROOT/<seq folder>/<position:020d>.<n:020d>.<sha256[:16]>.arrow
                                                       its immutable data file (Arrow IPC)
    ROOT/<seq folder>/<position:020d>.manifest.json    a format-1 commit (read only), whose
    ROOT/<seq folder>/<position:020d>.<sha256[:16]>.arrow   data file has no commit number

A data file belongs to one commit (its number is in the name): a writer that loses its commit
removes its own data file, never one another commit names.

``<seq folder>`` is a safe, reversible encoding of the sequence id (``paths.encode_seq_dir``).
A sequence's commits form a chain: commit n+1 names its parent's position and is created only
if no commit n+1 exists (create-if-absent), so two writers that continue one history cannot both
advance it — the second finds commit n+1 taken.  If it holds the same state (a retried bundle,
or two jobs over the same input) the outcome is "duplicate", or "equal_within_tolerance" when
only the last bits differ (the caller continues from the commit that is there); any other history
raises ``SupersededError``.  Commit 1 continues from the newest format-1 commit, if any.
Restore validates everything (see ``CheckpointStore.head``).

URLs: local paths and ``file://`` use POSIX create-if-absent (``os.link``) and fsync; ``memory://``
(tests), ``gs://`` (gcsfs) and ``s3://`` (s3fs) go through fsspec and need an fsspec
implementation with exclusive writes (``open(path, "xb")``: gcsfs and adlfs from 2024.12, s3fs
from 2025.7, which sends ``If-None-Match: *`` for small objects too).  Object stores publish an
object atomically when its upload ends, so a half-written manifest cannot be seen there.

The store is put together from one module per purpose: ``layout`` (folders and commit
files), ``commit`` (the checks around a commit), ``restore`` (restore and its
checks), ``retention`` (pruning), ``listing`` (listing, verify, gc) and
``types`` (the values it returns).  ``CheckpointStore.commit`` itself lives here.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import time
from collections.abc import Callable

from linstream.state.codec import encode_checked, format_versions, tensor_ranges
from linstream.state.errors import NonFiniteStateError
from linstream.state.sequence_state import SequenceState

from .commit import DEFAULT_RTOL as DEFAULT_RTOL  # re-exported, as before the split
from .commit import StoreCommitChecks
from .filesystems import LocalStorage, in_thread, open_storage
from .listing import StoreListing
from .manifest import History, Manifest, split_file_hash
from .paths import data_name
from .restore import check_expected_shape as check_expected_shape  # re-exported
from .types import CheckpointProblem, CommitInfo, CommitOutcome, Head

__all__ = ["CheckpointProblem", "CheckpointStore", "CommitInfo", "CommitOutcome", "Head"]


class CheckpointStore(StoreCommitChecks, StoreListing):
    """Commits and restores sequence states under ``root`` (local path or fsspec URL).

    keep: commits (positions) kept per sequence, at least 2 so a corrupt newest one has a
    fallback.  rtol: tolerance of "equal within tolerance" as a fraction of each tensor's largest
    magnitude (default 1e-5 for float64 states, 1e-3 for float32: a retried bundle may run its
    float32 chunk math with other SIMD widths).  clock: seconds since the
    epoch, injected for tests of ``gc``.  background_prune: delete commits beyond ``keep`` in a
    background thread after ``commit`` returns (deletes can be slow: object-store round trips,
    online discard); ``flush()`` waits for them, ``close()`` also stops the thread.

    sync_batch (local disk; 0 by default): a commit's files are durable when ``commit``
    returns, but the fsync of its folder, which makes its name durable, waits for ``sync()``,
    which makes up to this many commits' folders durable at once, in parallel; ``commit`` calls
    it when that many wait, ``flush()`` and ``close()`` too.  A caller calls ``sync()`` before
    anything relies on its commits surviving a power loss (publishing their outputs); until
    then a power loss may lose them (never half: a commit is there whole or not at all), and
    their chunks are computed again.  Retention waits for the sync too, and ``sync_seq``
    makes the commits of one sequence durable whoever made them.
    """

    def __init__(
        self,
        root: str,
        *,
        keep: int = 2,
        rtol: float | None = None,
        clock: Callable[[], float] = time.time,
        background_prune: bool = True,
        sync_batch: int = 0,
    ) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 2:
            msg = f"keep: expected an int >= 2 (a corrupt newest commit needs a fallback): {keep!r}"
            raise ValueError(msg)
        if rtol is not None and not (0.0 <= rtol < 1.0):
            msg = f"rtol: expected 0 <= rtol < 1, received {rtol}"
            raise ValueError(msg)
        self.root = root
        self.keep = keep
        self.rtol = rtol
        self._clock = clock
        self._fs = open_storage(root)
        self._dirs_made: set[str] = set()
        self._root_synced = False
        local = isinstance(self._fs, LocalStorage)
        self.sync_batch = max(0, int(sync_batch)) if local else 0
        self._unsynced: set[str] = set()
        self._unsynced_commits: list[str] = []  # their folders, retention after the sync
        self._background_prune = background_prune
        self._pruner: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: list[concurrent.futures.Future[list[str]]] = []
        #: How many commits ended in each outcome, and how many restores fell back.
        self.counters: dict[str, int] = {o.value: 0 for o in CommitOutcome} | {"fallbacks": 0}

    def __repr__(self) -> str:
        return f"CheckpointStore({self.root!r}, keep={self.keep})"

    @property
    def location(self) -> str:
        """The root as one canonical URL (a local root resolved to its real path): the name by
        which output folders record that jobs of this store write into them."""
        if isinstance(self._fs, LocalStorage):
            return "file://" + os.path.realpath(self._fs.root)
        return f"{self._fs.protocol}://{self._fs.root}"

    def exists(self) -> bool:
        """Whether the root folder exists (a store with no commit yet may not have one)."""
        return self._fs.is_dir(self._fs.root)

    # --- commit --------------------------------------------------------------------------------

    def commit(
        self,
        st: SequenceState,
        history: History | None = None,
        *,
        ready: Callable[[], object] | None = None,
    ) -> CommitOutcome:
        """Commit ``st`` durably as commit ``history.commit`` of its chain; see the module
        docstring for the outcomes.

        Without ``history`` the commit continues the newest commit whose position is below
        ``st.position`` (or, when a commit at ``st.position`` exists, retries it), with no
        final chunk and no chunk digests recorded.  Raises ``NonFiniteStateError`` (NaN/Inf,
        nothing written), ``SupersededError`` (the commit number holds another history, or it
        was taken and then removed by retention: the history moved on past it),
        ``DivergentStateError`` (another state at this position), ``CorruptCheckpointError``
        (the commit already there cannot be read to compare).  ``ready``, when given, returns
        once the other files the history names (its output span) are durable; it is called
        before the commit is created, so their writing overlaps this commit's own.
        """
        if not isinstance(st, SequenceState):
            msg = f"commit: expected a SequenceState, received {type(st).__name__}"
            raise TypeError(msg)
        if not st.is_finite():
            msg = (
                f"sequence {st.seq_id!r} at position {st.position}: expected finite S and z, "
                "received NaN or Inf; refusing to commit"
            )
            raise NonFiniteStateError(msg)
        buf, digest = encode_checked(st, finite_checked=True)
        # Computed here, not in ``prepare``: the manifest must be written as early as possible
        # while the data file's fsync runs (so that one journal commit can carry both).
        ranges = tensor_ranges(buf, st)
        split = None if ranges is None else split_file_hash(buf, ranges, digest)
        seq_dir = self._seq_dir(st.seq_id)
        if history is None:
            history = self._auto_history(seq_dir, st)
        mpath = self._cpath(seq_dir, history.commit)

        version, min_reader = format_versions(st)

        def manifest_for(sha: str) -> Manifest:
            return Manifest(
                format_version=version,
                min_reader_version=min_reader,
                seq_id=st.seq_id,
                position=st.position,
                next_chunk=st.next_chunk,
                fingerprint=st.fingerprint,
                dtype=str(st.dtype),
                shape=st.state_shape,
                data_file=data_name(st.position, sha, history.commit),
                size=buf.size,
                sha256=sha,
                digest=digest,
                tensor_ranges=ranges,
                split_sha256=split,
                history=history,
            )

        made: list[Manifest] = []

        def prepare(sha: str) -> tuple[str, bytes]:
            made.append(manifest_for(sha))
            return f"{seq_dir}/{made[0].data_file}", made[0].to_bytes()

        existing = self._read_manifest_if_any(mpath, None)
        if existing is None:
            self._ensure_dir(seq_dir)
            batch = self.sync_batch > 0
            if batch:  # whatever the outcome: another writer's commit there is synced too
                self._unsynced.add(seq_dir)
                made_it = self._fs.commit_files(buf, mpath, prepare, ready, sync_folder=False)
            elif ready is None:
                made_it = self._fs.commit_files(buf, mpath, prepare)
            else:
                made_it = self._fs.commit_files(buf, mpath, prepare, ready)
            if made_it:
                self._refuse_if_stray(seq_dir, st, history, mpath, made[0])
                self._count(CommitOutcome.COMMITTED, st)
                if batch:
                    self._unsynced_commits.append(seq_dir)
                    if len(self._unsynced_commits) >= self.sync_batch:
                        self.sync()
                else:
                    self._schedule_prune(seq_dir)
                return CommitOutcome.COMMITTED
            existing = self._read_manifest_if_any(mpath, None)
            if existing is None:  # pruned meanwhile: the history moved on past this number
                self._fs.remove(f"{seq_dir}/{made[0].data_file}")  # ours: it names our number
                newest = self._vanished(seq_dir, history.commit) or history.commit
                raise self.moved_on(st.seq_id, history.commit, newest, mpath)
        manifest = made[0] if made else manifest_for(hashlib.sha256(buf).hexdigest())
        dpath = f"{seq_dir}/{manifest.data_file}"
        try:
            outcome = self._compare(st, manifest, existing, seq_dir, buf)
        finally:
            if existing.data_file != manifest.data_file:
                self._fs.remove(dpath)  # our data file lost the race (no-op if never written)
        self._count(outcome, st)
        return outcome

    def sync(self) -> None:
        """Make the folders of the commits made since the last sync durable (``sync_batch``),
        one fsync per folder and one of the root, in parallel; then prune them."""
        folders, self._unsynced = self._unsynced, set()
        commits, self._unsynced_commits = self._unsynced_commits, []
        if folders:
            assert isinstance(self._fs, LocalStorage)
            if self._fs.root not in folders:
                folders.add(self._fs.root)  # the folders' own names (another writer's too)
            self._sync_dirs(sorted(folders))
        for seq_dir in dict.fromkeys(commits):
            self._schedule_prune(seq_dir)

    def sync_seq(self, seq_id: str) -> None:
        """Make the commits in the sequence's folder durable, whoever made them (before their
        outputs are published: a commit another job made may wait for its ``sync``)."""
        if isinstance(self._fs, LocalStorage) and self._fs.is_dir(self._seq_dir(seq_id)):
            self._sync_dirs([self._seq_dir(seq_id), self._fs.root])

    def _sync_dirs(self, folders: list[str]) -> None:
        fs = self._fs
        assert isinstance(fs, LocalStorage)
        if len(folders) == 1:
            fs.sync_dir(folders[0])
            return
        for job in [in_thread(fs.sync_dir, f) for f in folders]:
            job.result()

    def flush(self) -> None:
        """Sync (``sync_batch``), then wait for the pruning scheduled so far."""
        self.sync()
        super().flush()

    def __enter__(self) -> CheckpointStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
