"""Shared by the checkpoint tests: real checkpoints taken by `take` (one process, or several as threads), and the
record rewritten as someone who controls the folder would rewrite it."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import torch

from pipeplan.runtime.state.checkpoint import take
from pipeplan.runtime.state.manifest import file_record

GLOBAL_BATCH = 8


def fingerprint(world: int = 1, **changes: Any) -> dict[str, Any]:
    """A job's fingerprint as TrainConfig writes one (the fields the checks read, and a seed)."""
    return {"world_size": world, "global_batch": GLOBAL_BATCH, "dtype": "float32",
            "stages": [[r, r, [r]] for r in range(world)], "seed": 1} | changes  # fmt: skip


def model(width: int = 4, seed: int = 0) -> tuple[torch.nn.Sequential, torch.optim.Optimizer]:
    """A small stage (one Linear layer) with an Adam optimizer that has taken one step (so it has state to save)."""
    torch.manual_seed(seed)
    stage = torch.nn.Sequential(torch.nn.Linear(width, 3))
    optimizer = torch.optim.Adam(stage.parameters(), lr=0.01)
    stage(torch.randn(5, width)).pow(2).sum().backward()
    optimizer.step()
    return stage, optimizer


class Threads:
    """An all-gather among `world` threads, standing in for torch.distributed's between processes."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.values: list[Any] = [None] * world
        self.barrier = threading.Barrier(world)
        self.local = threading.local()

    def exchange(self, value: Any) -> list[Any]:
        self.values[self.local.rank] = value
        self.barrier.wait()
        out = list(self.values)
        self.barrier.wait()
        return out


def save(root: Path, step: int, world: int = 1, keep_last: int = 0, width: int = 4, **job: Any) -> list[str | None]:
    """Take the checkpoint after `step` on `world` processes (threads), `job` changing fields of their fingerprint; the
    notes (process 0's first); any error is raised (the first process's)."""
    group = Threads(world)
    notes: list[str | None] = [None] * world
    errors: list[BaseException | None] = [None] * world

    def one(rank: int) -> None:
        group.local.rank = rank
        stage, optimizer = model(width, seed=rank)
        written = fingerprint(world, **job)
        try:
            notes[rank] = take(root, step, rank, {rank: stage}, optimizer, step * written["global_batch"], written,
                               keep_last, exchange=group.exchange)  # fmt: skip
        except BaseException as exc:
            errors[rank] = exc

    threads = [threading.Thread(target=one, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    return notes


def rerecord(root: Path, step: int, name: str) -> None:
    """Rewrite latest.json so that it records `name` of `step` as it now is (someone who altered the file and its
    record, so that only the checks of its contents stand in the way)."""
    index = json.loads((root / "latest.json").read_text())
    data = (root / f"step-{step:06d}" / name).read_bytes()
    record = file_record(data)
    index["checkpoints"][str(step)][name] = {"bytes": record.bytes, "sha256": record.sha256}
    (root / "latest.json").write_text(json.dumps(index))


def snapshot(root: Path) -> dict[str, object]:
    """Every entry under root: a file's bytes, a link's target, a folder's or a FIFO's kind."""
    out: dict[str, object] = {}
    for path in sorted(root.rglob("*")):
        key = str(path.relative_to(root))
        if path.is_symlink():
            out[key] = ("link", str(path.readlink()))
        elif path.is_dir():
            out[key] = "folder"
        elif path.is_file():
            out[key] = path.read_bytes()
        else:
            out[key] = "other"
    return out


def cli_fingerprint(steps: int = 4) -> dict[str, Any]:
    """The fingerprint of `train --local 2 --schedule 1f1b -p 2 -m 4 --steps STEPS` with its defaults (the launcher
    compares a checkpoint's with it before reading any tensor)."""
    from pipeplan.runtime.execution.job import ScheduleLayout
    from pipeplan.runtime.training.resume_check import resume_targets
    from pipeplan.runtime.training.train_config import TrainConfig

    config = TrainConfig(layout=ScheduleLayout("1f1b", 2, 4, 64, 1, 1, None, steps, 0), steps=steps)
    return resume_targets(config, 2)[0]
