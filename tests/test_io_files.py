"""io.files, the one bounded reader: with links=False a symbolic link is refused by name, never followed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeplan.core.errors import ProfileError
from pipeplan.core.limits import Limit
from pipeplan.io.files import read_input_bytes, read_input_text


def test_a_link_is_followed_by_default_and_refused_without_links(tmp_path: Path) -> None:
    """The same link reads its target by default; with links=False it is refused naming the link and its target, and
    a link to /dev/zero is never opened."""
    (tmp_path / "target").write_text("data")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    (tmp_path / "zero").symlink_to("/dev/zero")
    assert read_input_text(tmp_path / "link", "profile", ProfileError) == "data"
    with pytest.raises(ProfileError, match=r"link: cannot read profile: is a symbolic link \(to '.*target'\)"):
        read_input_bytes(tmp_path / "link", "profile", ProfileError, links=False)
    with pytest.raises(ProfileError, match=r"zero: cannot read profile: is a symbolic link \(to '/dev/zero'\)"):
        read_input_text(tmp_path / "zero", "profile", ProfileError, links=False)


def test_a_fifo_and_a_size_over_the_limit_are_refused_without_links_too(tmp_path: Path) -> None:
    """links=False keeps the other refusals: a FIFO is not opened; a file over the given limit is not read."""
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(ProfileError, match=r"is not a regular file \(a FIFO\)"):
        read_input_bytes(tmp_path / "fifo", "profile", ProfileError, links=False)
    (tmp_path / "big").write_bytes(b"x" * 11)
    with pytest.raises(ProfileError, match=r"file too large: 11 bytes, the limit is 10 bytes, because recorded"):
        read_input_bytes(tmp_path / "big", "profile", ProfileError, Limit(10, "bytes", "recorded"), links=False)
    assert read_input_bytes(tmp_path / "big", "profile", ProfileError, Limit(11, "bytes", "recorded"), links=False) == b"x" * 11
