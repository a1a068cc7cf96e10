"""Checkpoints: each process saves its stages (weights, optimizer, step, data position, RNG); resume reloads them.

Layout: `DIR/step-000010/rank-3.pt` holds process 3's stages after 10
iterations; `DIR/latest.json` names the last complete checkpoint. Process 0
writes latest.json only after every process has written its file (a
barrier), and every file is written to a temporary name then renamed, so a
run killed at any moment leaves the previous checkpoint usable; the
temporary files such a run leaves are removed when the next run starts
(`prepare`). With `keep_last` N, process 0 removes all but the newest N
complete checkpoints after marking one.
"""

from __future__ import annotations

import json
import os
import random
import shutil
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


def mark_latest(root: Path, step: int, keep_last: int = 0) -> list[Path]:
    """Record that the checkpoint after `step` iterations is complete (process 0, after a barrier).

    With `keep_last` > 0, remove the step folders older than the newest `keep_last`; return those removed.
    """
    tmp = root / (LATEST + ".tmp")
    tmp.write_text(json.dumps({"format": CHECKPOINT_FORMAT, "step": step}, sort_keys=True) + "\n")
    os.replace(tmp, root / LATEST)
    if keep_last <= 0:
        return []
    older = [path for found, path in step_dirs(root) if found <= step][:-keep_last]
    for path in older:
        shutil.rmtree(path, ignore_errors=True)
    return older


def step_dirs(root: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every `step-NNNNNN` folder in root, oldest first."""
    found = []
    for path in root.glob("step-*") if root.is_dir() else ():
        digits = path.name.removeprefix("step-")
        if path.is_dir() and digits.isdigit():
            found.append((int(digits), path))
    return sorted(found)


def prepare(root: Path, resume: bool, writes: bool, steps: int) -> tuple[str | None, bool]:
    """Check a checkpoint folder before any process starts; remove what interrupted writes left behind.

    Returns a note for the user (or None) and whether the run is already
    finished: resuming from a folder with no checkpoint starts at step 1 (a
    job restarted by torchrun resumes the same way whether or not it got as
    far as a checkpoint); resuming a run that already reached `steps` has
    nothing left to run.

    Raises:
        TrainConfigError: the folder is a file; it holds checkpoints and neither --resume
            was given nor writing is off (they would be overwritten, mixing two runs); with --resume,
            latest.json names a step whose folder does not exist.
    """
    if root.exists() and not root.is_dir():
        raise TrainConfigError(f"--checkpoint-dir {str(root)!r} is a file, not a folder")
    step = latest_step(root) if root.is_dir() else None
    existing = step_dirs(root)
    if not resume:
        if writes and (step is not None or existing):
            at = f"step {step}" if step is not None else f"{len(existing)} step folder(s)"
            raise TrainConfigError(
                f"--checkpoint-dir {str(root)!r} already holds checkpoints ({at}); add --resume to continue that run, "
                "or choose an empty folder"
            )
        return None, False
    for stale in [*root.glob("step-*/rank-*.tmp"), *root.glob(LATEST + ".tmp")] if root.is_dir() else []:
        stale.unlink(missing_ok=True)
    if step is None:
        return f"--resume: no checkpoint in {str(root)!r} yet; starting at step 1", False
    if not step_dir(root, step).is_dir():
        raise TrainConfigError(
            f"checkpoint index {root / LATEST} names step {step}, but {step_dir(root, step)} does not exist: the "
            f"checkpoint is gone; restore that folder, or remove {LATEST} to start over"
        )
    if step >= steps:
        return f"--resume: the checkpoint in {str(root)!r} is at step {step}, and --steps is {steps}: nothing left to run", True
    return f"--resume: continuing from step {step} of {steps} ({step_dir(root, step)})", False


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
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # torch raises many kinds for a truncated or foreign file
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise TrainConfigError(f"checkpoint file {path} cannot be read ({type(exc).__name__}: {first})") from None
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise TrainConfigError(f"{path} is not a pipeplan checkpoint (format {found!r})")
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
