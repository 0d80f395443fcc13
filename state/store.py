"""The checkpoint store: durable, validated, retained commits of ``SequenceState`` values.

Layout under the root (a local path or any fsspec URL)::

    ROOT/<seq folder>/<position:020d>.<sha256[:16]>.arrow      immutable data file (Arrow IPC)
    ROOT/<seq folder>/<commit:020d>.commit.json                commit number n (format 2)
    ROOT/<seq folder>/<position:020d>.manifest.json            a format-1 commit (read only)

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
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import enum
import hashlib
import hmac
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .codec import (
    FORMAT_VERSION,
    MIN_READER_VERSION,
    DigestHint,
    StateHeader,
    decode_with_header,
    digest_of_bytes,
    encode_checked,
    tensor_ranges,
)
from .errors import (
    CheckpointError,
    CorruptCheckpointError,
    DivergentStateError,
    NonFiniteStateError,
    ShapeMismatchError,
    SupersededError,
)
from .filesystems import LocalStorage, in_thread, open_storage
from .manifest import MAX_MANIFEST_BYTES, History, Manifest, split_file_hash
from .paths import (
    TMP_PREFIX,
    commit_name,
    data_name,
    decode_seq_dir,
    encode_seq_dir,
    is_hashed_seq_dir,
    manifest_name,
    parse_commit_name,
    parse_data_name,
    parse_manifest_name,
)
from .sequence_state import SequenceState

__all__ = ["CheckpointProblem", "CheckpointStore", "CommitInfo", "CommitOutcome", "Head"]

log = logging.getLogger("linstream.state")

#: Default relative tolerance (on the max-abs scale of each tensor) for "equal within tolerance".
DEFAULT_RTOL = {"float64": 1e-5, "float32": 1e-3}


class CommitOutcome(enum.StrEnum):
    COMMITTED = "committed"
    DUPLICATE = "duplicate"
    EQUAL_WITHIN_TOLERANCE = "equal_within_tolerance"


@dataclass(frozen=True)
class CommitInfo:
    """One commit as its manifest describes it (``problem`` set when the manifest is unreadable)."""

    seq_id: str | None
    position: int
    manifest_path: str
    data_path: str | None
    size: int | None
    next_chunk: int | None
    fingerprint: str | None
    problem: str | None = None
    commit: int | None = None  # number in the chain (format 2); None for a format-1 commit


#: The history of a format-1 commit, which recorded none.
_NO_HISTORY = History(commit=0, parent_position=0, final_chunk=-1, digests=b"")


@dataclass(frozen=True)
class Head:
    """The newest readable commit of a sequence: its state and history, and what was newer but
    could not be read (commits skipped by a fallback, as (path, manifest or None)).
    ``newest_commit`` is the highest commit number in the folder: a writer continuing this head
    creates the number after it (so a fallback never collides with the unreadable commits)."""

    state: SequenceState
    history: History
    manifest_path: str
    skipped: tuple[tuple[str, Manifest | None], ...] = ()
    newest_commit: int = 0


@dataclass(frozen=True)
class CheckpointProblem:
    """A commit that does not pass the restore checks."""

    path: str
    reason: str
    error: str

    def __str__(self) -> str:
        return f"{self.path}: {self.error}: {self.reason}"


#: Data files from this size on are hashed in a pool thread while the decode runs.
_PARALLEL_HASH_BYTES = 64 * 1024


def _sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_expected_shape(
    shape: tuple[int, ...], expected: tuple[int, ...] | None, *, path: str
) -> None:
    """``ShapeMismatchError`` unless a commit's state shape is the model's (when one is given)."""
    if expected is None or tuple(shape) == tuple(int(n) for n in expected):
        return
    names = ("layers", "heads", "features", "d_v")
    diff = ", ".join(
        f"{n} {a} (model {b})" for n, a, b in zip(names, shape, expected, strict=False) if a != b
    )
    msg = (
        f"state of shape {list(shape)} does not fit the model's {list(expected)}: "
        f"{diff or f'{len(shape)} dimensions (model {len(expected)})'}"
    )
    raise ShapeMismatchError(msg, path=path)


def _max_rel_diff(a: np.ndarray, b: np.ndarray) -> float:
    scale = float(np.max(np.abs(b))) if b.size else 0.0
    diff = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if b.size else 0.0
    if diff == 0.0:
        return 0.0
    return diff / scale if scale > 0 else math.inf


class CheckpointStore:
    """Commits and restores sequence states under ``root`` (local path or fsspec URL).

    keep: commits (positions) kept per sequence, at least 2 so a corrupt newest one has a
    fallback.  rtol: tolerance of "equal within tolerance" as a fraction of each tensor's largest
    magnitude (default 1e-5 for float64 states, 1e-3 for float32: a retried bundle may run its
    float32 chunk math with other SIMD widths).  clock: seconds since the
    epoch, injected for tests of ``gc``.  background_prune: delete commits beyond ``keep`` in a
    background thread after ``commit`` returns (deletes can be slow: object-store round trips,
    online discard); ``flush()`` waits for them, ``close()`` also stops the thread.
    """

    def __init__(
        self,
        root: str,
        *,
        keep: int = 2,
        rtol: float | None = None,
        clock: Callable[[], float] = time.time,
        background_prune: bool = True,
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
        self._background_prune = background_prune
        self._pruner: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: list[concurrent.futures.Future[list[str]]] = []
        #: How many commits ended in each outcome, and how many restores fell back.
        self.counters: dict[str, int] = {o.value: 0 for o in CommitOutcome} | {"fallbacks": 0}

    def __repr__(self) -> str:
        return f"CheckpointStore({self.root!r}, keep={self.keep})"

    def exists(self) -> bool:
        """Whether the root folder exists (a store with no commit yet may not have one)."""
        return self._fs.is_dir(self._fs.root)

    # --- paths ---------------------------------------------------------------------------------

    def _seq_dir(self, seq_id: str) -> str:
        return self._fs.join(encode_seq_dir(seq_id))

    def _ensure_dir(self, seq_dir: str) -> None:
        if seq_dir in self._dirs_made:
            return
        if not self._fs.is_dir(seq_dir):
            self._fs.makedirs(seq_dir)
            if isinstance(self._fs, LocalStorage):  # make the new folder's name durable
                self._fs.sync_dir(self._fs.root)
                if not self._root_synced:  # and the root's (makedirs may have made it): once
                    self._fs.sync_dir(self._fs.root.rpartition("/")[0] or "/")
                    self._root_synced = True
        self._dirs_made.add(seq_dir)

    def _positions(self, seq_dir: str) -> list[int]:
        """Positions of format-1 commits (manifest names), newest first."""
        found = (parse_manifest_name(n) for n in self._fs.list_dir(seq_dir))
        return sorted((p for p in found if p is not None), reverse=True)

    def _commit_files(
        self, seq_dir: str, names: list[str] | None = None
    ) -> list[tuple[str, int | None, int | None]]:
        """Every commit file as (path, chain number, format-1 position), newest first: the
        chain (format 2) by number, then format-1 manifests by position."""
        names = self._fs.list_dir(seq_dir) if names is None else names
        chain = sorted((n for n in map(parse_commit_name, names) if n is not None), reverse=True)
        old = sorted((p for p in map(parse_manifest_name, names) if p is not None), reverse=True)
        return [(self._cpath(seq_dir, n), n, None) for n in chain] + [
            (self._mpath(seq_dir, p), None, p) for p in old
        ]

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
        nothing written), ``SupersededError`` (the commit number holds another history),
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

        def manifest_for(sha: str) -> Manifest:
            return Manifest(
                format_version=FORMAT_VERSION,
                min_reader_version=MIN_READER_VERSION,
                seq_id=st.seq_id,
                position=st.position,
                next_chunk=st.next_chunk,
                fingerprint=st.fingerprint,
                dtype=str(st.dtype),
                shape=st.state_shape,
                data_file=data_name(st.position, sha),
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
            made_it = (
                self._fs.commit_files(buf, mpath, prepare)
                if ready is None
                else self._fs.commit_files(buf, mpath, prepare, ready)
            )
            if made_it:
                self._refuse_if_stray(seq_dir, st, history, mpath, made[0])
                self._count(CommitOutcome.COMMITTED, st)
                self._schedule_prune(seq_dir)
                return CommitOutcome.COMMITTED
            existing = self._read_manifest_if_any(mpath, None)
            if existing is None:  # pruned meanwhile: the commit is far behind the newest
                msg = f"manifest {mpath} vanished while committing position {st.position}"
                raise CorruptCheckpointError(msg, path=mpath)
        manifest = made[0] if made else manifest_for(hashlib.sha256(buf).hexdigest())
        dpath = f"{seq_dir}/{manifest.data_file}"
        try:
            outcome = self._compare(st, manifest, existing, seq_dir, buf)
        finally:
            if existing.data_file != manifest.data_file:
                self._fs.remove(dpath)  # our data file lost the race (no-op if never written)
        self._count(outcome, st)
        return outcome

    def _refuse_if_stray(
        self, seq_dir: str, st: SequenceState, history: History, mpath: str, ours: Manifest
    ) -> None:
        """A commit number can be free again after retention removed it; creating it then
        forks a history that has moved on.  Retention only removes commit n once commit
        n + keep exists, so a newer number in the folder right after the create tells."""
        names = self._fs.list_dir(seq_dir)
        newest = max((n for n in map(parse_commit_name, names) if n is not None), default=0)
        if newest <= history.commit:
            return
        self._fs.remove(mpath)
        self._fs.remove(f"{seq_dir}/{ours.data_file}")
        msg = (
            f"sequence {st.seq_id!r}: this writer continued commit {history.commit - 1} "
            f"(position {history.parent_position}), but the history has moved on to commit "
            f"{newest}: another job advanced this sequence (one writer per sequence history)"
        )
        raise SupersededError(msg, path=mpath)

    def _auto_history(self, seq_dir: str, st: SequenceState) -> History:
        """The history of a commit made without one (see ``commit``)."""
        for path, n, pos in self._commit_files(seq_dir):
            try:
                m = self._parse_commit(path, n, pos)
            except (CheckpointError, FileNotFoundError):
                continue
            if m.position == st.position and n is not None:
                return replace(m.history or _NO_HISTORY, outputs=None)  # a retry of this commit
            if m.position < st.position:
                number = 1 if n is None else n + 1
                return History(number, m.position, -1, b"")
        return History(1, 0, -1, b"")

    def _parse_commit(self, path: str, number: int | None, position: int | None) -> Manifest:
        """Read and check one commit file (format 2 when ``number`` is given)."""
        m = Manifest.parse(self._fs.read(path, MAX_MANIFEST_BYTES), path=path, position=position)
        if number is not None and (m.history is None or m.history.commit != number):
            got = None if m.history is None else m.history.commit
            msg = f"manifest records commit {got}, but its name says {number}"
            raise CorruptCheckpointError(msg, path=path)
        return m

    def _read_manifest_if_any(self, mpath: str, position: int | None) -> Manifest | None:
        try:
            raw = self._fs.read(mpath, MAX_MANIFEST_BYTES)
        except FileNotFoundError:
            return None
        return Manifest.parse(raw, path=mpath, position=position)

    def _compare(
        self, st: SequenceState, ours: Manifest, existing: Manifest, seq_dir: str, buf: Any
    ) -> CommitOutcome:
        mine, theirs = ours.history or _NO_HISTORY, existing.history or _NO_HISTORY
        if (existing.position, existing.next_chunk, theirs.parent_position, theirs.final_chunk) != (
            st.position,
            st.next_chunk,
            mine.parent_position,
            mine.final_chunk,
        ) or theirs.digests != mine.digests:
            msg = (
                f"sequence {st.seq_id!r}: commit {mine.commit} already exists and continues "
                f"from position {theirs.parent_position} to position {existing.position} "
                f"(next chunk {existing.next_chunk}); this writer's commit from position "
                f"{mine.parent_position} to {st.position} (next chunk {st.next_chunk}) is "
                "refused: another job advanced this sequence (one writer per sequence history)"
            )
            raise SupersededError(msg, path=self._cpath(seq_dir, mine.commit))
        if existing.sha256 == ours.sha256 and existing.data_file == ours.data_file:
            # A retried commit: make sure the data file is intact (repairs a lost or damaged one).
            dpath = f"{seq_dir}/{ours.data_file}"
            try:
                intact = hashlib.sha256(self._fs.read(dpath, ours.size)).hexdigest() == ours.sha256
            except FileNotFoundError:
                intact = False
            if not intact:
                log.warning("%s: rewriting the missing or damaged data file of a commit", dpath)
                self._fs.write_immutable(dpath, buf)
            return CommitOutcome.DUPLICATE
        where = f"sequence {st.seq_id!r} position {st.position}"
        first, _ = self._load_file(
            self._cpath(seq_dir, mine.commit), mine.commit, None, st.seq_id, None
        )
        if first.fingerprint != st.fingerprint:
            msg = (
                f"{where}: already committed by another model (fingerprint "
                f"{first.fingerprint[:16]}…, this state {st.fingerprint[:16]}…)"
            )
            raise DivergentStateError(msg, path=self._cpath(seq_dir, mine.commit))
        if (first.next_chunk, first.dtype, first.S.shape) != (st.next_chunk, st.dtype, st.S.shape):
            msg = (
                f"{where}: committed state has next_chunk {first.next_chunk}, dtype "
                f"{first.dtype}, shape {list(first.S.shape)}; this state has {st.next_chunk}, "
                f"{st.dtype}, {list(st.S.shape)}"
            )
            raise DivergentStateError(msg, path=self._cpath(seq_dir, mine.commit))
        rtol = self.rtol if self.rtol is not None else DEFAULT_RTOL[str(st.dtype)]
        diff = max(_max_rel_diff(st.S, first.S), _max_rel_diff(st.z, first.z))
        if diff <= rtol:
            log.info(
                "%s: already committed with a state equal within tolerance (max relative "
                "difference %.3g <= %.3g); keeping the first commit",
                where,
                diff,
                rtol,
            )
            return CommitOutcome.EQUAL_WITHIN_TOLERANCE
        msg = (
            f"{where}: a different state is already committed (max relative difference "
            f"{diff:.3g} > tolerance {rtol:.3g})"
        )
        raise DivergentStateError(msg, path=self._cpath(seq_dir, mine.commit))

    def _mpath(self, seq_dir: str, position: int) -> str:
        return f"{seq_dir}/{manifest_name(position)}"

    def _cpath(self, seq_dir: str, commit: int) -> str:
        return f"{seq_dir}/{commit_name(commit)}"

    def _count(self, outcome: CommitOutcome, st: SequenceState) -> None:
        self.counters[outcome.value] += 1
        log.debug("commit %r position %d: %s", st.seq_id, st.position, outcome.value)

    def _schedule_prune(self, seq_dir: str) -> None:
        if not self._background_prune:
            self._prune(seq_dir)
            return
        if self._pruner is None:
            self._pruner = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="linstream-prune"
            )
        self._pending = [f for f in self._pending if not f.done()]
        self._pending.append(self._pruner.submit(self._prune_logged, seq_dir))

    def _prune_logged(self, seq_dir: str) -> list[str]:
        try:
            return self._prune(seq_dir)
        except Exception:  # a failed delete only delays retention; gc() retries it
            log.warning("pruning old commits in %s failed", seq_dir, exc_info=True)
            return []

    def flush(self) -> None:
        """Wait for background pruning scheduled so far."""
        pending, self._pending = self._pending, []
        for f in pending:
            f.result()

    def close(self) -> None:
        """Flush and stop the background thread (the store stays usable: it restarts it)."""
        self.flush()
        if self._pruner is not None:
            self._pruner.shutdown(wait=True)
            self._pruner = None

    def __enter__(self) -> CheckpointStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _prune(self, seq_dir: str) -> list[str]:
        """Drop commits beyond the ``keep`` newest: commit file first, then its data file(s).

        Output files a commit finalized are results, not checkpoint data: never removed here.
        """
        names = self._fs.list_dir(seq_dir)
        files = self._commit_files(seq_dir, names)
        removed: list[str] = []
        doomed = files[self.keep :]
        if not doomed:
            return removed
        kept_data: set[str] = set()
        for path, n, pos in files[: self.keep]:
            with contextlib.suppress(CheckpointError, FileNotFoundError):
                kept_data.add(self._parse_commit(path, n, pos).data_file)
        doomed_positions: set[int] = set()
        for path, n, pos in reversed(doomed):
            if pos is not None:
                doomed_positions.add(pos)
            else:
                with contextlib.suppress(CheckpointError, FileNotFoundError):
                    doomed_positions.add(self._parse_commit(path, n, pos).position)
            self._fs.remove(path)
            removed.append(path)
        for name in names:
            if parse_data_name(name) in doomed_positions and name not in kept_data:
                self._fs.remove(f"{seq_dir}/{name}")
                removed.append(f"{seq_dir}/{name}")
        return removed

    # --- restore -------------------------------------------------------------------------------

    def restore(
        self,
        seq_id: str,
        *,
        fingerprint: str,
        fallback: bool = False,
        expected_shape: tuple[int, ...] | None = None,
    ) -> SequenceState | None:
        """The newest committed state of ``seq_id``, or None when it has no commit (see
        ``head``, which also returns the commit's history)."""
        head = self.head(
            seq_id, fingerprint=fingerprint, fallback=fallback, expected_shape=expected_shape
        )
        return None if head is None else head.state

    def head(
        self,
        seq_id: str,
        *,
        fingerprint: str | None,
        fallback: bool = False,
        expected_shape: tuple[int, ...] | None = None,
    ) -> Head | None:
        """The newest commit of ``seq_id`` (its state and history), or None when it has none.

        Checks, in order: format version (manifest, then file), size and SHA-256 of the data
        file, Arrow structure, schema, shapes and dtype, model fingerprint, sequence id and
        position, content digest, finite values; and ``expected_shape`` (the model's state
        shape) when given.  Manifests with a split hash (see ``manifest.py``) check every byte
        of the file and the content digest in one pass over the tensor bytes; older ones hash
        the file in a thread while the decode runs (the reports keep this order either way).
        Raises ``CorruptCheckpointError``, ``UnsupportedFormatVersionError`` or
        ``ModelMismatchError`` naming the file.  With ``fallback=True`` a corrupt newest commit
        is skipped (logged as a warning) for the next older one; if none is readable the first
        error is raised.  Orphan data files (no manifest) are never read.  The store's files
        are untrusted: a manifest or data file that is not a regular file raises
        ``NotARegularFileError``, a symbolic link ``UnsafePathError``, a state file that would
        decompress beyond what it holds ``StateBoundsError``, a commit of another shape than
        ``expected_shape`` ``ShapeMismatchError`` (from its manifest, before its data is read).
        """
        seq_dir = self._seq_dir(seq_id)
        first_error: CorruptCheckpointError | None = None
        skipped: list[tuple[str, Manifest | None]] = []
        files = self._commit_files(seq_dir)
        newest = max((n for _, n, _ in files if n is not None), default=0)
        for path, n, pos in files:
            try:
                # A commit of another shape is a ShapeMismatchError, raised from its manifest
                # before its data file is read.
                st, m = self._load_file(path, n, pos, seq_id, fingerprint, expected_shape)
            except CorruptCheckpointError as ex:
                if not fallback:
                    raise
                first_error = first_error or ex
                log.warning(
                    "sequence %r: commit %s is unreadable (%s); falling back to the previous "
                    "commit",
                    seq_id,
                    path,
                    ex,
                )
                self.counters["fallbacks"] += 1
                try:
                    skipped.append((path, self._parse_commit(path, n, pos)))
                except (CheckpointError, FileNotFoundError):
                    skipped.append((path, None))
                continue
            return Head(st, m.history or _NO_HISTORY, path, tuple(skipped), newest)
        if first_error is not None:
            raise first_error
        return None

    def read_commit(
        self,
        seq_id: str,
        position: int,
        *,
        fingerprint: str | None = None,
        expected_shape: tuple[int, ...] | None = None,
    ) -> SequenceState:
        """The commit of ``seq_id`` at ``position``, with every restore check."""
        seq_dir = self._seq_dir(seq_id)
        for path, n, pos in self._commit_files(seq_dir):
            if pos is not None and pos != position:
                continue
            if n is not None:
                try:
                    if self._parse_commit(path, n, None).position != position:
                        continue
                except (CheckpointError, FileNotFoundError):
                    continue
            return self._load_file(path, n, pos, seq_id, fingerprint, expected_shape)[0]
        msg = f"no commit at position {position}"
        raise CorruptCheckpointError(msg, path=seq_dir)

    def read_chain(self, seq_id: str, commit: int, *, fingerprint: str | None = None) -> Head:
        """Commit number ``commit`` of ``seq_id``'s chain, with every restore check."""
        path = self._cpath(self._seq_dir(seq_id), commit)
        st, m = self._load_file(path, commit, None, seq_id, fingerprint)
        return Head(st, m.history or _NO_HISTORY, path, (), commit)

    def _load(
        self,
        seq_dir: str,
        position: int,
        seq_id: str | None,
        fingerprint: str | None,
        expected_shape: tuple[int, ...] | None = None,
    ) -> SequenceState:
        """The format-1 commit at ``position``."""
        return self._load_file(self._mpath(seq_dir, position), None, position, seq_id, fingerprint)[
            0
        ]

    def _load_file(
        self,
        mpath: str,
        number: int | None,
        position: int | None,
        seq_id: str | None,
        fingerprint: str | None,
        expected_shape: tuple[int, ...] | None = None,
    ) -> tuple[SequenceState, Manifest]:
        seq_dir = mpath.rpartition("/")[0]
        try:
            m = self._parse_commit(mpath, number, position)
        except FileNotFoundError as ex:
            msg = "manifest disappeared"
            raise CorruptCheckpointError(msg, path=mpath) from ex
        except OSError as ex:  # unreadable for another reason (permissions, I/O error)
            msg = f"manifest cannot be read: {ex.strerror or ex}"
            raise CorruptCheckpointError(msg, path=mpath) from ex
        check_expected_shape(m.shape, expected_shape, path=mpath)
        dpath = f"{seq_dir}/{m.data_file}"
        try:
            data = self._fs.read(dpath, m.size)  # at most m.size + 1 bytes: no stat needed
        except FileNotFoundError as ex:
            msg = f"data file missing (named by manifest {mpath})"
            raise CorruptCheckpointError(msg, path=dpath) from ex
        except OSError as ex:
            msg = f"data file cannot be read: {ex.strerror or ex}"
            raise CorruptCheckpointError(msg, path=dpath) from ex
        if len(data) != m.size:
            size = len(data)
            if size > m.size:
                with contextlib.suppress(FileNotFoundError):
                    size = self._fs.size(dpath)
            msg = f"data file has {size} bytes, manifest says {m.size} (truncated or damaged)"
            raise CorruptCheckpointError(msg, path=dpath)
        if m.split_sha256 is not None and m.tensor_ranges is not None:
            st, header = self._check_split_and_decode(data, m, dpath, seq_id, fingerprint)
        else:
            st, header = self._check_sha_and_decode(data, m, dpath, seq_id, fingerprint)
        if (m.seq_id, m.fingerprint, m.dtype, m.shape, m.digest) != (
            st.seq_id,
            st.fingerprint,
            str(st.dtype),
            st.state_shape,
            header.digest,
        ) or encode_seq_dir(m.seq_id) != seq_dir.rpartition("/")[2]:
            msg = "manifest and data file disagree (sequence, fingerprint, dtype, shape or digest)"
            raise CorruptCheckpointError(msg, path=mpath)
        return st, m

    def _check_split_and_decode(
        self, data: bytes, m: Manifest, dpath: str, seq_id: str | None, fingerprint: str | None
    ) -> tuple[SequenceState, StateHeader]:
        """One pass over the tensor bytes: their content digest (from the manifest's fields),
        then the split hash over the rest of the file and that digest, which must equal the
        manifest's ``split_sha256`` (every byte of the file checked before Arrow reads it).
        The decode then compares the same digest, computed over the very bytes its arrays
        view, with the file's own at its place in the order of checks."""
        assert m.tensor_ranges is not None and m.split_sha256 is not None
        s_off, s_len, z_off, z_len = m.tensor_ranges
        view = memoryview(data)
        fields = (m.seq_id, m.position, m.next_chunk, m.fingerprint, m.dtype, m.shape)
        digest = digest_of_bytes(*fields, view[s_off : s_off + s_len], view[z_off : z_off + z_len])
        split = split_file_hash(data, m.tensor_ranges, digest)
        if not hmac.compare_digest(split, m.split_sha256):
            msg = (
                f"sha256 {split[:16]}… of the file (split hash) differs from the manifest's "
                f"{m.split_sha256[:16]}… (damaged)"
            )
            raise CorruptCheckpointError(msg, path=dpath)
        base = np.frombuffer(data, np.uint8).ctypes.data
        hint = DigestHint(base + s_off, s_len, base + z_off, z_len, fields, digest)
        try:
            return self._decode(data, m, seq_id, fingerprint, hint)
        except CheckpointError as ex:
            raise ex.at(dpath) from ex

    def _check_sha_and_decode(
        self, data: bytes, m: Manifest, dpath: str, seq_id: str | None, fingerprint: str | None
    ) -> tuple[SequenceState, StateHeader]:
        """Manifests without a split hash (format 1 as first written): the file's SHA-256 and
        the decode with its content digest are two independent passes over the tensor bytes;
        the first runs in another thread (hashlib releases the GIL) while this thread decodes.
        Errors are reported in the documented order: a hash mismatch wins."""
        sha_job = in_thread(_sha256_hex, data) if len(data) >= _PARALLEL_HASH_BYTES else None
        decoded: tuple[SequenceState, StateHeader] | Exception
        try:
            decoded = self._decode(data, m, seq_id, fingerprint, None)
        except Exception as ex:  # reported after the hash check below
            decoded = ex
        sha = sha_job.result() if sha_job is not None else _sha256_hex(data)
        if not hmac.compare_digest(sha, m.sha256):
            msg = f"sha256 {sha[:16]}… differs from the manifest's {m.sha256[:16]}… (damaged)"
            raise CorruptCheckpointError(msg, path=dpath)
        if isinstance(decoded, CheckpointError):
            raise decoded.at(dpath) from decoded
        if isinstance(decoded, Exception):
            raise decoded
        return decoded

    @staticmethod
    def _decode(
        data: bytes,
        m: Manifest,
        seq_id: str | None,
        fingerprint: str | None,
        hint: DigestHint | None,
    ) -> tuple[SequenceState, StateHeader]:
        return decode_with_header(
            data,
            expected_fingerprint=fingerprint,
            expected_seq_id=m.seq_id if seq_id is None else seq_id,
            expected_position=m.position,
            expected_next_chunk=m.next_chunk,
            digest_hint=hint,
        )

    # --- listing, verification, garbage collection ---------------------------------------------

    def _seq_dirs(self) -> list[str]:
        return [
            n
            for n in self._fs.list_dir(self._fs.root)
            if decode_seq_dir(n) is not None or is_hashed_seq_dir(n)
        ]

    def sequences(self) -> list[str]:
        """Ids of the sequences that have at least one commit (readable or not), sorted."""
        out = []
        for name in self._seq_dirs():
            try:
                files = self._commit_files(self._fs.join(name))
            except CheckpointError:  # unlistable (a link): listed if its name gives the id
                files = []
                if decode_seq_dir(name) is not None:
                    out.append(str(decode_seq_dir(name)))
            if not files:
                continue
            seq_id = decode_seq_dir(name)
            if seq_id is None:  # hashed name: the id is in the manifests
                for path, n, pos in files:
                    try:
                        seq_id = self._parse_commit(path, n, pos).seq_id
                        break
                    except (CheckpointError, FileNotFoundError):
                        continue
            if seq_id is not None and encode_seq_dir(seq_id) == name:
                out.append(seq_id)
        return sorted(out)

    def commits(self, seq_id: str) -> list[CommitInfo]:
        """The commits of ``seq_id`` as their manifests describe them, newest first."""
        return self._commits_in(self._seq_dir(seq_id), seq_id)

    def _commits_in(self, seq_dir: str, seq_id: str | None) -> list[CommitInfo]:
        out = []
        for path, n, pos in self._commit_files(seq_dir):
            try:
                m = self._parse_commit(path, n, pos)
            except (CheckpointError, FileNotFoundError) as ex:
                where = -1 if pos is None else pos
                out.append(CommitInfo(seq_id, where, path, None, None, None, None, str(ex), n))
                continue
            out.append(
                CommitInfo(
                    m.seq_id,
                    m.position,
                    path,
                    f"{seq_dir}/{m.data_file}",
                    m.size,
                    m.next_chunk,
                    m.fingerprint,
                    None,
                    n,
                )
            )
        return out

    def verify(self) -> list[CheckpointProblem]:
        """Run every restore check (except the expected fingerprint) on every commit."""
        problems = []
        for name in self._seq_dirs():
            seq_dir = self._fs.join(name)
            try:
                files = self._commit_files(seq_dir)
            except CheckpointError as ex:  # e.g. a sequence folder that is a symbolic link
                problems.append(CheckpointProblem(ex.path or seq_dir, ex.reason, type(ex).__name__))
                continue
            for path, n, pos in files:
                try:
                    self._load_file(path, n, pos, None, None)
                except CheckpointError as ex:
                    problems.append(
                        CheckpointProblem(ex.path or path, ex.reason, type(ex).__name__)
                    )
        return problems

    def orphans(self) -> list[str]:
        """Data files that no manifest names (a crash before the commit, or a lost race)."""
        return [path for path, _ in self._orphans()]

    def _orphans(self) -> list[tuple[str, str]]:
        out = []
        for name in self._seq_dirs():
            seq_dir = self._fs.join(name)
            try:
                names = self._fs.list_dir(seq_dir)
            except CheckpointError as ex:  # a linked folder: nothing in it is ours to delete
                log.warning("checkpoint gc skips %s: %s", seq_dir, ex)
                continue
            referenced: set[str] = set()
            unreadable: set[int] = set()
            any_unreadable_chain = False
            for path, number, at in self._commit_files(seq_dir, names):
                try:
                    referenced.add(self._parse_commit(path, number, at).data_file)
                except (CheckpointError, FileNotFoundError):
                    # Keep the data files it may name: its position's (format 1), or all of
                    # them (an unreadable format-2 commit does not say its position).
                    if at is not None:
                        unreadable.add(at)
                    else:
                        any_unreadable_chain = True
            for n in names:
                if n.startswith(TMP_PREFIX):
                    out.append((f"{seq_dir}/{n}", n))
                    continue
                pos = parse_data_name(n)
                if (
                    pos is not None
                    and n not in referenced
                    and pos not in unreadable
                    and not any_unreadable_chain
                ):
                    out.append((f"{seq_dir}/{n}", n))
        return out

    def gc(self, grace_seconds: float = 3600.0) -> list[str]:
        """Remove orphan data files and stale temporaries older than ``grace_seconds``, and
        commits beyond ``keep``.  Returns the removed paths.

        The grace period protects commits in flight (their data file exists before their
        manifest); make it longer than any commit can take.
        """
        self.flush()
        now = self._clock()
        removed = []
        for path, _ in self._orphans():
            mtime = self._fs.mtime(path)
            if mtime is not None and now - mtime >= grace_seconds:
                self._fs.remove(path)
                removed.append(path)
        for name in self._seq_dirs():
            try:
                removed.extend(self._prune(self._fs.join(name)))
            except CheckpointError as ex:
                log.warning("checkpoint gc skips %s: %s", name, ex)
        if removed:
            log.info("checkpoint gc under %s removed %d files", self.root, len(removed))
        return removed
