"""Input files: one check of what stands at a path, one bounded read that never blocks.

Every reader of a user's file (JSON of every format, graph.txt, schedule CSV,
bandwidth traces, checkpoint indexes) comes through `read_input_text`, so a
directory, a FIFO, a device, a symlink loop or an unreadable file is reported
as what it is, a FIFO never blocks (it is refused before it is opened, and
opened without blocking should it appear in between), and no file larger
than core.limits.FILE_BYTES is read. With `links=False` (checkpoint files, which
pipeplan writes as plain files and reads back) a symbolic link is refused too,
so a link to /dev/zero or out of the folder is never followed.
"""

from __future__ import annotations

import errno
import os
import stat

from pipeplan.core.errors import PipeplanError
from pipeplan.core.limits import FILE_BYTES, Limit

_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)
_REASONS = {
    errno.ENOENT: "does not exist",
    errno.ENOTDIR: "does not exist (a folder on its path is a file)",
    errno.ELOOP: "symlink loop",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.ENAMETOOLONG: "name too long",
}


def kind_of(mode: int) -> str | None:
    """What a stat mode describes when it is not a regular file ("a directory", "a FIFO", ...); None for a file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a directory"
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def os_reason(exc: OSError, path: str) -> str:
    """Why an OSError on path happened, in a few words ("does not exist", "symlink loop", "permission denied")."""
    reason = _REASONS.get(exc.errno or 0, exc.strerror or str(exc))
    if exc.errno == errno.ENOENT and os.path.islink(path):
        reason = f"does not exist (a broken symlink to {os.readlink(path)!r})"
    return reason


def something_at(path: str) -> bool:
    """Whether path names something a reader should look at: an entry stands there (even a broken symlink), or it
    cannot be looked up for another reason than absence (a loop, no permission), which the reader then reports."""
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except (OSError, ValueError):
        return True
    return True


def check_regular(path: str, what: str, error: type[PipeplanError], links: bool = True) -> os.stat_result:
    """The stat of path when it is a readable regular file, else error `{path}: cannot read {what}: {reason}`.

    The reasons: does not exist, is a directory, is not a regular file (a FIFO / a character device / ...),
    symlink loop, permission denied; with `links` False, also "is a symbolic link" (the link is not followed).
    """
    try:
        info = os.stat(path) if links else os.lstat(path)
    except OSError as exc:
        raise error(f"{path}: cannot read {what}: {os_reason(exc, path)}") from None
    except ValueError:  # an embedded NUL byte
        raise error(f"{path!r}: cannot read {what}: not a valid path") from None
    if stat.S_ISLNK(info.st_mode):
        raise error(f"{path}: cannot read {what}: is a symbolic link (to {os.readlink(path)!r}), not a file pipeplan wrote")
    kind = kind_of(info.st_mode)
    if kind == "a directory":
        raise error(f"{path}: cannot read {what}: is a directory")
    if kind is not None:
        raise error(f"{path}: cannot read {what}: is not a regular file ({kind})")
    return info


def read_input_bytes(
    path: str | os.PathLike[str], what: str, error: type[PipeplanError], limit: Limit = FILE_BYTES, links: bool = True
) -> bytes:
    """The bytes of a regular file of at most `limit` bytes, else error naming the path and what stands there; with
    `links` False a symbolic link at path is refused, not followed.

    Raises:
        error: `{path}: cannot read {what}: {reason}`, the reason as check_regular gives it, or "too large: N bytes,
            the limit is M bytes, because ...".
    """
    source = os.fspath(path)
    info = check_regular(source, what, error, links)
    _check_size(source, what, error, info.st_size, limit)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    if not links:
        flags |= getattr(os, "O_NOFOLLOW", 0)  # a link put there after the check is not followed either (ELOOP)
    try:
        # O_NONBLOCK: should a FIFO replace the file after the check, opening it does not wait for a writer.
        fd = os.open(source, flags)
    except OSError as exc:
        raise error(f"{source}: cannot read {what}: {os_reason(exc, source)}") from None
    try:
        kind = kind_of(os.fstat(fd).st_mode)
        if kind is not None:
            raise error(f"{source}: cannot read {what}: is not a regular file ({kind})")
        chunks = []
        total = 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            total += len(chunk)
            _check_size(source, what, error, total, limit)  # a file that grows while it is read
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise error(f"{source}: cannot read {what}: {os_reason(exc, source)}") from None
    finally:
        os.close(fd)


def read_input_text(
    path: str | os.PathLike[str], what: str, error: type[PipeplanError], limit: Limit = FILE_BYTES, links: bool = True
) -> str:
    """The UTF-8 text of a regular file (read_input_bytes); bytes that are not UTF-8 are an error naming the byte."""
    source = os.fspath(path)
    data = read_input_bytes(source, what, error, limit, links)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{source}: cannot read {what}: not a UTF-8 text file ({exc.reason} at byte {exc.start})") from None


def _check_size(source: str, what: str, error: type[PipeplanError], size: int, limit: Limit) -> None:
    """Refuse a file above the limit, naming it."""
    if not limit.allows(size):
        raise error(f"{source}: cannot read {what}: {limit.message('file', size)}")
