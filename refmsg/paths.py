"""Destination names that can never escape the receiver's root.

A name is a relative, ``/``-separated path. Refused with
:class:`~refmsg.errors.PathError` (reason PATH_ERROR): empty names, NUL
bytes, absolute paths (``/x``, ``\\x``, ``C:x``), backslashes, empty, ``.``
and ``..`` components, components over 255 bytes, and the receiver's own
``.refmsg`` directory, and names over 4096 bytes. Directories are then opened one component at a time
relative to the root's file descriptor with ``O_NOFOLLOW``, so a symlink
anywhere on the way (planted before or during the transfer) is refused rather
than followed; a symlink or directory at the final name is refused too.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

from .errors import PathError

RESERVED = ".refmsg"
NAME_MAX = 255
PATH_MAX = 4096  # a whole name, as Linux bounds a path (the journal records names too)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def split_name(name: str) -> tuple[str, ...]:
    """The components of a safe relative name; raise :class:`PathError` otherwise."""
    if not isinstance(name, str) or not name:
        raise PathError("destination name is empty", name=name)
    if "\0" in name:
        raise PathError(f"destination name {name!r} contains a NUL byte", name=name)
    if name.startswith(("/", "\\")) or (len(name) >= 2 and name[1] == ":" and name[0].isalpha()):
        raise PathError(f"destination name {name!r} is absolute", name=name)
    if "\\" in name:
        raise PathError(f"destination name {name!r} contains a backslash", name=name)
    if len(name.encode("utf-8", "surrogatepass")) > PATH_MAX:
        raise PathError(f"destination name {name[:40]!r}... is over {PATH_MAX} bytes", name=name[:200])
    parts = tuple(name.split("/"))
    for part in parts:
        if part in ("", ".", ".."):
            raise PathError(f"destination name {name!r} has a {part or 'empty'!r} component", name=name)
        if len(part.encode("utf-8", "surrogatepass")) > NAME_MAX:
            raise PathError(f"destination name {name!r} has a component over {NAME_MAX} bytes", name=name)
    if parts[0] == RESERVED:
        raise PathError(f"destination name {name!r} is inside the receiver's {RESERVED} directory", name=name)
    return parts


def open_parent(root_fd: int, parts: tuple[str, ...], *, create: bool) -> int:
    """A descriptor for the directory holding ``parts[-1]``, never leaving the root."""
    fd = os.dup(root_fd)
    try:
        for part in parts[:-1]:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise PathError(
                        f"{'/'.join(parts)!r}: component {part!r} is a symlink or not a directory",
                        name="/".join(parts),
                    ) from None
                if exc.errno == errno.ENOENT:
                    raise PathError(
                        f"{'/'.join(parts)!r}: directory {part!r} does not exist", name="/".join(parts), missing=True
                    ) from None
                raise
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def check_final(dir_fd: int, leaf: str, name: str) -> bool:
    """True when ``leaf`` exists as a regular file; raise when it is anything else."""
    try:
        st = os.stat(leaf, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(st.st_mode):
        raise PathError(f"destination {name!r} is a symlink", name=name)
    if not stat.S_ISREG(st.st_mode):
        raise PathError(f"destination {name!r} exists and is not a regular file", name=name)
    return True


def open_regular(dir_fd: int, leaf: str, name: str) -> tuple[int, os.stat_result]:
    """A read descriptor for ``leaf`` and its status, refusing anything but a regular file.

    ``O_NOFOLLOW`` refuses a symlink at the name; ``O_NONBLOCK`` keeps a FIFO
    planted there from blocking the open; a directory, FIFO, socket or device
    is refused after ``fstat`` on the descriptor itself (no race with the name).
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(leaf, flags, dir_fd=dir_fd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise PathError(f"{name!r} is not a regular file", name=name, mode=stat.filemode(st.st_mode))
    os.set_blocking(fd, True)
    return fd, st


def open_root(root: str | os.PathLike[str], *, create: bool = True) -> int:
    """A descriptor for the root directory (created if asked)."""
    if create:
        os.makedirs(root, exist_ok=True)
    try:
        return os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise PathError(f"cannot open root {os.fspath(root)!r}: {exc.strerror}", root=os.fspath(root)) from None
