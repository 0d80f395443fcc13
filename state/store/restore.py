"""Restoring from a checkpoint store: the newest readable commit, with every check on the way.

Every file is untrusted: the manifest is parsed and checked, the data file's size and hash are
compared with it before Arrow reads a byte, and the decode checks structure, fingerprint,
identity, digest and finite values (see ``Restorer.head``).  `Restorer` is the part of the store
that reads commits; it is handed the store's folders, and handed to the parts that commit and
list.

(About 400 lines: every check a restore makes, in the order it makes them.)
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
from collections.abc import Callable

import numpy as np
from linstream.state.codec import DigestHint, StateHeader, decode_with_header, digest_of_bytes
from linstream.state.errors import (
    CheckpointError,
    CorruptCheckpointError,
    ShapeMismatchError,
    SupersededError,
)
from linstream.state.sequence_state import SequenceState

from .filesystems import in_thread
from .folders import StoreFolders
from .manifest import Manifest, split_file_hash
from .paths import encode_seq_dir
from .types import NO_HISTORY, Head

__all__ = ["ManifestCheck", "Restorer", "check_expected_shape", "moved_on", "run_check"]

#: A caller's own check of a commit manifest (e.g. that the output files it names are in a place
#: the caller trusts): raises ``CorruptCheckpointError`` to refuse the commit.
ManifestCheck = Callable[[Manifest], None]

log = logging.getLogger("linstream.state")

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


#: How many times `head` reads a sequence's commits when the commit it reads keeps vanishing.
_REREADS = 5


class _Vanished(Exception):
    """A commit being read was removed meanwhile (another writer's retention): read again."""


def run_check(check: ManifestCheck | None, m: Manifest, path: str) -> None:
    """Run a caller's ``check`` on the manifest at ``path``; its refusal names ``path``."""
    if check is None:
        return
    try:
        check(m)
    except CheckpointError as ex:
        raise ex.at(path) from None


def moved_on(seq_id: str, commit: int, newest: int, path: str) -> SupersededError:
    """The refusal of a writer whose commit ``commit`` is gone because the history moved on to
    ``newest`` (retention keeps only the newest commits)."""
    msg = (
        f"sequence {seq_id!r}: commit {commit} was removed while this writer used it: the "
        f"history has moved on to commit {newest} (another job advanced this sequence; "
        "one writer per sequence history)"
    )
    return SupersededError(msg, path=path)


class Restorer:
    """Reads and checks commits: ``head``, ``restore``, ``read_commit``, ``read_position``,
    ``read_chain``; counts the fallbacks in ``counters["fallbacks"]``."""

    def __init__(self, folders: StoreFolders, counters: dict[str, int]) -> None:
        self.folders, self.counters = folders, counters

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
        check: ManifestCheck | None = None,
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
        ``check``, when given, runs on each manifest that passed the others; what it refuses is
        treated as corrupt, and a skipped commit it refused is listed without its manifest (so
        that nothing it names is touched).

        Another job may advance the sequence meanwhile, and its retention remove the commit
        being read: a commit that vanished while it was read starts the reading over (a few
        times), it is not reported as corrupt.
        """
        for _attempt in range(_REREADS - 1):
            try:
                return self._head_once(seq_id, fingerprint, fallback, expected_shape, check)
            except _Vanished:
                continue
        return self._head_once(seq_id, fingerprint, fallback, expected_shape, check, last=True)

    def _head_once(
        self,
        seq_id: str,
        fingerprint: str | None,
        fallback: bool,
        expected_shape: tuple[int, ...] | None,
        check: ManifestCheck | None,
        *,
        last: bool = False,
    ) -> Head | None:
        seq_dir = self.folders.seq_dir(seq_id)
        first_error: CorruptCheckpointError | None = None
        skipped: list[tuple[str, Manifest | None]] = []
        files = self.folders.commit_files(seq_dir)
        newest = max((n for _, n, _ in files if n is not None), default=0)
        for path, n, pos in files:
            try:
                # A commit of another shape is a ShapeMismatchError, raised from its manifest
                # before its data file is read.
                st, m = self.load_file(path, n, pos, seq_id, fingerprint, expected_shape)
                run_check(check, m, path)
            except CorruptCheckpointError as ex:
                if not last and n is not None and self.folders.vanished(seq_dir, n) is not None:
                    raise _Vanished from ex
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
                skipped.append((path, self._checked_or_none(path, n, pos, check)))
                continue
            return Head(st, m.history or NO_HISTORY, path, tuple(skipped), newest)
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
        return self.read_position(
            seq_id, position, fingerprint=fingerprint, expected_shape=expected_shape
        ).state

    def read_position(
        self,
        seq_id: str,
        position: int,
        *,
        fingerprint: str | None = None,
        expected_shape: tuple[int, ...] | None = None,
        check: ManifestCheck | None = None,
    ) -> Head:
        """The newest commit of ``seq_id`` at ``position`` (its state and history), with every
        restore check (and ``check``, as in ``head``)."""
        seq_dir = self.folders.seq_dir(seq_id)
        for path, n, pos in self.folders.commit_files(seq_dir):
            if pos is not None and pos != position:
                continue
            if n is not None:
                try:
                    if self.folders.parse_commit(path, n, None).position != position:
                        continue
                except (CheckpointError, FileNotFoundError):
                    continue
            st, m = self.load_file(path, n, pos, seq_id, fingerprint, expected_shape)
            run_check(check, m, path)
            return Head(st, m.history or NO_HISTORY, path, (), n or 0)
        msg = f"no commit at position {position}"
        raise CorruptCheckpointError(msg, path=seq_dir)

    def read_chain(
        self,
        seq_id: str,
        commit: int,
        *,
        fingerprint: str | None = None,
        check: ManifestCheck | None = None,
    ) -> Head:
        """Commit number ``commit`` of ``seq_id``'s chain, with every restore check (and
        ``check``, as in ``head``)."""
        seq_dir = self.folders.seq_dir(seq_id)
        path = self.folders.commit_path(seq_dir, commit)
        try:
            st, m = self.load_file(path, commit, None, seq_id, fingerprint)
        except CorruptCheckpointError as ex:
            newest = self.folders.vanished(seq_dir, commit)
            if newest is None or newest <= commit:
                raise
            raise moved_on(seq_id, commit, newest, path) from ex
        run_check(check, m, path)
        return Head(st, m.history or NO_HISTORY, path, (), commit)

    def _checked_or_none(
        self, path: str, n: int | None, pos: int | None, check: ManifestCheck | None
    ) -> Manifest | None:
        """The manifest of a skipped commit, or None when it is unreadable or ``check``
        refuses it (nothing it names may be touched then)."""
        try:
            m = self.folders.parse_commit(path, n, pos)
        except (CheckpointError, FileNotFoundError):
            return None
        try:
            run_check(check, m, path)
        except CheckpointError as ex:
            log.warning("%s: %s", path, ex.reason)
            return None
        return m

    def load_file(
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
            m = self.folders.parse_commit(mpath, number, position)
        except FileNotFoundError as ex:
            msg = "manifest disappeared"
            raise CorruptCheckpointError(msg, path=mpath) from ex
        except OSError as ex:  # unreadable for another reason (permissions, I/O error)
            msg = f"manifest cannot be read: {ex.strerror or ex}"
            raise CorruptCheckpointError(msg, path=mpath) from ex
        check_expected_shape(m.shape, expected_shape, path=mpath)
        dpath = f"{seq_dir}/{m.data_file}"
        try:
            data = self.folders.fs.read(dpath, m.size)  # at most m.size + 1 bytes: no stat needed
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
                    size = self.folders.fs.size(dpath)
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
