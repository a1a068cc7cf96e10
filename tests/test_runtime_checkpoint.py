"""Checkpoints are data: a rank's tensors load with weights_only, its metadata is JSON, and a hostile pickle never runs."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import random
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from checkpoint_files import GLOBAL_BATCH, cli_fingerprint, fingerprint, model, rerecord, save, snapshot  # noqa: E402
from cli_runner import run  # noqa: E402
from pipeplan.core.errors import OutputError  # noqa: E402
from pipeplan.runtime.rank_errors import TrainConfigError  # noqa: E402
from pipeplan.runtime.state import manifest as records  # noqa: E402
from pipeplan.runtime.state.checkpoint import load_rank, meta_file, prepare, rank_file, take  # noqa: E402
from runtime_cli import run_train  # noqa: E402

pytestmark = pytest.mark.torch  # every test here needs torch (make test-fast leaves them out)


class _RunsCommand:
    """Unpickling this would run a shell command that creates the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


class _OpensFile:
    """Unpickling this would create the marker file through open()."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return open, (str(self.marker), "w")


def _hostile(root: Path, marker: Path, payload: type, writer: str, with_meta: bool, **job: Any) -> Path:
    """A checkpoint folder at step 2 of 2 processes whose rank-0.pt and rank-1.pt are hostile pickles, recorded in
    latest.json as they are (whoever wrote them rewrote the record); without with_meta the JSON beside each is gone."""
    save(root, 2, world=2, **job)
    for rank in (0, 1):
        path = rank_file(root, 2, rank)
        state = {"stages": {rank: payload(marker)}, "optimizer": {}, "rng": {}}
        if writer == "torch":
            torch.save(state, path)
        else:
            path.write_bytes(pickle.dumps(state))
        rerecord(root, 2, path.name)
        if not with_meta:
            meta_file(path).unlink()
    return rank_file(root, 2, 0)


def test_a_checkpoint_restores_weights_optimizer_and_both_rngs_exactly(tmp_path: Path) -> None:
    """take then load_rank into fresh objects gives the same weights, Adam state and random streams."""
    stage, optimizer = model()
    torch.manual_seed(11)
    random.seed(12)
    take(tmp_path, 3, 0, {0: stage}, optimizer, 3 * GLOBAL_BATCH, fingerprint(), exchange=lambda v: [v])
    expected = (torch.rand(3), random.random())
    fresh, fresh_optimizer = model(seed=5)
    resumed = load_rank(tmp_path, 0, {0: fresh}, fresh_optimizer, fingerprint())
    assert resumed is not None and resumed.step == 3
    torch.testing.assert_close(fresh.state_dict(), stage.state_dict())
    torch.testing.assert_close(fresh_optimizer.state_dict()["state"], optimizer.state_dict()["state"])
    assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]
    meta = json.loads(meta_file(rank_file(tmp_path, 3, 0)).read_text())
    assert meta["format"] == "pipeplan.checkpoint/2" and meta["samples_seen"] == 24
    index = json.loads((tmp_path / "latest.json").read_text())
    data = rank_file(tmp_path, 3, 0).read_bytes()
    assert index["step"] == 3 and index["writing"] is None
    assert index["checkpoints"]["3"]["rank-0.pt"] == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_a_checkpoint_of_another_job_is_refused_before_its_tensors_are_read(tmp_path: Path) -> None:
    """A fingerprint that differs names the field; the .pt is not opened (here it is garbage, and the error is not
    about it)."""
    save(tmp_path, 2)
    rank_file(tmp_path, 2, 0).write_bytes(b"garbage")
    stage, optimizer = model()
    with pytest.raises(TrainConfigError, match=r"belongs to another job \(seed: 1 != 2\)"):
        load_rank(tmp_path, 0, {0: stage}, optimizer, fingerprint(seed=2))


def test_a_checkpoint_of_other_shapes_is_refused_by_the_process_naming_the_field(tmp_path: Path) -> None:
    """Tensors that do not fit this process's stage (another width) name the file, the field and both shapes."""
    save(tmp_path, 2, width=4)
    stage, optimizer = model(width=6)
    with pytest.raises(
        TrainConfigError,
        match=r"rank-0.pt: field 'stages.0.0.weight' is torch.float32 \[3, 4\], the model's is torch.float32 \[3, 6\]",
    ):
        load_rank(tmp_path, 0, {0: stage}, optimizer, fingerprint())


@pytest.mark.parametrize("payload", [_RunsCommand, _OpensFile])
@pytest.mark.parametrize("writer", ["torch", "pickle"])
@pytest.mark.parametrize("with_meta", [True, False])
def test_a_hostile_pickle_never_runs_through_the_loader_or_prepare(
    tmp_path: Path, payload: type, writer: str, with_meta: bool
) -> None:
    """load_rank and prepare(resume) refuse a rank-0.pt whose unpickling would run code, naming the file in one line,
    and the payload's marker file is never created."""
    marker = tmp_path / "marker"
    path = _hostile(tmp_path / "ckpt", marker, payload, writer, with_meta)
    stage, optimizer = model()
    for attempt in (
        lambda: load_rank(tmp_path / "ckpt", 0, {0: stage}, optimizer, fingerprint(2)),
        lambda: prepare(tmp_path / "ckpt", resume=True, writes=True, steps=8),
    ):
        with pytest.raises(TrainConfigError) as caught:
            attempt()
        message = str(caught.value)
        assert str(meta_file(path) if not with_meta else path) in message and "\n" not in message, message
        assert ("refused" in message) if with_meta else ("does not exist" in message), message
        if with_meta and writer == "torch":  # the refused global is named: posix.system or io.open
            assert ("GLOBAL posix.system" if payload is _RunsCommand else "GLOBAL io.open") in message, message
        assert "weights_only" not in message  # torch's advice to load it unsafely is not passed on
    assert not marker.exists()


@pytest.mark.slow
def test_train_resume_refuses_a_hostile_checkpoint_with_one_line_and_starts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`train --resume` on a hostile checkpoint: exit 2, one error line naming the file, no marker, no file written."""
    marker = tmp_path / "marker"
    ckpt = tmp_path / "ckpt"
    path = _hostile(ckpt, marker, _RunsCommand, "torch", with_meta=True, **cli_fingerprint())
    before = sorted(p.relative_to(ckpt) for p in ckpt.rglob("*"))
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--local", "2", "--schedule", "1f1b", "-p", "2", "-m", "4", "--steps", "4", "--checkpoint-dir", str(ckpt)]
    code, _, err = run(monkeypatch, capsys, *argv, "--checkpoint-every", "2", "--resume")
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: TrainConfigError:"), err
    assert str(path) in lines[0] and "refused" in lines[0]
    assert not marker.exists()
    assert sorted(p.relative_to(ckpt) for p in ckpt.rglob("*")) == before


def test_a_checkpoint_folder_that_is_not_a_folder_is_said_as_what_it_is(tmp_path: Path) -> None:
    """A FIFO, a file or a symlink loop given as --checkpoint-dir is named as such, never opened."""
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "file").write_text("")
    (tmp_path / "loop").symlink_to("loop2")
    (tmp_path / "loop2").symlink_to("loop")
    for name, said in (("fifo", " is a FIFO, not a folder"), ("file", " is a file, not a folder"), ("loop", ": symlink loop")):
        with pytest.raises(TrainConfigError, match=f"--checkpoint-dir '.*{name}'{said}"):
            prepare(tmp_path / name, resume=True, writes=True, steps=4)


def test_resume_refuses_step_folders_without_a_record_and_deletes_nothing(tmp_path: Path) -> None:
    """A folder with step-* folders and no latest.json is refused with --resume as without, naming the folder; a
    record from before records (no files listed) is refused too; neither changes anything."""
    (tmp_path / "step-000002").mkdir()
    (tmp_path / "step-000002" / "notes.txt").write_text("mine")
    before = snapshot(tmp_path)
    with pytest.raises(TrainConfigError, match=r"step-000002 has no record in .*latest.json.*move it out"):
        prepare(tmp_path, resume=True, writes=True, steps=8, every=2)
    (tmp_path / "latest.json").write_text(json.dumps({"format": "pipeplan.checkpoint/2", "step": 2}))
    before = snapshot(tmp_path)
    with pytest.raises(TrainConfigError, match=r"latest.json records no files"):
        prepare(tmp_path, resume=True, writes=True, steps=8, every=2)
    assert snapshot(tmp_path) == before


def test_resume_refuses_a_folder_it_would_write_that_the_record_does_not_own(tmp_path: Path) -> None:
    """step-000004 made by someone else, where the resumed run would write its next checkpoint, is refused up front."""
    save(tmp_path, 2)
    (tmp_path / "step-000004").mkdir()
    with pytest.raises(TrainConfigError, match=r"step-000004 exists, but .*latest.json does not record it"):
        prepare(tmp_path, resume=True, writes=True, steps=8, every=2)
    assert prepare(tmp_path, resume=True, writes=True, steps=8, every=3)[1] is False  # every 3 writes 3 and 6 only


def _full_at(call: int) -> Callable[[int, Any], int]:
    """os.write that fails with ENOSPC at its `call`-th call (1: the first)."""
    calls = [0]
    lock = threading.Lock()
    real = os.write

    def write(fd: int, data: Any) -> int:
        with lock:
            calls[0] += 1
            if calls[0] == call:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data)

    return write


@pytest.mark.parametrize(("world", "call"), [(1, c) for c in range(1, 5)] + [(2, c) for c in range(1, 7)])
def test_a_full_disk_names_the_file_and_leaves_the_last_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, world: int, call: int
) -> None:
    """ENOSPC at each write of a checkpoint (the record, every .pt and .json, the commit's record): one error naming
    the file and "no space left on device" on every process, no temporary file, no file of the unfinished step, and
    latest.json still naming the last complete checkpoint."""
    save(tmp_path, 1, world=world)
    before = snapshot(tmp_path)
    monkeypatch.setattr(records.os, "write", _full_at(call))
    with pytest.raises(OutputError) as caught:
        save(tmp_path, 2, world=world)
    message = str(caught.value)
    assert "no space left on device" in message and "\n" not in message, message
    assert str(tmp_path) in message and "still names the last complete one" in message
    monkeypatch.undo()
    after = snapshot(tmp_path)
    assert not [k for k in after if k.endswith(".tmp")]
    assert not [k for k in after if k.startswith("step-000002")], sorted(after)
    assert json.loads((tmp_path / "latest.json").read_text())["step"] == 1
    assert {k: v for k, v in after.items() if k != "latest.json"} == {k: v for k, v in before.items() if k != "latest.json"}
    assert prepare(tmp_path, resume=True, writes=True, steps=4, every=1)[0].startswith("--resume: continuing from step 1")


def _tmpfs(folder: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at folder (mounting needs root; skipped where it cannot be done)."""
    folder.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs."""
    yield from _tmpfs(tmp_path / "disk", "64k")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 700 KiB tmpfs: one checkpoint of `train --opt hidden=64` on 2 processes (about 455 KB) fits, two do not."""
    yield from _tmpfs(tmp_path / "disk", "700k")


def test_a_full_tmpfs_names_the_file_and_leaves_nothing_half_written(tiny_disk: Path) -> None:
    """On a 64 KiB disk, checkpoints of ~27 KiB fill it at the second or third: OutputError naming the file and "no
    space left on device", no .tmp left, latest.json at the last complete step."""
    root = tiny_disk / "ck"
    done = 0
    with pytest.raises(OutputError) as caught:
        for step in range(1, 10):
            save(root, step, width=600)
            done = step
    assert done >= 1 and "no space left on device" in str(caught.value) and str(root) in str(caught.value)
    names = snapshot(root)
    assert not [k for k in names if k.endswith(".tmp") or k.startswith(f"step-{done + 1:06d}")], sorted(names)
    assert json.loads((root / "latest.json").read_text())["step"] == done


def test_a_checkpoint_folder_that_cannot_be_written_is_refused_before_anything(tmp_path: Path) -> None:
    """--checkpoint-dir /proc/ck (no folder can be made there) and a folder on a read-only path are refused by
    prepare, naming the folder; nothing is left behind."""
    with pytest.raises(TrainConfigError, match=r"--checkpoint-dir '/proc/ck' cannot be written: a folder cannot be made there"):
        prepare(Path("/proc/ck"), resume=False, writes=True, steps=4, every=1)
    with pytest.raises(TrainConfigError, match=r"--checkpoint-dir '/proc' cannot be written: a folder cannot be made in it"):
        prepare(Path("/proc"), resume=False, writes=True, steps=4, every=1)
    assert prepare(tmp_path / "new", resume=False, writes=True, steps=4, every=1) == (None, False)
    assert not (tmp_path / "new").exists() and list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("case", ["proc", "fifo", "nan"])
def test_train_refuses_a_bad_checkpoint_folder_in_the_launcher(tmp_path: Path, case: str) -> None:
    """`train --local 2` with --checkpoint-dir /proc/ck, a FIFO rank-0.pt, or NaN weights: exit 2, one line naming
    the folder or file and field, within the launcher (no rank started: no 'rank N' in the output), nothing written."""
    ckpt = tmp_path / "ckpt"
    first_name = ""
    argv = ["--local", "2", "--schedule", "1f1b", "-p", "2", "-m", "4", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "2"]
    if case == "proc":
        ckpt = Path("/proc/ck")
        argv[argv.index(str(tmp_path / "ckpt"))] = str(ckpt)
    else:
        first = run_train([*argv, "--steps", "2"], timeout=300)  # a real checkpoint at step 2, recorded
        assert first.returncode == 0 and f"wrote checkpoint {ckpt / 'step-000002'}" in first.stdout, first.stderr
        path = rank_file(ckpt, 2, 0)
        if case == "fifo":
            path.unlink()
            os.mkfifo(path)
        else:
            state = torch.load(path, weights_only=True)
            first_name = next(iter(state["stages"][0]))
            state["stages"][0][first_name].view(-1)[0] = float("nan")
            torch.save(state, path)
            rerecord(ckpt, 2, path.name)
    before = snapshot(ckpt) if case != "proc" else {}
    done = run_train([*argv, "--steps", "4", "--resume"], timeout=120)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: TrainConfigError:"), done.stderr
    assert "rank " not in done.stderr
    said = {"proc": "'/proc/ck' cannot be written",
            "fifo": "rank-0.pt: cannot read checkpoint file: is not a regular file (a FIFO)",
            "nan": "rank-0.pt: field 'stages.0.{}' holds 1 value(s) that are NaN"}[case]  # fmt: skip
    said = said.format(first_name) if case == "nan" else said
    assert said in lines[0], lines[0]
    if case != "proc":
        assert snapshot(ckpt) == before


def test_prepare_checks_each_rank_against_the_stages_its_process_will_build(tmp_path: Path) -> None:
    """A checkpoint whose weights and Adam state were consistently widened (the record rewritten to match) passes
    every check of the file alone, and is refused by prepare once it is given the stages each process will build,
    naming the file, the field and both shapes."""
    save(tmp_path, 2, world=2)
    path = rank_file(tmp_path, 2, 1)
    state = torch.load(path, weights_only=True)
    state["stages"][1]["0.weight"] = torch.zeros(3, 5)
    for key in ("exp_avg", "exp_avg_sq"):
        state["optimizer"]["state"][0][key] = torch.zeros(3, 5)
    torch.save(state, path)
    rerecord(tmp_path, 2, path.name)
    assert prepare(tmp_path, resume=True, writes=True, steps=4, every=2)[1] is False

    def expect() -> tuple[dict[str, Any], dict[int, Any]]:
        targets = {}
        for rank in (0, 1):
            stage, optimizer = model(seed=rank)
            targets[rank] = ({rank: stage}, optimizer)
        return fingerprint(2), targets

    with pytest.raises(
        TrainConfigError,
        match=r"rank-1.pt: field 'stages.1.0.weight' is torch.float32 \[3, 5\], the model's is torch.float32 \[3, 4\]",
    ):
        prepare(tmp_path, resume=True, writes=True, steps=4, every=2, expect=expect)


def test_checkpoint_folder_is_checked_before_the_run(tmp_path: Path) -> None:
    """Writing into a folder that holds checkpoints without --resume is refused (it would mix two runs); a file is not
    a folder; an empty or missing folder is fine."""
    assert prepare(tmp_path / "new", resume=False, writes=True, steps=4) == (None, False)
    save(tmp_path / "old", 2)
    save(tmp_path / "old", 4)
    with pytest.raises(TrainConfigError, match=r"--checkpoint-dir '.*old' already holds checkpoints \(step 4\); add --resume"):
        prepare(tmp_path / "old", resume=False, writes=True, steps=8)
    assert prepare(tmp_path / "old", resume=False, writes=False, steps=8) == (None, False)  # nothing would be written
    (tmp_path / "file").write_text("")
    with pytest.raises(TrainConfigError, match=r"--checkpoint-dir '.*file' is a file, not a folder"):
        prepare(tmp_path / "file", resume=True, writes=True, steps=8)


def test_resume_says_where_it_starts_and_clears_only_its_own_interrupted_writes(tmp_path: Path) -> None:
    """--resume: no checkpoint yet starts at step 1 (said); a run already at --steps has nothing to run (finished);
    otherwise it continues, and the temporary files a killed write left in the folder the record says was being
    written are removed, while a file of another name there, and temporary-looking files elsewhere, are kept."""
    note, finished = prepare(tmp_path / "empty", resume=True, writes=True, steps=8)
    assert "no checkpoint in" in str(note) and "starting at step 1" in str(note) and not finished
    root = tmp_path / "ck"
    save(root, 2)
    save(root, 4)
    index = json.loads((root / "latest.json").read_text())
    (root / "latest.json").write_text(json.dumps(index | {"writing": 6}))  # a run killed while writing step 6
    (root / "step-000006").mkdir()
    stale = root / "step-000006" / ".rank-1.pt.k2j3_x.tmp"
    stale.write_bytes(b"half")
    mine = [root / "step-000006" / "rank-1.tmp", root / "step-000002" / ".rank-0.pt.abc.tmp", root / ".latest.json.q.tmp"]
    for path in mine:
        path.write_bytes(b"user")
    note, finished = prepare(root, resume=True, writes=True, steps=8, every=2)
    assert note is not None and "continuing from step 4 of 8" in note and not finished
    assert not stale.exists() and all(path.read_bytes() == b"user" for path in mine)
    note, finished = prepare(root, resume=True, writes=True, steps=4)
    assert note is not None and note.endswith("at step 4, and --steps is 4: nothing left to run") and finished


def test_keep_last_removes_all_but_the_newest_checkpoints(tmp_path: Path) -> None:
    """With --keep-last 2 the third checkpoint removes the first's folder and says so; --keep-last 0 keeps every one."""
    save(tmp_path, 2)
    save(tmp_path, 4)
    note = save(tmp_path, 6, keep_last=2)[0]
    assert note == f"wrote checkpoint {tmp_path / 'step-000006'}; removed 1 older (--keep-last 2)"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.json", "step-000004", "step-000006"]
    save(tmp_path, 8)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.json", "step-000004", "step-000006", "step-000008"]


@pytest.mark.slow
def test_train_on_a_full_disk_stops_every_rank_naming_the_file(small_disk: Path) -> None:
    """`train --local 2 --checkpoint-every 2 --steps 4` on a disk with room for one checkpoint: the second fails with
    "no space left on device" naming the file, every rank stops (exit 2), no temporary or half-written file is left,
    latest.json names step 2, and --resume from there is accepted."""
    ckpt = small_disk / "ck"
    argv = ["--local", "2", "--schedule", "1f1b", "-p", "2", "-m", "4", "--opt", "hidden=64", "--checkpoint-dir", str(ckpt),
            "--checkpoint-every", "2", "-q"]  # fmt: skip
    done = run_train([*argv, "--steps", "4"], timeout=300)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert errors and all("checkpoint after step 4 not written: checkpoint file" in e for e in errors), done.stderr
    assert "no space left on device" in errors[0] and "inline_container" not in done.stderr
    names = snapshot(ckpt)
    assert sorted(names) == ["latest.json", "step-000002", *[f"step-000002/rank-{r}.{x}" for r in (0, 1) for x in ("json", "pt")]]
    assert json.loads((ckpt / "latest.json").read_text())["step"] == 2
    assert (
        prepare(ckpt, resume=True, writes=False, steps=4)[0] == f"--resume: continuing from step 2 of 4 ({ckpt / 'step-000002'})"
    )


def test_a_checkpoint_of_stages_past_9_and_over_10_parameters_restores_in_numeric_order(tmp_path: Path) -> None:
    """Indexes are numbers, not strings: an optimizer of 12 parameters (0..11) and a process running stages 2 and 10
    (the optimizer holds stage 2's parameters first) load back exactly (the built-in transformer's --resume had failed
    with "names parameters [0, 1, ...], expected 0..23 once each", its 24 indexes ordered as text)."""

    def stages(seed: int) -> tuple[dict[int, torch.nn.Module], torch.optim.Optimizer]:
        torch.manual_seed(seed)
        modules: dict[int, torch.nn.Module] = {
            2: torch.nn.Sequential(torch.nn.Linear(4, 3)),
            10: torch.nn.Sequential(*(torch.nn.Linear(3 if i == 0 else 5, 5) for i in range(5))),
        }
        optimizer = torch.optim.Adam([p for s in sorted(modules) for p in modules[s].parameters()], lr=0.01)
        modules[10](modules[2](torch.randn(2, 4))).pow(2).sum().backward()
        optimizer.step()
        return modules, optimizer

    job = fingerprint(stages=[[0, 0, [0]]] * 11)
    modules, optimizer = stages(0)
    assert len([p for g in optimizer.state_dict()["param_groups"] for p in g["params"]]) == 12
    take(tmp_path, 1, 0, modules, optimizer, GLOBAL_BATCH, job, exchange=lambda v: [v])
    fresh, fresh_optimizer = stages(5)
    resumed = load_rank(tmp_path, 0, fresh, fresh_optimizer, job)
    assert resumed is not None and resumed.step == 1
    for s in modules:
        torch.testing.assert_close(fresh[s].state_dict(), modules[s].state_dict(), rtol=0, atol=0)
    torch.testing.assert_close(fresh_optimizer.state_dict()["state"], optimizer.state_dict()["state"], rtol=0, atol=0)
