"""Files written whole or not at all: a temporary file beside the target, then one rename."""

from __future__ import annotations

import contextlib
import os
import tempfile


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder and an atomic rename.

    An interruption (an error, a signal) leaves either the old file or the new
    one, never a half-written file, and no temporary file behind.

    Raises:
        OSError: the folder cannot be written.
    """
    target = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(target))
    handle, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="\n") as out:
            out.write(text)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
