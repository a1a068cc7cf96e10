"""Files written whole or not at all: a temporary file beside the target, then one rename, never over a non-file.

Note:
    A rename replaces whatever stands at the target: a named pipe, a device
    node (as root, `/dev/full` would become a regular file), a symbolic link
    (the link would be lost and its target left stale). So the target is
    checked before the temporary file is made and again just before the
    rename, and only an absent path or a regular file is ever replaced. The
    new file gets the mode a plain `open()` would give it (0666 less the
    umask), or the mode of the file it replaces, not mkstemp's 0600.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from typing import IO

from pipeplan.core.errors import OutputError

KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)
"""What may stand at a path instead of a regular file, as a message names it."""


def non_regular_kind(path: str | os.PathLike[str]) -> str | None:
    """What stands at `path` when it is neither absent nor a regular file ('a named pipe (FIFO)', 'a symbolic link
    (to 'x')', ...), else None. The last component is not followed: a link is reported as a link."""
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISREG(mode):
        return None
    for test, name in KINDS:
        if test(mode):
            if name == "a symbolic link":
                with contextlib.suppress(OSError):
                    name += f" (to {os.readlink(path)!r})"
            return name
    return "not a regular file"


def refuse_non_regular(path: str | os.PathLike[str], what: str = "") -> None:
    """Raise OutputError when something other than a regular file stands at `path` (`what`: the flag, for the message)."""
    kind = non_regular_kind(path)
    if kind is not None:
        name = f"{what} {os.fspath(path)!r}" if what else repr(os.fspath(path))
        raise OutputError(f"{name} is {kind}, not a regular file; pipeplan writes only regular files: give another path")


def current_umask() -> int:
    """This process's umask (read from /proc where it can be, so the mask is never changed, even for an instant)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def new_file_mode(path: str | os.PathLike[str]) -> int:
    """The permission bits a written file gets: those of the regular file it replaces, else 0666 less the umask."""
    with contextlib.suppress(OSError):
        info = os.lstat(path)
        if stat.S_ISREG(info.st_mode):
            return stat.S_IMODE(info.st_mode)
    return 0o666 & ~current_umask()


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str], binary: bool = False) -> Iterator[IO]:  # type: ignore[type-arg]
    """Yield a handle on a temporary file beside `path`; when the block ends without an error, rename it to `path`.

    An interruption (an error, a signal) leaves either the old file or the new
    one, never a half-written file, and no temporary file behind.

    Raises:
        OutputError: something other than a regular file stands at `path` (before the write or at its end).
        OSError: the folder cannot be written, or the disk is full.
    """
    target = os.fspath(path)
    refuse_non_regular(target)
    mode = new_file_mode(target)
    folder = os.path.dirname(os.path.abspath(target))
    handle, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=".tmp", dir=folder)
    try:
        os.fchmod(handle, mode)
        if binary:
            with os.fdopen(handle, "wb") as out:
                yield out
        else:
            with os.fdopen(handle, "w", encoding="utf-8", newline="\n") as out:
                yield out
        refuse_non_regular(target)  # again: something may have been put there while the file was written
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` to `path` whole or not at all (see atomic_output).

    Raises:
        OutputError: `path` is not a regular file (a FIFO, a device, a link, a folder).
        OSError: the folder cannot be written.
    """
    with atomic_output(path) as out:
        out.write(text)


def write_failure(exc: BaseException) -> str:
    """Why a file was not written, in a few words: the OS's reason and the path it names, or the OutputError's line."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror} ({exc.filename})" if exc.filename else exc.strerror
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
