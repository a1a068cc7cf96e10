"""Shared by the disk-full tests: a folder on a full disk, a real one where this user may mount, else /dev/full.

`full_folder` is a pytest fixture with two kinds: "tmpfs" mounts a 64 KiB tmpfs and fills it (root, and mount
permitted: skipped otherwise), "dev-full" puts /dev/full behind every temporary file the atomic writer opens in the
folder, so each write fails with the kernel's own ENOSPC. Either way a file written there fails as on a full disk.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

PAD = "pad"
"""The file that fills the tmpfs (the only file a test may find there afterwards)."""
KINDS = ("tmpfs", "dev-full")


def _mount_tmpfs(folder: Path) -> bool:
    """Mount a 64 KiB tmpfs on `folder`; False where this user may not."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)], capture_output=True, check=False)
    return done.returncode == 0


def _fill(folder: Path) -> None:
    """Write PAD (unbuffered, a page and then a byte at a time) until the file system says it is full."""
    pad = os.open(folder / PAD, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for size in (4096, 1):
            try:
                while True:
                    os.write(pad, b"\0" * size)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(pad)


def _behind_dev_full(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """Every temporary file the atomic writer opens in `folder` writes to /dev/full (ENOSPC from the kernel)."""
    from pipeplan.io import atomic

    plain = atomic._open_temporary

    def opened(handle: int, binary: bool) -> IO:  # type: ignore[type-arg]
        if os.path.dirname(os.readlink(f"/proc/self/fd/{handle}")) == str(folder.resolve()):
            full = os.open("/dev/full", os.O_WRONLY)
            os.dup2(full, handle)
            os.close(full)
        return plain(handle, binary)

    monkeypatch.setattr(atomic, "_open_temporary", opened)


@pytest.fixture(params=KINDS, name="full_folder")
def full_folder_fixture(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder in which no file can be written: its disk is full."""
    folder = tmp_path / "full"
    folder.mkdir()
    if request.param == "dev-full":
        _behind_dev_full(monkeypatch, folder)
        yield folder
        return
    if not _mount_tmpfs(folder):
        pytest.skip("mounting a tmpfs is not permitted here (the dev-full case still runs)")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(folder: Path) -> None:
    """Make `folder` full now (a tmpfs is filled; /dev/full is full already): files put there before stay."""
    if os.path.ismount(folder):
        _fill(folder)


def leftovers(folder: Path, kept: tuple[str, ...] = ()) -> list[str]:
    """What is in `folder` besides PAD and `kept`: a half-written file or a temporary one would be listed."""
    return sorted(p.name for p in folder.iterdir() if p.name not in (PAD, *kept))
