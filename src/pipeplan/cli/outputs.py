"""Checks of output paths before any work: an unwritable --out is an error at once, not after minutes of planning."""

from __future__ import annotations

import os

from pipeplan.core.errors import OutputError

IMAGE_SUFFIXES = (".png",)


def check_writable(flag: str, path: str | None, suffixes: tuple[str, ...] = ()) -> None:
    """Raise OutputError naming `flag` and `path` when the file cannot be written (or has the wrong suffix).

    The folder must exist and be writable, the path must not be a folder, and
    when `suffixes` are given the name must end with one of them.
    """
    if path is None:
        return
    if suffixes and not path.lower().endswith(suffixes):
        raise OutputError(f"{flag} {path!r} must end with {' or '.join(suffixes)}")
    if os.path.isdir(path):
        raise OutputError(f"{flag} {path!r} is a folder, not a file")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise OutputError(f"{flag} {path!r}: folder {folder!r} does not exist")
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise OutputError(f"{flag} {path!r} cannot be written (no permission)")
