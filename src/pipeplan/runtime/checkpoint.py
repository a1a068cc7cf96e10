"""Checkpoints: each process saves its stages (weights, optimizer, step, data position, RNG); resume reloads them.

Layout: `DIR/step-000010/rank-3.pt` holds process 3's stages after 10
iterations; `DIR/latest.json` names the last complete checkpoint. Process 0
writes latest.json only after every process has written its file (a
barrier), and every file is written to a temporary name then renamed, so a
run killed at any moment leaves the previous checkpoint usable.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeplan.runtime.errors import TrainConfigError

CHECKPOINT_FORMAT = "pipeplan.checkpoint/1"
LATEST = "latest.json"


@dataclass(frozen=True, slots=True)
class Resumed:
    """Where a resumed run continues: the next iteration to run."""

    step: int
    path: Path


def step_dir(root: Path, step: int) -> Path:
    """The directory of the checkpoint taken after `step` iterations."""
    return root / f"step-{step:06d}"


def rank_file(root: Path, step: int, process: int) -> Path:
    """Process `process`'s file in the checkpoint after `step` iterations."""
    return step_dir(root, step) / f"rank-{process}.pt"


def save_rank(
    root: Path,
    step: int,
    process: int,
    modules: dict[int, nn.Module],
    optimizer: torch.optim.Optimizer,
    samples_seen: int,
    fingerprint: dict[str, Any],
) -> None:
    """Write this process's part of the checkpoint taken after `step` iterations (atomically)."""
    path = rank_file(root, step, process)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        "format": CHECKPOINT_FORMAT,
        "step": step,
        "samples_seen": samples_seen,
        "fingerprint": fingerprint,
        "stages": {s: m.state_dict() for s, m in modules.items()},
        "optimizer": optimizer.state_dict(),
        "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["rng"]["cuda"] = torch.cuda.get_rng_state_all()
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def mark_latest(root: Path, step: int) -> None:
    """Record that the checkpoint after `step` iterations is complete (process 0, after a barrier)."""
    tmp = root / (LATEST + ".tmp")
    tmp.write_text(json.dumps({"format": CHECKPOINT_FORMAT, "step": step}, sort_keys=True) + "\n")
    os.replace(tmp, root / LATEST)


def latest_step(root: Path) -> int | None:
    """The step of the last complete checkpoint in root, or None when there is none.

    Raises:
        TrainConfigError: latest.json is unreadable.
    """
    path = root / LATEST
    if not path.exists():
        return None
    try:
        step = json.loads(path.read_text())["step"]
    except (ValueError, KeyError, TypeError) as exc:
        raise TrainConfigError(f"checkpoint index {path} is malformed: {exc}") from None
    if not isinstance(step, int) or step < 0:
        raise TrainConfigError(f"checkpoint index {path} has step {step!r}, expected an integer >= 0")
    return step


def load_rank(
    root: Path,
    process: int,
    modules: dict[int, nn.Module],
    optimizer: torch.optim.Optimizer,
    fingerprint: dict[str, Any],
) -> Resumed | None:
    """Restore this process's stages, optimizer and RNG from the last complete checkpoint; None if there is none.

    Raises:
        TrainConfigError: the checkpoint was taken by a different job (plan, schedule, model, world size).
    """
    step = latest_step(root)
    if step is None:
        return None
    path = rank_file(root, step, process)
    if not path.exists():
        raise TrainConfigError(f"checkpoint {step_dir(root, step)} has no file for rank {process} ({path.name})")
    state = torch.load(path, map_location="cpu", weights_only=False)
    if state.get("format") != CHECKPOINT_FORMAT:
        raise TrainConfigError(f"{path} is not a pipeplan checkpoint (format {state.get('format')!r})")
    if state["fingerprint"] != fingerprint:
        theirs = state["fingerprint"]
        diff = sorted(k for k in set(fingerprint) | set(theirs) if fingerprint.get(k) != theirs.get(k))
        detail = ", ".join(f"{k}: {theirs.get(k)!r} != {fingerprint.get(k)!r}" for k in diff)
        raise TrainConfigError(f"checkpoint {path} belongs to another job ({detail})")
    if sorted(state["stages"]) != sorted(modules):
        raise TrainConfigError(f"checkpoint {path} holds stages {sorted(state['stages'])}, this rank runs {sorted(modules)}")
    for s, module in modules.items():
        module.load_state_dict(state["stages"][s])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"]["torch"])
    random.setstate(state["rng"]["python"])
    if "cuda" in state["rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    return Resumed(step, path)
