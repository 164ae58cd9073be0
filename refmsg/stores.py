"""Claim-check stores: where offloaded payloads live (docs/how-to/claim-check.md).

The contract (:class:`ObjectStore`) is what :func:`~refmsg.offload` and
:func:`~refmsg.resolve` need: ``put``, ``open`` (the object's size *before* a
byte is read, then a stream) and ``delete`` (idempotent). :class:`ListableStore`
adds ``list``, which an orphan sweep needs: every object with its size and
modification time. It is a second protocol rather than a fourth method of the
first, so a store written against the three-method contract keeps type-checking
and keeps working with offload and resolve; the stores here implement both.

* :class:`DirectoryStore`: a local (or mounted) directory; atomic puts
  (temporary file, fsync, rename), files ``0600`` by default, symlinks and
  special files refused.
* :class:`FsspecStore`: any `fsspec <https://filesystem-spec.readthedocs.io>`_
  file system (``s3://`` through s3fs, ``gs://``, ``abfs://``, ``memory://``,
  ``file://``); fsspec is imported only when one is built.
* :func:`open_store`: a URL to a store.

Keys are confined like receiver names (``refmsg.paths.split_name``): relative,
``/``-separated, no empty, ``.`` or ``..`` component, no backslash or NUL, so a
forged reference cannot name an object outside the store's root or prefix.
A missing object is a :class:`~refmsg.errors.StoreError` whose ``missing`` is
true, which ``missing="skip"`` tells from every other failure.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import stat
import uuid
from collections.abc import Iterator, Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, BinaryIO, NamedTuple, Protocol, cast, runtime_checkable

from segmenter.errors import SegmentationError

from .errors import PathError, StoreError, StoreFault
from .paths import RESERVED, open_parent, open_regular, open_root, split_name

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

Buffer = bytes | bytearray | memoryview

log = logging.getLogger(__name__)

INSTALL_HINT = 'pip install fsspec cryptography (the extra objectstore: pip install -e ".[objectstore]" in the source)'
DEFAULT_FILE_MODE = 0o600  # offloaded payloads are nobody else's business: owner read/write only
_TEMP = re.compile(r"\..*\.[0-9a-f]{32}\.tmp\Z", re.DOTALL)  # what an unfinished put leaves (see _temp_name)


class StoredObject(NamedTuple):
    """An opened stored object: its size as the store reports it, and a stream at its first byte.

    The size comes before any byte is read (``fstat``, S3's ContentLength), so a
    reader can refuse an object of the wrong size without reading it. The
    caller closes the stream.
    """

    size: int
    """The object's size in bytes, as the store reports it before any byte is read."""
    stream: BinaryIO
    """A binary stream at the object's first byte; the caller closes it."""


class ObjectInfo(NamedTuple):
    """One stored object as :meth:`ListableStore.list` reports it.

    ``size`` is the number of bytes stored (for an encrypted store, the envelope's);
    ``modified`` is timezone-aware UTC: the file's mtime, S3's LastModified.
    """

    key: str
    """The object's key in the store."""
    size: int
    modified: datetime


@runtime_checkable
class ObjectStore(Protocol):
    """Where offloaded payloads live. ``name`` is recorded in the message (SrcEnv).

    ``put`` stores ``data`` under ``key`` whole or not at all; ``open`` returns
    the object's size before its bytes, and raises :class:`~refmsg.errors.StoreError`
    (``missing`` true when there is no such object); ``delete`` removes it and
    is a no-op for a key that holds nothing.
    """

    name: str

    def put(self, key: str, data: Buffer) -> None: ...

    def open(self, key: str) -> StoredObject: ...

    def delete(self, key: str) -> None: ...


@runtime_checkable
class ListableStore(ObjectStore, Protocol):
    """An :class:`ObjectStore` that can also enumerate what it holds (an orphan sweep needs it).

    ``list(prefix)`` yields every object whose key starts with ``prefix``
    (a plain string prefix, as S3 means it), in key order, with its size and
    modification time.
    """

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]: ...


def _temp_name(leaf: str) -> str:
    return f".{leaf[:200]}.{uuid.uuid4().hex}.tmp"


def _check_prefix(prefix: str) -> None:
    """A prefix is a key or a beginning of one: the same refusals (PathError), a trailing ``/`` allowed."""
    if prefix:
        split_name(prefix[:-1] if prefix.endswith("/") else prefix)


def _confined(key: str) -> tuple[str, ...]:
    """The key's components; :class:`~refmsg.errors.PathError` (9017) for a key that could leave the root."""
    return split_name(key)


def _missing(key: str, detail: str = "no such object") -> StoreError:
    return StoreError(f"cannot find {key!r}: {detail}", key=key, cause=StoreFault.MISSING)


class DirectoryStore:
    """An :class:`ObjectStore` (and :class:`ListableStore`) over a local or mounted directory.

    Each object is written to a temporary file in its directory, fsynced, and
    renamed over the key (atomic), with ``file_mode`` (default ``0o600``: the
    payloads are readable by the owner only; directories are ``0o755``). Reads
    go through directory descriptors with ``O_NOFOLLOW``: a symlink at the key
    or on the way, a directory, FIFO, socket or device is refused.

    ``root``: the directory the objects are kept under (created if missing). ``name``: the store's name, which
    references carry. ``fsync``: True makes each put durable before it returns (the file and its directory fsynced).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        name: str = "dir",
        fsync: bool = True,
        file_mode: int = DEFAULT_FILE_MODE,
    ) -> None:
        self.root = os.fspath(root)
        self.name = name
        self.file_mode = file_mode
        self._fsync = fsync
        os.makedirs(self.root, exist_ok=True)

    def __repr__(self) -> str:
        return f"DirectoryStore({self.root!r}, name={self.name!r})"

    def _dir(self, key: str, create: bool) -> tuple[int, str]:
        parts = _confined(key)
        root_fd = open_root(self.root, create=False)
        try:
            return open_parent(root_fd, parts, create=create), parts[-1]
        except PathError as exc:
            if exc.details.get("missing"):
                raise _missing(key, "its directory does not exist") from None
            raise StoreError(f"cannot reach {key!r}: {exc}", key=key, cause=StoreFault.NOT_AN_OBJECT) from None
        finally:
            os.close(root_fd)

    def put(self, key: str, data: Buffer) -> None:
        dir_fd, leaf = self._dir(key, create=True)
        tmp = _temp_name(leaf)
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
            fd = os.open(tmp, flags, self.file_mode, dir_fd=dir_fd)
            try:
                os.fchmod(fd, self.file_mode)  # the umask only narrows the mode; this is the mode asked for
                view = memoryview(data).cast("B")
                while view:
                    view = view[os.write(fd, view) :]
                if self._fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, leaf, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            if self._fsync:
                os.fsync(dir_fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise StoreError(f"cannot store {key!r}: {exc.strerror}", key=key, errno=exc.errno) from None
        finally:
            os.close(dir_fd)

    def open(self, key: str) -> StoredObject:
        """The object under ``key``: a regular file only, its size from ``fstat`` of the open descriptor."""
        dir_fd, leaf = self._dir(key, create=False)
        try:
            fd, st = open_regular(dir_fd, leaf, key)
        except SegmentationError as exc:
            raise StoreError(f"cannot read {key!r}: {exc}", key=key, cause=StoreFault.NOT_AN_OBJECT) from None
        except FileNotFoundError:
            raise _missing(key) from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise StoreError(f"cannot read {key!r}: a symlink", key=key, cause=StoreFault.NOT_AN_OBJECT) from None
            raise StoreError(f"cannot read {key!r}: {exc.strerror}", key=key, errno=exc.errno) from None
        finally:
            os.close(dir_fd)
        return StoredObject(st.st_size, os.fdopen(fd, "rb", buffering=0))  # unbuffered: no read-ahead past the size

    def delete(self, key: str) -> None:
        try:
            dir_fd, leaf = self._dir(key, create=False)
        except StoreError as exc:
            if exc.missing:
                return
            raise
        try:
            os.unlink(leaf, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StoreError(f"cannot delete {key!r}: {exc.strerror}", key=key, errno=exc.errno) from None
        finally:
            os.close(dir_fd)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every regular file under the root whose key starts with ``prefix``, in key order.

        Symlinks are neither followed nor listed, nor are names that are not
        valid keys (the receiver's ``.refmsg``, a put's unfinished temporary file).
        """
        _check_prefix(prefix)
        yield from self._walk(self.root, "", prefix)

    def _walk(self, path: str, base: str, prefix: str) -> Iterator[ObjectInfo]:
        try:
            with os.scandir(path) as it:
                entries = sorted(it, key=lambda e: e.name)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StoreError(f"cannot list {path!r}: {exc.strerror}", errno=exc.errno) from None
        for entry in entries:
            key = base + entry.name
            if (not base and entry.name == RESERVED) or _TEMP.match(entry.name):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # deleted while listed
            if stat.S_ISDIR(st.st_mode):
                if prefix.startswith(key + "/") or (key + "/").startswith(prefix):
                    yield from self._walk(entry.path, key + "/", prefix)
            elif stat.S_ISREG(st.st_mode) and key.startswith(prefix):
                yield ObjectInfo(key, st.st_size, datetime.fromtimestamp(st.st_mtime, timezone.utc))


def _fsspec() -> Any:
    try:
        import fsspec
    except ImportError:
        raise StoreError(
            f"object stores need the fsspec package: {INSTALL_HINT}", cause=StoreFault.NOT_INSTALLED
        ) from None
    return fsspec


def _as_utc(value: Any) -> datetime | None:
    """A modification time as fsspec back ends report it: datetime, epoch seconds or ISO 8601 text."""
    if isinstance(value, datetime):
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return datetime.fromtimestamp(value, timezone.utc)
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return _as_utc(datetime.fromisoformat(value.replace("Z", "+00:00")))
    return None


_MODIFIED_FIELDS = ("LastModified", "last_modified", "mtime", "updated", "modified", "created", "mtime_ns")


class FsspecStore:
    """An :class:`ObjectStore` (and :class:`ListableStore`) over any fsspec file system.

    ``FsspecStore("s3://bucket/payloads", name="s3-prod", client_kwargs={...})``
    or ``FsspecStore(fs, "bucket/payloads", name=...)`` with a file system
    already built. Objects live at ``root/key``. A put is one write of the
    whole object: on object stores a single PUT (or a multipart upload that
    becomes visible only when complete), on the local file system a temporary
    name renamed over the key. ``open`` takes the size from ``info()`` and
    reads without read-ahead caching (``cache_type="none"``), so resolving
    fetches exactly the ranges it reads.

    ``url_or_fs``: an fsspec URL, or a file system already built. ``root``: the path objects live under, joined to the
    URL's path (None: the URL's path alone; with a file system, the path itself). ``name``: the store's name, which
    references carry (None: the protocol). ``**options``: passed to fsspec to build the file system from a URL
    (credentials, ``endpoint_url``, ...).
    """

    def __init__(
        self,
        url_or_fs: str | AbstractFileSystem,
        root: str | None = None,
        *,
        name: str | None = None,
        **options: Any,
    ) -> None:
        fsspec = _fsspec()
        if isinstance(url_or_fs, str):
            fs, path = fsspec.core.url_to_fs(url_or_fs, **options)
            if root is not None:
                path = f"{path.rstrip('/')}/{root.strip('/')}" if path.strip("/") else root
        else:
            if not isinstance(url_or_fs, fsspec.AbstractFileSystem):
                raise StoreError(f"{url_or_fs!r} is neither a URL nor an fsspec file system", cause=StoreFault.CONFIG)
            if options:
                raise StoreError(
                    "options go to fsspec only with a URL", cause=StoreFault.CONFIG, options=sorted(options)
                )
            fs = url_or_fs
            path = fs._strip_protocol(root) if root else ""
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        self.fs: AbstractFileSystem = fs
        self.root = path.rstrip("/")
        self.name = name or protocol
        self._local = "file" in ((fs.protocol,) if isinstance(fs.protocol, str) else fs.protocol)
        if self._local:
            if not self.root:
                raise StoreError("a local FsspecStore needs a root directory", cause=StoreFault.CONFIG)
            fs.makedirs(self.root, exist_ok=True)

    def __repr__(self) -> str:
        return f"FsspecStore({type(self.fs).__name__}, {self.root!r}, name={self.name!r})"

    def _path(self, key: str) -> str:
        parts = _confined(key)
        return "/".join((self.root, *parts)) if self.root else "/".join(parts)

    def put(self, key: str, data: Buffer) -> None:
        path = self._path(key)
        payload = bytes(memoryview(data).cast("B"))  # fsspec back ends want bytes
        try:
            if self._local:
                parent, _, leaf = path.rpartition("/")
                self.fs.makedirs(parent, exist_ok=True)
                tmp = f"{parent}/{_temp_name(leaf)}"
                try:
                    with self.fs.open(tmp, "wb") as f:
                        f.write(payload)
                        f.flush()
                        os.fsync(f.fileno())
                    os.chmod(tmp, DEFAULT_FILE_MODE)
                    self.fs.mv(tmp, path)
                except BaseException:
                    with contextlib.suppress(OSError):
                        self.fs.rm_file(tmp)
                    raise
            else:
                self.fs.pipe_file(path, payload)
        except (OSError, ValueError) as exc:
            raise StoreError(f"cannot store {key!r}: {exc}", key=key) from None

    def open(self, key: str) -> StoredObject:
        """The object's size from ``info()``, then a stream; nothing read yet.

        ``key``: the object's key, under ``root``.
        """
        path = self._path(key)
        self.fs.invalidate_cache(path)  # another process may have deleted or replaced it since a listing
        try:
            info = self.fs.info(path)
        except FileNotFoundError:
            self._check_container()
            raise _missing(key) from None
        except (OSError, ValueError) as exc:
            raise StoreError(f"cannot read {key!r}: {exc}", key=key) from None
        if info.get("type") != "file":
            kind = info.get("type")
            raise StoreError(f"cannot read {key!r}: a {kind}, not an object", key=key, cause=StoreFault.NOT_AN_OBJECT)
        size = info.get("size")
        if not isinstance(size, int) or size < 0:
            raise StoreError(f"cannot read {key!r}: the store reports no size ({size!r})", key=key)
        try:
            kwargs: dict[str, Any] = {} if self._local or self.fs.protocol == "memory" else {"cache_type": "none"}
            stream = self.fs.open(path, "rb", **kwargs)
        except FileNotFoundError:
            raise _missing(key, "deleted while opened") from None
        except (OSError, ValueError) as exc:
            raise StoreError(f"cannot read {key!r}: {exc}", key=key) from None
        return StoredObject(size, cast(BinaryIO, stream))

    def _check_container(self) -> None:
        """A missing bucket is a configuration error, not a missing object (``missing="skip"`` must not hide it)."""
        if self._local or self.fs.protocol == "memory" or not self.root:
            return
        bucket = self.root.lstrip("/").split("/", 1)[0]
        try:
            exists = self.fs.exists(bucket)
        except (OSError, ValueError) as exc:
            raise StoreError(f"cannot check bucket {bucket!r}: {exc}", cause=StoreFault.CONFIG) from None
        if not exists:
            raise StoreError(f"bucket {bucket!r} does not exist", cause=StoreFault.CONFIG, bucket=bucket)

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            self.fs.rm_file(path)
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as exc:
            raise StoreError(f"cannot delete {key!r}: {exc}", key=key) from None
        self.fs.invalidate_cache(path)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object under the root whose key starts with ``prefix``, in key order, with its LastModified/mtime."""
        _check_prefix(prefix)
        directory = prefix.rpartition("/")[0]
        top = "/".join(p for p in (self.root, directory) if p)
        self.fs.invalidate_cache(top)
        try:
            found: Mapping[str, Mapping[str, Any]] = self.fs.find(top, detail=True)
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            raise StoreError(f"cannot list {top!r}: {exc}", prefix=prefix) from None
        base = self.fs._strip_protocol(self.root).rstrip("/") if self.root else ""
        rows = []
        for path, info in found.items():
            path = self.fs._strip_protocol(path)
            if base:
                if not path.startswith(base + "/"):
                    continue
                key = path[len(base) + 1 :]
            else:
                key = path.lstrip("/")
            if info.get("type", "file") != "file" or not key.startswith(prefix):
                continue
            if _TEMP.match(key.rpartition("/")[2]):
                continue
            try:
                split_name(key)
            except PathError:
                continue  # not a key this store could have written
            rows.append((key, info))
        for key, info in sorted(rows, key=lambda row: row[0]):
            yield ObjectInfo(key, int(info.get("size") or 0), self._modified(key, info))

    def _modified(self, key: str, info: Mapping[str, Any]) -> datetime:
        for field in _MODIFIED_FIELDS:
            if field in info and (when := _as_utc(info[field] / 1e9 if field == "mtime_ns" else info[field])):
                return when
        try:
            when = _as_utc(self.fs.modified(self._path(key)))
        except (NotImplementedError, OSError, ValueError):
            when = None
        if when is None:
            raise StoreError(f"the store reports no modification time for {key!r}", key=key)
        return when


def open_store(url: str | os.PathLike[str], *, name: str | None = None, **options: Any) -> ListableStore:
    """The store a URL names: a plain path or ``file://`` is a :class:`DirectoryStore`, any other
    fsspec URL (``s3://bucket/prefix``, ``gs://``, ``abfs://``, ``memory://``) an :class:`FsspecStore`.

    ``options`` go to fsspec (for s3fs e.g. ``endpoint_url=...``, ``key=...``,
    ``client_kwargs={"region_name": ...}``) or, for a directory, to
    :class:`DirectoryStore` (``fsync``, ``file_mode``). ``name`` is the name
    recorded in references (default: ``"dir"`` for a directory, the protocol
    otherwise: set it explicitly when several stores share a protocol).

    ``url``: a directory path, a ``file://`` URL or any fsspec URL.
    """
    text = os.fspath(url)
    scheme, sep, rest = text.partition("://")
    if not sep or scheme in ("file", "local"):
        path = rest if sep else text
        if not path:
            raise StoreError(f"store URL {text!r} names no directory", cause=StoreFault.CONFIG)
        try:
            return DirectoryStore(path, name=name or "dir", **options)
        except TypeError as exc:
            raise StoreError(f"store URL {text!r}: {exc}", cause=StoreFault.CONFIG) from None
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.\-]*(::[A-Za-z][A-Za-z0-9+.\-]*)*", scheme):
        raise StoreError(f"store URL {text!r} has no valid scheme", cause=StoreFault.CONFIG)
    try:
        return FsspecStore(text, name=name, **options)
    except (ValueError, TypeError) as exc:  # fsspec: unknown protocol; an option the file system does not take
        raise StoreError(f"store URL {text!r}: {exc}", cause=StoreFault.CONFIG) from None
    except ImportError as exc:  # fsspec knows the protocol, its package (s3fs, gcsfs, adlfs) is absent
        raise StoreError(f"store URL {text!r}: {exc}", cause=StoreFault.NOT_INSTALLED) from None
