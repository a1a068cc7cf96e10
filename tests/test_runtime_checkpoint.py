"""Checkpoints are data: a rank's tensors load with weights_only, its metadata is JSON, and a hostile pickle never runs."""

from __future__ import annotations

import json
import os
import pickle
import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from cli_runner import run  # noqa: E402
from pipeplan.runtime.errors import TrainConfigError  # noqa: E402
from pipeplan.runtime.state.checkpoint import load_rank, mark_latest, meta_file, prepare, rank_file, save_rank  # noqa: E402

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


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A small real layer with an Adam optimizer that has taken one step (so it has state to save)."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 3)
    optimizer = torch.optim.Adam(layer.parameters(), lr=0.01)
    layer(torch.randn(5, 4)).pow(2).sum().backward()
    optimizer.step()
    return layer, optimizer


def _hostile(root: Path, marker: Path, payload: type, writer: str, with_meta: bool) -> Path:
    """A checkpoint folder at step 2 whose rank-0.pt (and rank-1.pt) is a hostile pickle; with_meta puts a valid JSON
    beside each (so only the .pt stands between the loader and the payload)."""
    layer, optimizer = _model()
    for rank in (0, 1):
        save_rank(root, 2, rank, {rank: layer}, optimizer, 16, {})
        path = rank_file(root, 2, rank)
        state = {"stages": {rank: payload(marker)}, "optimizer": {}, "rng": {}}
        if writer == "torch":
            torch.save(state, path)
        else:
            path.write_bytes(pickle.dumps(state))
        if not with_meta:
            meta_file(path).unlink()
    mark_latest(root, 2)
    return rank_file(root, 2, 0)


def test_a_checkpoint_restores_weights_optimizer_and_both_rngs_exactly(tmp_path: Path) -> None:
    """save_rank then load_rank into fresh objects gives the same weights, Adam state and random streams."""
    layer, optimizer = _model()
    torch.manual_seed(11)
    random.seed(12)
    save_rank(tmp_path, 3, 0, {0: layer}, optimizer, 24, {"stages": [(0, 1, [0])], "seed": 1})
    mark_latest(tmp_path, 3)
    expected = (torch.rand(3), random.random())
    fresh = torch.nn.Linear(4, 3)
    fresh_optimizer = torch.optim.Adam(fresh.parameters(), lr=0.01)
    resumed = load_rank(tmp_path, 0, {0: fresh}, fresh_optimizer, {"stages": [(0, 1, [0])], "seed": 1})
    assert resumed is not None and resumed.step == 3
    torch.testing.assert_close(fresh.state_dict(), layer.state_dict())
    saved, loaded = optimizer.state_dict()["state"], fresh_optimizer.state_dict()["state"]
    torch.testing.assert_close(loaded, saved)
    assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]
    meta = json.loads(meta_file(rank_file(tmp_path, 3, 0)).read_text())
    assert meta["format"] == "pipeplan.checkpoint/2" and meta["samples_seen"] == 24


def test_a_checkpoint_of_another_job_is_refused_before_its_tensors_are_read(tmp_path: Path) -> None:
    """A fingerprint that differs names the field; the .pt is not opened (here it is garbage, and the error is not about it)."""
    layer, optimizer = _model()
    save_rank(tmp_path, 2, 0, {0: layer}, optimizer, 16, {"seed": 1})
    mark_latest(tmp_path, 2)
    rank_file(tmp_path, 2, 0).write_bytes(b"garbage")
    with pytest.raises(TrainConfigError, match=r"belongs to another job \(seed: 1 != 2\)"):
        load_rank(tmp_path, 0, {0: layer}, optimizer, {"seed": 2})


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
    layer, optimizer = _model()
    for attempt in (
        lambda: load_rank(tmp_path / "ckpt", 0, {0: layer}, optimizer, {}),
        lambda: prepare(tmp_path / "ckpt", resume=True, writes=True, steps=8),
    ):
        with pytest.raises(TrainConfigError) as caught:
            attempt()
        message = str(caught.value)
        assert str(path) in message and "\n" not in message, message
        assert ("refused" in message) if with_meta else ("has no rank-0.json beside it" in message), message
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
    path = _hostile(ckpt, marker, _RunsCommand, "torch", with_meta=True)
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
