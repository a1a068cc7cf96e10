"""Files written whole or not at all: a temporary file beside the target, then one rename, never over a non-file.

A full disk (ENOSPC, EDQUOT, EFBIG) while the temporary file is made, written,
closed or renamed raises NoSpaceError naming the target path and "no space
left on device"; the temporary file is removed first, so nothing
half-written is ever left, and the target keeps its old bytes.

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
import errno
import os
import stat
import tempfile
from collections.abc import Iterator
from typing import IO

from pipeplan.core.errors import NoSpaceError, OutputError
from pipeplan.io.file_kinds import FileKind

DISK_FULL = {errno.ENOSPC: "ENOSPC", errno.EDQUOT: "EDQUOT: disk quota exceeded", errno.EFBIG: "EFBIG: file too large"}
"""The errors that mean the output does not fit where it is written."""

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


def no_space(exc: BaseException, path: str) -> NoSpaceError | None:
    """The NoSpaceError `exc` means for output `path` when it is, or was raised while handling, a full disk's OSError
    (a writer such as torch.save may wrap the OSError its file's write raised), else None."""
    seen: BaseException | None = exc
    for _ in range(8):  # a short chain: the writer's own error over the OSError
        if seen is None:
            break
        if isinstance(seen, OSError) and seen.errno in DISK_FULL:
            return NoSpaceError(path, f"no space left on device ({DISK_FULL[seen.errno]})")
        seen = seen.__cause__ or seen.__context__
    return None


def _open_temporary(handle: int, binary: bool) -> IO:  # type: ignore[type-arg]
    """A file object on the temporary file's descriptor (one place, so a test can put a full disk behind it)."""
    if binary:
        return os.fdopen(handle, "wb")
    return os.fdopen(handle, "w", encoding="utf-8", newline="\n")


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str], binary: bool = False, kind: FileKind | None = None) -> Iterator[IO]:  # type: ignore[type-arg]
    """Yield a handle on a temporary file beside `path`; when the block ends without an error, rename it to `path`.

    With `kind`, a file already at `path` is replaced only when it is empty or of that kind (io.file_kinds: a file
    pipeplan wrote), so a writer called from Python (api.save_plan) keeps the rule the CLI's guard applies.

    An interruption (an error, a signal, a full disk) leaves either the old
    file or the new one, never a half-written file, and no temporary file behind.

    Raises:
        OutputError: something other than a regular file stands at `path` (before the write or at its end), or a
            file not of `kind`.
        NoSpaceError: the disk is full (the temporary file removed, `path` untouched).
        OSError: the folder cannot be written.
    """
    target = os.fspath(path)
    refuse_non_regular(target)
    if kind is not None:
        kind.check_replaceable(target)
    mode = new_file_mode(target)
    folder = os.path.dirname(os.path.abspath(target))
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise (no_space(exc, target) or exc) from None
    try:
        os.fchmod(handle, mode)
        with _open_temporary(handle, binary) as out:
            yield out
        refuse_non_regular(target)  # again: something may have been put there while the file was written
        os.replace(temporary, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        full = no_space(exc, target)
        if full is not None:
            raise full from None
        raise


def write_text_atomic(path: str | os.PathLike[str], text: str, kind: FileKind | None = None) -> None:
    """Write `text` to `path` whole or not at all (see atomic_output).

    Raises:
        OutputError: `path` is not a regular file (a FIFO, a device, a link, a folder), or not of `kind`.
        NoSpaceError: the disk is full (nothing written).
        OSError: the folder cannot be written.
    """
    with atomic_output(path, kind=kind) as out:
        out.write(text)


def write_failure(exc: BaseException) -> str:
    """Why a file was not written, in a few words: the OS's reason and the path it names, or the OutputError's line."""
    if isinstance(exc, NoSpaceError):
        return exc.reason
    if isinstance(exc, OSError) and exc.errno in DISK_FULL:
        return f"no space left on device ({DISK_FULL[exc.errno]})"
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror} ({exc.filename})" if exc.filename else exc.strerror
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
