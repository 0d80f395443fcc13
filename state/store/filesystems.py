"""The two storage primitives the checkpoint store needs, on local disk and on fsspec.

``write_immutable(path, data)``: the file at ``path`` holds ``data`` durably when it returns
(content-addressed names: an existing file with the same name is left alone when it already holds
these bytes).  ``create_exclusive(path, data)``: create-if-absent, durable, returns False when the
name already exists.  Local disk: write a unique temporary file, fsync it, ``os.link`` it to the
final name (link fails if the name exists), fsync the folder.  fsspec: ``pipe_file`` for data and
``pipe_file(path, data, mode="create")`` for the exclusive create, only on implementations
known to send it as a server-side condition (`EXCLUSIVE_CREATE`; object stores make an object
visible only when its upload completes); any other filesystem is refused.

A store's files are untrusted input.  On local disk no symbolic link below the root is ever
followed, for reads, writes or deletes: every folder between the root and a file is checked with
``lstat``, files are opened with ``O_NOFOLLOW`` (``UnsafePathError``), and only regular files are
read: a directory, FIFO, device or socket under a store name raises ``NotARegularFileError``
before it is opened (``lstat``), and again after (``O_NONBLOCK`` open, then ``fstat``), so a FIFO
never blocks a reader.  The root itself may be a link (the user chose it).

(About 540 lines: local disk and fsspec implement the same two primitives side by side, so that
their guarantees can be compared line by line.)
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import hashlib
import os
import stat
import threading
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol

from linstream.state.errors import NotARegularFileError, UnsafePathError

from .paths import TMP_PREFIX

__all__ = [
    "EXCLUSIVE_CREATE",
    "FsspecStorage",
    "LocalStorage",
    "Storage",
    "UnsafeStorageError",
    "in_thread",
    "open_storage",
]


class Storage(Protocol):
    root: str

    def join(self, *parts: str) -> str: ...
    def makedirs(self, path: str) -> None: ...
    def list_dir(self, path: str) -> list[str]: ...
    def read(self, path: str, limit: int) -> bytes: ...
    def size(self, path: str) -> int: ...
    def write_immutable(self, path: str, data: Any) -> None: ...
    def create_exclusive(self, path: str, data: bytes) -> bool: ...
    def replace(self, path: str, data: bytes) -> None: ...
    def commit_files(
        self,
        data: Any,
        manifest_path: str,
        prepare: Prepare,
        ready: Ready | None = None,
        *,
        sync_folder: bool = True,
    ) -> bool: ...
    def remove(self, path: str) -> None: ...
    def mtime(self, path: str) -> float | None: ...
    def is_dir(self, path: str) -> bool: ...


#: ``prepare(sha256 of data) -> (data file path, manifest bytes)``, called once per commit.
Prepare = Callable[[str], tuple[str, bytes]]
#: ``ready()``: returns once what the manifest names besides the data is durable (or raises).
Ready = Callable[[], object]


def _tmp_name(path: str) -> str:
    head, _, _ = path.rpartition("/")
    return f"{head}/{TMP_PREFIX}{uuid.uuid4().hex}"


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISLNK, "a symbolic link"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), f"a file of mode {mode:o}")


def _not_regular(path: str, mode: int) -> NotARegularFileError:
    msg = f"expected a regular file, found {_kind(mode)}"
    return NotARegularFileError(msg, path=path)


def _link_refused(path: str, what: str = "file") -> UnsafePathError:
    msg = (
        f"{what} is a symbolic link; a checkpoint store holds none and linstream follows none "
        "(a link could lead reads, writes or deletes out of the store)"
    )
    return UnsafePathError(msg, path=path)


_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class LocalStorage:
    """Local disk with POSIX durability: fsync of files and of the folder.

    No symbolic link below the root is followed, and only regular files are read (see the
    module docstring)."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(os.path.expanduser(root)).replace(os.sep, "/")

    def join(self, *parts: str) -> str:
        return "/".join((self.root, *parts))

    def check_inside(self, path: str) -> None:
        """Refuse ``path`` unless it is the root or below it with no link in the folders between
        (``UnsafePathError``); the last component is the caller's to open without following."""
        if path == self.root:
            return
        prefix = self.root.rstrip("/") + "/"
        parts = path[len(prefix) :].split("/") if path.startswith(prefix) else [".."]
        if any(p in ("", ".", "..") for p in parts):
            msg = f"is not a path inside the store root {self.root}"
            raise UnsafePathError(msg, path=path)
        folder = prefix.rstrip("/")
        for part in parts[:-1]:
            folder = f"{folder}/{part}"
            try:
                mode = os.lstat(folder).st_mode
            except FileNotFoundError:
                return  # nothing below exists either: the caller's own call fails on its own
            if stat.S_ISLNK(mode):
                raise _link_refused(path, f"folder {folder}")

    def _lstat_below_root(self, path: str) -> os.stat_result:
        self.check_inside(path)
        st = os.lstat(path)
        if path != self.root and stat.S_ISLNK(st.st_mode):
            raise _link_refused(path)
        return st

    def makedirs(self, path: str) -> None:
        self.check_inside(path)
        os.makedirs(path, exist_ok=True)
        self._lstat_below_root(path)  # an existing link passes makedirs: refuse it here

    def list_dir(self, path: str) -> list[str]:
        try:
            mode = self._lstat_below_root(path).st_mode
            if not stat.S_ISDIR(mode) and path != self.root:
                return []
            return sorted(os.listdir(path))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def is_dir(self, path: str) -> bool:
        if path == self.root:
            return os.path.isdir(path)
        try:
            return stat.S_ISDIR(self._lstat_below_root(path).st_mode)
        except FileNotFoundError:
            return False

    def open_regular(self, path: str) -> int:
        """A read-only descriptor of the regular file at ``path`` (never a link, FIFO, device,
        socket or directory; a FIFO is refused without blocking)."""
        mode = self._lstat_below_root(path).st_mode  # devices and FIFOs are never opened
        if not stat.S_ISREG(mode):
            raise _not_regular(path, mode)
        try:
            fd = os.open(path, _READ_FLAGS)
        except OSError as ex:
            if ex.errno == errno.ELOOP:  # replaced by a link since the lstat
                raise _link_refused(path) from ex
            if ex.errno == errno.ENXIO:  # a socket or FIFO end without a peer
                msg = "expected a regular file, found a socket or FIFO"
                raise NotARegularFileError(msg, path=path) from ex
            raise
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # replaced since the lstat
            os.close(fd)
            raise _not_regular(path, st.st_mode)
        return fd

    def read(self, path: str, limit: int) -> bytes:
        """At most ``limit + 1`` bytes (so a caller sees a file longer than it should be)."""
        with open(self.open_regular(path), "rb", buffering=0) as f:
            if limit < 0:
                return f.readall()
            # The limit can come from an untrusted manifest: never ask for more than is there.
            return _read_up_to(f, min(limit, os.fstat(f.fileno()).st_size) + 1)

    def size(self, path: str) -> int:
        return self._lstat_below_root(path).st_size

    def _write_tmp(self, path: str, data: Any) -> str:
        tmp = _tmp_name(path)
        self.check_inside(tmp)
        fd = os.open(tmp, _CREATE_FLAGS, 0o644)
        try:
            view = memoryview(data).cast("B")
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
        finally:
            os.close(fd)
        return tmp

    def write_tmp_async(self, path: str, data: Any) -> concurrent.futures.Future[str]:
        """Write and fsync a temporary file in a thread (overlaps the flush with other work)."""
        return in_thread(self._write_tmp, path, data)

    def publish_immutable(self, tmp: str, path: str, data: Any) -> None:
        """Link a written temporary file to its content-addressed name, then drop the temp."""
        try:
            os.link(tmp, path)
        except FileExistsError:
            # Same name = same content hash; repair a damaged copy, never rewrite a good one.
            try:
                intact = self.read(path, len(memoryview(data).cast("B"))) == bytes(data)
            except UnsafePathError:
                intact = False  # a link in our file's place: replaced (the link, not its target)
            if not intact:
                os.replace(tmp, path)
            else:
                # An old orphan being reused: restart its GC grace period, or a gc() that listed
                # it before this commit's manifest exists could delete it from under the commit.
                os.utime(path, follow_symlinks=False)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def write_immutable(self, path: str, data: Any) -> None:
        self.publish_immutable(self._write_tmp(path, data), path, data)

    def create_exclusive(self, path: str, data: bytes) -> bool:
        tmp = self._write_tmp(path, data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        self.sync_dir(path.rpartition("/")[0])
        return True

    def replace(self, path: str, data: bytes) -> None:
        """Write ``path`` whole, replacing what is there: a temporary file, fsynced, renamed
        over it (a reader sees the old bytes or the new, never half), then the folder fsynced."""
        self.check_inside(path)  # rename replaces a link in the name's place, never its target
        tmp = self._write_tmp(path, data)
        try:
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        self.sync_dir(path.rpartition("/")[0])

    def commit_files(
        self,
        data: Any,
        manifest_path: str,
        prepare: Prepare,
        ready: Ready | None = None,
        *,
        sync_folder: bool = True,
    ) -> bool:
        """Data file, then manifest (create-if-absent); False when the manifest existed.

        The data goes to a temporary file, fsynced in a thread while this thread hashes the
        data, builds the manifest and writes + fsyncs it to its own temporary file: both
        contents are durable before either name exists.  Then the data file is linked to its
        content-addressed name, the manifest is linked (the commit: ``link`` fails if the name
        exists) and the folder is fsynced once.  Journaling filesystems (ext4, xfs) persist the
        two links in order; elsewhere a crash inside that last fsync may leave a manifest whose
        data file is missing: restore reports it as corrupt and a retried commit of the same
        state repairs it (the data file is content-addressed).  A manifest is never visible
        half-written.  ``ready`` (another file the manifest names, written meanwhile) is
        waited for before either name is linked.  ``sync_folder=False`` leaves that last fsync
        to the caller (`sync_dir`), which batches it with other commits' and makes it before
        anything relies on the commit.
        """
        pending = self.write_tmp_async(manifest_path, data)
        manifest_tmp = None
        try:
            data_path, manifest = prepare(hashlib.sha256(data).hexdigest())
            manifest_tmp = self._write_tmp(manifest_path, manifest)
            if ready is not None:
                ready()
        except BaseException:
            if manifest_tmp is not None:
                os.unlink(manifest_tmp)
                manifest_tmp = None
            raise
        finally:
            data_tmp = pending.result()
            if manifest_tmp is None:  # prepare, the manifest write or ``ready`` failed
                os.unlink(data_tmp)
        try:
            self.publish_immutable(data_tmp, data_path, data)
            try:
                os.link(manifest_tmp, manifest_path)
            except FileExistsError:
                return False
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(manifest_tmp)
        if sync_folder:
            self.sync_dir(manifest_path.rpartition("/")[0])
        return True

    def sync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def remove(self, path: str) -> None:
        self.check_inside(path)  # unlink never follows the last component; the folders are ours
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    def mtime(self, path: str) -> float | None:
        try:
            self.check_inside(path)
            return os.lstat(path).st_mtime
        except FileNotFoundError:
            return None


def _read_up_to(f: Any, n: int) -> bytes:
    chunks = []
    while n > 0:
        chunk = f.read(n)
        if not chunk:
            break
        chunks.append(chunk)
        n -= len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


#: Threads of the pool that writes and hashes beside the caller (made as they are needed).
IO_THREADS = 8
_pool: tuple[int, concurrent.futures.ThreadPoolExecutor] | None = None
_pool_lock = threading.Lock()


def _io_pool() -> concurrent.futures.ThreadPoolExecutor:
    """The process's I/O pool, started once (again in a forked child, whose copy has no
    threads)."""
    global _pool
    pid = os.getpid()
    with _pool_lock:
        if _pool is None or _pool[0] != pid:
            pool = concurrent.futures.ThreadPoolExecutor(IO_THREADS, "linstream-io")
            _pool = (pid, pool)
        return _pool[1]


def in_thread(fn: Any, *args: Any) -> concurrent.futures.Future[Any]:
    """Run ``fn(*args)`` on the process's I/O pool (hashing and file I/O release the GIL);
    ``result()`` waits and re-raises its exception.

    A pool started once, not a thread per call: starting a thread waits until the new thread
    runs, about 0.75 ms a call on a loaded 2-vCPU machine, two per commit.  No call run here
    waits for another one run here, so the bounded pool cannot deadlock."""
    return _io_pool().submit(fn, *args)


#: fsspec implementations whose create-if-absent is a real, atomic server-side condition:
#: gcsfs sends ``ifGenerationMatch=0``, s3fs ``If-None-Match: *``, and memory:// checks and
#: creates under the GIL in one process.  Any other implementation may accept mode "xb" and
#: still overwrite (fsspec's base class leaves the condition to each backend).
EXCLUSIVE_CREATE = {
    "gs": "gcsfs",
    "gcs": "gcsfs",
    "s3": "s3fs",
    "s3a": "s3fs",
    "memory": "fsspec",
}
PROBE_PREFIX = ".linstream-probe-"


class UnsafeStorageError(OSError):
    """A filesystem that cannot create a file only if it is absent: a store there is refused."""


class FsspecStorage:
    """Any fsspec filesystem with a real create-if-absent (gs://, s3://, memory://).

    Others are refused with `UnsafeStorageError`: two jobs could both commit one position.  On
    object stores the condition is also checked once against the server (``probe``): an
    S3-compatible store that ignores ``If-None-Match`` would otherwise overwrite silently.
    """

    def __init__(self, url: str, *, probe: bool = True) -> None:
        import fsspec

        fs, path = fsspec.core.url_to_fs(url)
        self.fs = fs
        self.protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        self.root = path.rstrip("/")
        package = type(fs).__module__.partition(".")[0]
        if EXCLUSIVE_CREATE.get(self.protocol) != package:
            known = ", ".join(f"{p}:// ({m})" for p, m in EXCLUSIVE_CREATE.items())
            msg = (
                f"checkpoint store {url}: filesystem {self.protocol!r} ({type(fs).__name__}) "
                f"has no known atomic create-if-absent, which commits need; expected a local "
                f"path or one of {known}"
            )
            raise UnsafeStorageError(msg)
        # Checked before the first exclusive create (readers never write a probe).
        self._probe_pending = probe and self.protocol != "memory"
        self._probe_lock = threading.Lock()

    def check_exclusive_create(self) -> None:
        """Create one probe object twice with create-if-absent; the second must be refused."""
        path = self.join(f"{PROBE_PREFIX}{uuid.uuid4().hex}")
        try:
            if not self._create(path, b"1"):
                msg = f"{path}: a fresh probe name already exists"
                raise UnsafeStorageError(msg)
            if self._create(path, b"2"):
                condition = (
                    "If-None-Match: *" if self.protocol.startswith("s3") else "ifGenerationMatch=0"
                )
                msg = (
                    f"checkpoint store {self.protocol}://{self.root}: the server accepted a "
                    f"second create-if-absent of one object (it ignores {condition}), so two "
                    "commits could overwrite each other; use a store that honours conditional "
                    "writes"
                )
                raise UnsafeStorageError(msg)
        finally:
            self.remove(path)

    def join(self, *parts: str) -> str:
        return "/".join((self.root, *parts))

    def makedirs(self, path: str) -> None:
        self.fs.makedirs(path, exist_ok=True)

    def list_dir(self, path: str) -> list[str]:
        try:
            entries = self.fs.ls(path, detail=False, refresh=True)
        except (FileNotFoundError, NotADirectoryError):
            return []
        except TypeError:  # filesystems without `refresh`
            entries = self.fs.ls(path, detail=False)
        return sorted({e.rstrip("/").rpartition("/")[2] for e in entries})

    def is_dir(self, path: str) -> bool:
        try:
            return bool(self.fs.isdir(path))
        except FileNotFoundError:
            return False

    def read(self, path: str, limit: int) -> bytes:
        """At most ``limit + 1`` bytes, in one ranged request (``cat_file``: no read-ahead
        buffer, whose background fetch would log an error with a traceback when another job
        removes the object meanwhile; here that is a plain ``FileNotFoundError``)."""
        try:
            if limit < 0:
                return bytes(self.fs.cat_file(path))
            return bytes(self.fs.cat_file(path, start=0, end=limit + 1))
        except IsADirectoryError as ex:
            msg = "expected a regular file, found a directory"
            raise NotARegularFileError(msg, path=path) from ex
        except FileNotFoundError:
            raise
        except OSError:
            # S3 refuses any range of an empty object (416); other errors stand.
            with contextlib.suppress(OSError):
                if self.fs.size(path) == 0:
                    return b""
            raise

    def size(self, path: str) -> int:
        return int(self.fs.size(path))

    def write_immutable(self, path: str, data: Any) -> None:
        # Always (re)written, even when an equal file exists: that also restarts an old orphan's
        # GC grace period, as on local disk.
        self.fs.pipe_file(path, bytes(data))

    def replace(self, path: str, data: bytes) -> None:
        # One upload: object stores publish the new object whole when it completes.
        self.fs.pipe_file(path, bytes(data))

    def create_exclusive(self, path: str, data: bytes) -> bool:
        if self._probe_pending:
            with self._probe_lock:
                if self._probe_pending:
                    self.check_exclusive_create()
                    self._probe_pending = False
        return self._create(path, data)

    def _create(self, path: str, data: bytes) -> bool:
        # One request carrying the condition: the object appears whole or not at all.
        try:
            self.fs.pipe_file(path, bytes(data), mode="create")
        except FileExistsError:
            return False
        except (NotImplementedError, ValueError, TypeError) as ex:
            msg = (
                f"filesystem {self.protocol!r} cannot create {path} exclusively "
                f"(pipe_file mode 'create'): {ex}; upgrade its fsspec implementation (gcsfs, "
                "s3fs) to a version with exclusive writes"
            )
            raise UnsafeStorageError(msg) from ex
        return True

    def commit_files(
        self,
        data: Any,
        manifest_path: str,
        prepare: Prepare,
        ready: Ready | None = None,
        *,
        sync_folder: bool = True,
    ) -> bool:
        """Data object first, then the manifest with an exclusive create (the commit; durable
        when the request returns, so ``sync_folder`` changes nothing here)."""
        data_path, manifest = prepare(hashlib.sha256(data).hexdigest())
        self.write_immutable(data_path, data)
        if ready is not None:
            ready()
        return self.create_exclusive(manifest_path, manifest)

    def remove(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(path)

    def mtime(self, path: str) -> float | None:
        try:
            info = self.fs.info(path)
        except FileNotFoundError:
            return None
        for key in ("mtime", "updated", "LastModified", "last_modified", "created"):
            value = info.get(key)
            if isinstance(value, int | float):
                return float(value)
            if isinstance(value, datetime):
                return value.timestamp()
            if isinstance(value, str):
                with contextlib.suppress(ValueError):
                    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        return None


def open_storage(root: str) -> LocalStorage | FsspecStorage:
    """Local paths and ``file://`` URLs use ``LocalStorage``; other URLs go through fsspec."""
    if "://" not in root:
        return LocalStorage(root)
    if root.startswith("file://"):
        return LocalStorage(root[len("file://") :])
    return FsspecStorage(root)
