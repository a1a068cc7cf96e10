"""Shared by the output tests: make what may stand at a path instead of a regular file, and snapshot a folder."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Callable
from pathlib import Path

import pytest


def make_fifo(path: Path) -> None:
    """A named pipe: writing it by open() would block, renaming over it would destroy it."""
    os.mkfifo(path)


def make_link(path: Path) -> None:
    """A symbolic link to a regular file beside it."""
    target = path.parent / f"{path.name}.real"
    target.write_text("the link's target\n")
    path.symlink_to(target)


def make_dangling_link(path: Path) -> None:
    """A symbolic link to nothing."""
    path.symlink_to(path.parent / f"{path.name}.nowhere")


def make_folder(path: Path) -> None:
    """A folder holding one file."""
    path.mkdir()
    (path / "inside.txt").write_text("kept\n")


def make_socket(path: Path) -> None:
    """A bound Unix socket's node."""
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(path))
    finally:
        server.close()


def make_char_device(path: Path) -> None:
    """A /dev/null-like node (major 1, minor 3) in the test's own folder, where this user may make one."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("this user may not create device nodes")


def make_regular(path: Path) -> None:
    """A regular file (what a folder output must not be)."""
    path.write_text("a file\n")


NON_FILES: dict[str, tuple[Callable[[Path], None], str]] = {
    "fifo": (make_fifo, "a named pipe (FIFO)"),
    "symlink": (make_link, "a symbolic link (to "),
    "dangling symlink": (make_dangling_link, "a symbolic link (to "),
    "folder": (make_folder, "a folder"),
    "socket": (make_socket, "a socket"),
    "character device": (make_char_device, "a character device"),
}
"""What may stand at a file output's path, and how a message names it."""

NON_FOLDERS: dict[str, tuple[Callable[[Path], None], str]] = {
    "regular file": (make_regular, "a file"),
    "fifo": (make_fifo, "a named pipe (FIFO)"),
    "socket": (make_socket, "a socket"),
    "character device": (make_char_device, "a character device"),
    "symlink": (make_link, "a symbolic link (to "),
    "dangling symlink": (make_dangling_link, "a symbolic link (to "),
}
"""What may stand at a folder output's path instead of a folder (a link to a folder is followed: that is a folder)."""


def snapshot(folder: Path) -> dict[str, tuple[int, int, bytes | str | None]]:
    """Every entry under `folder`: its mode, its mtime and its bytes (regular files) or target (links)."""
    found = {}
    for path in sorted(folder.rglob("*")):
        info = path.lstat()
        content: bytes | str | None = None
        if stat.S_ISREG(info.st_mode):
            content = path.read_bytes()
        elif stat.S_ISLNK(info.st_mode):
            content = os.readlink(path)
        found[str(path.relative_to(folder))] = (info.st_mode, info.st_mtime_ns, content)
    return found
