"""Writing by rename never replaces anything but a regular file, and gives the new file the mode open() would."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

from file_kinds import NON_FILES, snapshot
from pipeplan.core.errors import OutputError
from pipeplan.io.atomic import atomic_output, non_regular_kind, write_text_atomic


@pytest.mark.parametrize("kind", list(NON_FILES))
def test_a_non_regular_file_is_never_replaced(kind: str, tmp_path: Path) -> None:
    """A FIFO, a link, a folder, a socket or a device node at the target: OutputError naming it, nothing changed."""
    make, name = NON_FILES[kind]
    target = tmp_path / "out.json"
    make(target)
    before = snapshot(tmp_path)
    assert (non_regular_kind(target) or "").startswith(name)
    with pytest.raises(OutputError, match=rf"^{re.escape(repr(str(target)))} is {re.escape(name)}"):
        write_text_atomic(target, "{}\n")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("kind", ["fifo", "symlink", "folder"])
def test_what_appears_at_the_target_while_writing_is_not_replaced(kind: str, tmp_path: Path) -> None:
    """The check is made again just before the rename: a FIFO put there meanwhile survives, no temporary file stays."""
    make, _ = NON_FILES[kind]
    target = tmp_path / "out.json"
    with pytest.raises(OutputError, match="not a regular file"), atomic_output(target) as out:
        out.write("{}\n")
        make(target)
    assert non_regular_kind(target) is not None
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_a_new_file_gets_the_mode_open_would_give_it(umask: int, tmp_path: Path) -> None:
    """0666 less the umask, as open() gives, not mkstemp's 0600; the umask is left as it was."""
    old = os.umask(umask)
    try:
        write_text_atomic(tmp_path / "new.json", "{}\n")
        with open(tmp_path / "plain.json", "w") as plain:
            plain.write("{}\n")
        assert os.umask(umask) == umask
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new.json").stat().st_mode) == 0o666 & ~umask
    assert stat.S_IMODE((tmp_path / "new.json").stat().st_mode) == stat.S_IMODE((tmp_path / "plain.json").stat().st_mode)


def test_a_replaced_file_keeps_its_mode(tmp_path: Path) -> None:
    """Rewriting an existing file keeps its permission bits (here 0640) and replaces its bytes."""
    target = tmp_path / "plan.json"
    target.write_text("old\n")
    target.chmod(0o640)
    write_text_atomic(target, "new\n")
    assert target.read_text() == "new\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640


def test_an_error_while_writing_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    """An exception inside the block: the old bytes stay, and the temporary file is removed."""
    target = tmp_path / "plan.json"
    target.write_text("old\n")
    with pytest.raises(RuntimeError, match="interrupted"), atomic_output(target) as out:
        out.write("half")
        raise RuntimeError("interrupted")
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]
