"""Writing by rename never replaces anything but a regular file, gives the new file the mode open() would, and on a
full disk leaves nothing half-written: one NoSpaceError naming the path, the temporary file removed."""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from file_kinds import NON_FILES, snapshot
from full_disk import fill, full_folder_fixture, leftovers  # noqa: F401 (the fixture full_folder)
from pipeplan.core.errors import NoSpaceError, OutputError
from pipeplan.io.atomic import atomic_output, non_regular_kind, write_failure, write_text_atomic


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


def _writers() -> dict[str, Callable[[Path], None]]:
    """Every kind of file pipeplan writes, each by its own writer: name -> write(path)."""
    from pipeplan.core.plan import Plan, Stage
    from pipeplan.io.cluster_json import cluster_to_json
    from pipeplan.io.plan_json import write_plan
    from pipeplan.io.profile_json import write_profile_json
    from pipeplan.io.schedule_io import write_schedule_csv, write_schedule_json
    from pipeplan.presets.resolve import load_cluster, load_profile
    from pipeplan.schedules import make_schedule
    from pipeplan.sim import simulate
    from pipeplan.sim.cost.synthetic import rank_costs
    from pipeplan.viz.gantt import render_gantt
    from pipeplan.viz.heatmap import draw_bandwidth_heatmap
    from pipeplan.viz.perfetto import write_timeline

    schedule = make_schedule("1f1b", 2, 4)
    result = simulate(schedule, rank_costs(schedule, 1.0, 2.0, 0.5, 0.0), record=True)
    plan = Plan((Stage(0, 12, (0,)), Stage(13, 25, (1,))), 1, 4, 2, "1f1b")
    cluster_text = json.dumps(cluster_to_json(load_cluster("v100-8x1")), indent=2, sort_keys=True) + "\n"
    return {
        "plan JSON": lambda p: write_plan(plan, p, "dapple/vgg-19", "v100-8x1"),
        "profile JSON": lambda p: write_profile_json(load_profile("dapple/vgg-19"), p),
        "cluster JSON": lambda p: write_text_atomic(p, cluster_text),
        "Perfetto timeline": lambda p: write_timeline(result, str(p)),
        "timeline PNG": lambda p: render_gantt(result, str(p)),
        "heat map PNG": lambda p: draw_bandwidth_heatmap(load_cluster("v100-8x1"), p),
        "schedule CSV": lambda p: write_schedule_csv(schedule, p),
        "schedule JSON": lambda p: write_schedule_json(schedule, p),
    }


WRITERS = list(_writers())


@pytest.mark.parametrize("writer", WRITERS)
def test_a_full_disk_leaves_no_file_and_no_temporary(writer: str, full_folder: Path) -> None:
    """Every writer on a full disk: NoSpaceError naming the path and "no space left on device"; nothing left there."""
    target = full_folder / ("out.png" if "PNG" in writer else "out.csv" if "CSV" in writer else "out.json")
    fill(full_folder)
    with pytest.raises(NoSpaceError, match=rf"^{re.escape(repr(str(target)))} not written: no space left on device \(ENOSPC\)"):
        _writers()[writer](target)
    assert leftovers(full_folder) == []


@pytest.mark.parametrize("writer", ["plan JSON", "timeline PNG"])
def test_a_full_disk_leaves_the_old_file_as_it_was(writer: str, full_folder: Path) -> None:
    """A file of the kind written before the disk filled keeps its bytes when rewriting it fails for space."""
    name = "out.png" if "PNG" in writer else "out.json"
    _writers()[writer](full_folder.parent / name)  # a file of the kind, written where the disk has room
    old = (full_folder.parent / name).read_bytes()
    target = full_folder / name
    target.write_bytes(old)
    fill(full_folder)
    with pytest.raises(NoSpaceError, match="no space left on device"):
        _writers()[writer](target)
    assert target.read_bytes() == old
    assert leftovers(full_folder, kept=("out.png", "out.json")) == []


@pytest.mark.parametrize(("code", "name"), [(errno.ENOSPC, "ENOSPC"), (errno.EDQUOT, "EDQUOT"), (errno.EFBIG, "EFBIG")])
def test_each_full_disk_error_is_named_and_the_temporary_removed(code: int, name: str, tmp_path: Path) -> None:
    """ENOSPC, EDQUOT and EFBIG raised while writing: NoSpaceError naming it, no temporary file, the target untouched."""
    target = tmp_path / "plan.json"
    target.write_text("old\n")
    with pytest.raises(NoSpaceError, match=rf"no space left on device \({name}"), atomic_output(target) as out:
        out.write("half")
        raise OSError(code, os.strerror(code))
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


def test_write_failure_says_no_space_for_a_full_disk(tmp_path: Path) -> None:
    """train's end-of-run line for a file not written says "no space left on device", once, not the path twice."""
    error = NoSpaceError(str(tmp_path / "t.json"), "no space left on device (ENOSPC)")
    assert write_failure(error) == "no space left on device (ENOSPC)"
    assert write_failure(OSError(errno.ENOSPC, "No space left on device")) == "no space left on device (ENOSPC)"


def test_a_writer_s_own_error_over_a_full_disk_is_a_full_disk(tmp_path: Path) -> None:
    """A writer that wraps the OSError its write raised (as torch.save may) still gives NoSpaceError, no temporary."""
    target = tmp_path / "g.pt"
    with pytest.raises(NoSpaceError, match="no space left on device"), atomic_output(target, binary=True):
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as exc:
            raise RuntimeError("enforce fail at inline_container.cc: unexpected pos") from exc
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("writer", ["plan JSON", "profile JSON", "Perfetto timeline", "timeline PNG", "heat map PNG"])
def test_a_writer_replaces_only_a_file_of_its_kind(writer: str, tmp_path: Path) -> None:
    """Each kind's writer, called from Python (as api.save_plan calls write_plan), refuses to replace a file that is
    not of its kind, untouched, and replaces one it wrote (or an empty one)."""
    target = tmp_path / ("out.png" if "PNG" in writer else "out.json")
    target.write_bytes(b"my notes\n")
    with pytest.raises(OutputError, match=r"exists and is not a .* pipeplan wrote .*: remove it first, or give another path"):
        _writers()[writer](target)
    assert target.read_bytes() == b"my notes\n"
    target.write_bytes(b"")
    _writers()[writer](target)
    first = target.read_bytes()
    _writers()[writer](target)
    assert target.read_bytes() == first and first
