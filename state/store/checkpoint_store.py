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

The store is an object made of parts, each in a module of its own and handed the parts it
uses: ``folders`` (`StoreFolders`: the storage, sequence folders, commit files), ``restore``
(`Restorer`: reading a commit with every check), ``retention`` (`Retention`: pruning),
``commit`` (`Committer`: a commit and its checks, the batched folder syncs) and ``listing``
(`Listing`: sequences, commits, verify, gc); ``types`` holds the values it returns.
`CheckpointStore` wires them together and is the store's one public face.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

from . import keep_record
from .commit import DEFAULT_RTOL as DEFAULT_RTOL  # re-exported, as before the split
from .commit import Committer
from .filesystems import LocalStorage, open_storage
from .folders import StoreFolders
from .listing import Listing
from .restore import Restorer
from .restore import check_expected_shape as check_expected_shape  # re-exported
from .retention import Retention
from .types import CheckpointProblem, CommitInfo, CommitOutcome, Head

__all__ = ["CheckpointProblem", "CheckpointStore", "CommitInfo", "CommitOutcome", "Head"]

log = logging.getLogger("linstream.state")

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _handed_to(
    part: str, method: Callable[Concatenate[Any, _P], _R]
) -> Callable[Concatenate[CheckpointStore, _P], _R]:
    """The store's method that is ``method`` of its part ``part`` (an attribute), with that
    method's signature and docstring: the keyword lists live in the part alone."""
    name = method.__name__

    @functools.wraps(method)
    def handed_on(self: CheckpointStore, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        bound: Callable[_P, _R] = getattr(getattr(self, part), name)
        return bound(*args, **kwargs)

    return handed_on


class CheckpointStore:
    """Commits and restores sequence states under ``root`` (local path or fsspec URL).

    keep: commits (positions) kept per sequence, at least 2 so a corrupt newest one has a
    fallback.  keep_every_tokens: N > 0 keeps besides them the first commit at or past each
    multiple of N tokens (positions a sequence can be rewound to: ``Retention``); None (the
    default) keeps by the N recorded in the store (`keep_record`; 0 when none), and
    `settle_keep_every` records a new one.
    rtol: tolerance of "equal within tolerance" as a fraction of each tensor's largest
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

    Its parts (see the module docstring) are attributes: ``folders``, ``restorer``,
    ``retention``, ``committer``, ``listing``.
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
        keep_every_tokens: int | None = None,
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
        #: How many commits ended in each outcome, and how many restores fell back.
        self.counters: dict[str, int] = {o.value: 0 for o in CommitOutcome} | {"fallbacks": 0}
        self.folders = StoreFolders(open_storage(root), sync_batch=sync_batch)
        if keep_every_tokens is None:
            keep_every_tokens = keep_record.read_keep_every(self.folders.fs) or 0
        self.retention = Retention(
            self.folders, keep, background=background_prune, keep_every_tokens=keep_every_tokens
        )
        self.restorer = Restorer(self.folders, self.counters)
        self.committer = Committer(
            self.folders, self.restorer, self.retention, self.counters, rtol=rtol
        )
        self.listing = Listing(self.folders, self.restorer, self.retention, clock)

    def __repr__(self) -> str:
        every = self.retention.keep_every_tokens
        more = f", keep_every_tokens={every}" if every else ""
        return f"CheckpointStore({self.root!r}, keep={self.keep}{more})"

    @property
    def sync_batch(self) -> int:
        return self.folders.sync_batch

    @property
    def location(self) -> str:
        """The root as one canonical URL (a local root resolved to its real path): the name by
        which output folders record that jobs of this store write into them."""
        fs = self.folders.fs
        if isinstance(fs, LocalStorage):
            return "file://" + os.path.realpath(fs.root)
        return f"{fs.protocol}://{fs.root}"

    def exists(self) -> bool:
        """Whether the root folder exists (a store with no commit yet may not have one)."""
        return self.folders.fs.is_dir(self.folders.fs.root)

    # --- the parts' methods, handed on (their signatures and docstrings are the parts') ----------

    commit = _handed_to("committer", Committer.commit)
    sync = _handed_to("committer", Committer.sync)
    sync_seq = _handed_to("committer", Committer.sync_seq)
    head = _handed_to("restorer", Restorer.head)
    restore = _handed_to("restorer", Restorer.restore)
    read_commit = _handed_to("restorer", Restorer.read_commit)
    read_position = _handed_to("restorer", Restorer.read_position)
    read_chain = _handed_to("restorer", Restorer.read_chain)
    sequences = _handed_to("listing", Listing.sequences)
    commits = _handed_to("listing", Listing.commits)
    verify = _handed_to("listing", Listing.verify)
    orphans = _handed_to("listing", Listing.orphans)

    # --- the whole store -------------------------------------------------------------------------

    def settle_keep_every(self, given: int | None) -> str | None:
        """Keep by ``--keep-every-tokens`` ``given`` (None: not given, the recorded N), recording
        a new N in the store (`keep_record.settle`); the line to tell the user, if any."""
        settled = keep_record.settle(self.folders.fs, given)
        self.retention.keep_every_tokens = settled.keep_every_tokens
        return settled.note

    def gc(self, grace_seconds: float = 3600.0) -> list[str]:
        """Remove orphan data files and stale temporaries older than ``grace_seconds``, and
        commits beyond ``keep``.  Returns the removed paths.

        The grace period protects commits in flight (their data file exists before their
        manifest); make it longer than any commit can take.
        """
        self.flush()
        removed = self.listing.collect(grace_seconds)
        if removed:
            log.info("checkpoint gc under %s removed %d files", self.root, len(removed))
        return removed

    # --- lifecycle -----------------------------------------------------------------------------

    def flush(self) -> None:
        """Sync (``sync_batch``), then wait for the pruning scheduled so far."""
        self.committer.sync()
        self.retention.flush()

    def close(self) -> None:
        """Flush and stop the pruning thread (the store stays usable: it restarts it)."""
        self.flush()
        self.retention.close()

    def __enter__(self) -> CheckpointStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
