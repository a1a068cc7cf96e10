"""Checkpoints: each process saves its stages (weights, optimizer, step, data position, RNG); resume reloads them.

Layout: `DIR/step-000010/rank-3.pt` holds process 3's tensors after 10
iterations (stage weights, optimizer state, torch RNG) and `rank-3.json`
beside it the rest (format, step, samples seen, the job's fingerprint,
Python's RNG); `DIR/latest.json` names the last complete checkpoint.

Note:
    A checkpoint is data, never code: the .pt is read with
    `torch.load(weights_only=True)`, whose unpickler builds tensors and plain
    containers only and refuses any other object before it is made, so a
    crafted file cannot run anything; its JSON is read first (io's one JSON
    reader) and checked, and `prepare` checks every file of the checkpoint to
    resume before any process starts. Process 0
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
import pickle
import random
import re
import shutil
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeplan.io.files import kind_of, os_reason, something_at
from pipeplan.io.json_fields import load_json_file
from pipeplan.runtime.errors import TrainConfigError

CHECKPOINT_FORMAT = "pipeplan.checkpoint/2"
"""Of a rank's JSON (format 1 was one pickle per rank, which only an unsafe load could read)."""
INDEX_FORMATS = ("pipeplan.checkpoint/1", CHECKPOINT_FORMAT)
"""latest.json has not changed: it names a step."""
LATEST = "latest.json"
_REFUSALS = tuple(
    re.compile(pattern, re.IGNORECASE)
    for pattern in (r"(unsupported global: GLOBAL [\w.]+)", r"(unsupported GLOBAL [\w.]+)", r"(Unsupported operand \d+)",
                    r"WeightsUnpickler error: ([^\n]+)")
)  # fmt: skip
"""The reason in torch's weights-only refusal across its wordings, the most telling first."""
_META_KEYS = ("format", "step", "samples_seen", "fingerprint", "python_rng")


@dataclass(frozen=True, slots=True)
class Resumed:
    """Where a resumed run continues: the next iteration to run."""

    step: int
    path: Path


def step_dir(root: Path, step: int) -> Path:
    """The directory of the checkpoint taken after `step` iterations."""
    return root / f"step-{step:06d}"


def rank_file(root: Path, step: int, process: int) -> Path:
    """Process `process`'s tensors (.pt) in the checkpoint after `step` iterations; its JSON is beside it
    (`meta_file`)."""
    return step_dir(root, step) / f"rank-{process}.pt"


def meta_file(tensors: Path) -> Path:
    """The JSON beside a rank's .pt: format, step, samples seen, fingerprint, Python's RNG."""
    return tensors.with_suffix(".json")


def save_rank(
    root: Path,
    step: int,
    process: int,
    modules: dict[int, nn.Module],
    optimizer: torch.optim.Optimizer,
    samples_seen: int,
    fingerprint: dict[str, Any],
) -> None:
    """Write this process's part of the checkpoint taken after `step` iterations (atomically): the tensors, then the
    JSON, whose presence marks the rank's part complete."""
    path = rank_file(root, step, process)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, Any] = {
        "stages": {s: m.state_dict() for s, m in modules.items()},
        "optimizer": optimizer.state_dict(),
        "rng": {"torch": torch.get_rng_state()},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        tensors["rng"]["cuda"] = torch.cuda.get_rng_state_all()
    version, internal, gauss = random.getstate()
    meta = {
        "format": CHECKPOINT_FORMAT,
        "step": step,
        "samples_seen": samples_seen,
        "fingerprint": fingerprint,
        "python_rng": [version, list(internal), gauss],
    }
    tmp = path.with_suffix(".tmp")
    torch.save(tensors, tmp)
    os.replace(tmp, path)
    meta_tmp = path.with_suffix(".json.tmp")
    meta_tmp.write_text(json.dumps(meta, sort_keys=True) + "\n")
    os.replace(meta_tmp, meta_file(path))


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
            latest.json names a step whose folder does not exist, or a file of the checkpoint to resume
            is missing, unreadable or not plain data (`verify`).
    """
    if something_at(str(root)) and not root.is_dir():
        try:
            kind = kind_of(os.stat(root).st_mode) or "a file"
        except OSError as exc:  # a symlink loop, a broken symlink, no permission: said as it is
            raise TrainConfigError(f"--checkpoint-dir {str(root)!r}: {os_reason(exc, str(root))}") from None
        raise TrainConfigError(f"--checkpoint-dir {str(root)!r} is {kind}, not a folder")
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
    verify(root, step)  # what the processes will load, checked once here: a bad or hostile file ends the run at once
    return f"--resume: continuing from step {step} of {steps} ({step_dir(root, step)})", False


def latest_step(root: Path) -> int | None:
    """The step of the last complete checkpoint in root, or None when there is none.

    Raises:
        TrainConfigError: latest.json cannot be read or is malformed (naming it).
    """
    path = root / LATEST
    if not something_at(str(path)):
        return None
    index = load_json_file(path, TrainConfigError, "checkpoint index")
    if not isinstance(index, dict) or "step" not in index:
        raise TrainConfigError(f"checkpoint index {path} is malformed: expected an object with 'step'")
    if index.get("format", INDEX_FORMATS[0]) not in INDEX_FORMATS:
        raise TrainConfigError(f"checkpoint index {path} has format {index.get('format')!r}, expected {CHECKPOINT_FORMAT!r}")
    step = index["step"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise TrainConfigError(f"checkpoint index {path} has step {step!r}, expected an integer >= 0")
    return step


def verify(root: Path, step: int) -> None:
    """Check every rank's files of the checkpoint after `step` before any process starts: each JSON reads and
    matches the step, each .pt holds only tensors and plain data (read without its tensors' bytes).

    Raises:
        TrainConfigError: a rank's file missing, unreadable, or not plain data (naming it).
    """
    folder = step_dir(root, step)
    tensors = sorted(folder.glob("rank-*.pt")) if folder.is_dir() else []
    if not tensors:
        raise TrainConfigError(f"checkpoint index {root / LATEST} names step {step}, but {folder} holds no rank files")
    for path in tensors:
        _read_meta(path, step)
        _load_tensors(path, mmap=True)


def _read_meta(path: Path, step: int) -> dict[str, Any]:
    """A rank's JSON, checked: format, step, the fields pipeplan writes."""
    meta_path = meta_file(path)
    if not something_at(str(meta_path)):
        raise TrainConfigError(
            f"checkpoint file {path} has no {meta_path.name} beside it: it is not a checkpoint this pipeplan wrote "
            f"(format {CHECKPOINT_FORMAT!r}); start the run again in an empty --checkpoint-dir"
        )
    meta = load_json_file(meta_path, TrainConfigError, "checkpoint")
    if not isinstance(meta, dict) or meta.get("format") != CHECKPOINT_FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise TrainConfigError(f"{meta_path} is not a pipeplan checkpoint (format {found!r}, expected {CHECKPOINT_FORMAT!r})")
    missing = [key for key in _META_KEYS if key not in meta]
    if missing:
        raise TrainConfigError(f"{meta_path} is missing field {missing[0]!r}")
    if meta["step"] != step:
        raise TrainConfigError(f"{meta_path} holds step {meta['step']!r}, but it lies in the folder of step {step}")
    rng = meta["python_rng"]
    if not (isinstance(rng, list) and len(rng) == 3 and isinstance(rng[1], list) and all(type(v) is int for v in rng[1])):
        raise TrainConfigError(f"{meta_path}: field 'python_rng' must be [version, [integers], gauss], got {str(rng)[:60]}")
    return meta


def _load_tensors(path: Path, mmap: bool = False) -> dict[str, Any]:
    """A rank's .pt read as data only (weights_only: tensors and plain containers; any other object is refused before
    it is built, so nothing in the file runs); with `mmap`, the tensors' bytes are mapped, not read."""
    if not something_at(str(path)):
        raise TrainConfigError(f"checkpoint file {path} does not exist")
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; anything else is not ours
        raise TrainConfigError(
            f"checkpoint file {path} cannot be read as data, refused: not a zip archive of tensors as torch.save writes"
        )
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols; the error below is the message
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:  # torch raises many kinds for a truncated, foreign or hostile file
        if isinstance(exc, pickle.UnpicklingError) and "weights only" in str(exc).lower():
            raise TrainConfigError(
                f"checkpoint file {path} cannot be read as data, refused: {_unpickler_reason(str(exc))} (a checkpoint "
                "holds only tensors and plain values; loading any other object could run code)"
            ) from None
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise TrainConfigError(f"checkpoint file {path} cannot be read ({type(exc).__name__}: {first[:120]})") from None
    if not isinstance(state, dict) or not {"stages", "optimizer", "rng"} <= set(state):
        raise TrainConfigError(f"checkpoint file {path} is not a pipeplan checkpoint (expected stages, optimizer, rng)")
    return state


def _unpickler_reason(message: str) -> str:
    """What torch's weights-only unpickler refused (`unsupported GLOBAL posix.system`), without its advice to load the
    file unsafely."""
    found = next((match for pattern in _REFUSALS if (match := pattern.search(message))), None)
    return found.group(1).strip()[:120] if found else "not tensors and plain values"


def load_rank(
    root: Path,
    process: int,
    modules: dict[int, nn.Module],
    optimizer: torch.optim.Optimizer,
    fingerprint: dict[str, Any],
) -> Resumed | None:
    """Restore this process's stages, optimizer and RNG from the last complete checkpoint; None if there is none.

    The JSON is read and checked (format, step, fingerprint) before the tensors, which are read as data only.

    Raises:
        TrainConfigError: a missing, unreadable or hostile file, or a checkpoint taken by a different job (plan,
            schedule, model, world size).
    """
    step = latest_step(root)
    if step is None:
        return None
    path = rank_file(root, step, process)
    if not something_at(str(path)):
        raise TrainConfigError(f"checkpoint {step_dir(root, step)} has no file for rank {process} ({path.name})")
    meta = _read_meta(path, step)
    ours = json.loads(json.dumps(fingerprint))  # as the JSON holds it: tuples are lists there
    theirs = meta["fingerprint"]
    if not isinstance(theirs, dict):
        raise TrainConfigError(f"{meta_file(path)}: field 'fingerprint' must be an object")
    if theirs != ours:
        diff = sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k))
        detail = ", ".join(f"{k}: {str(theirs.get(k))[:60]} != {str(ours.get(k))[:60]}" for k in diff)
        raise TrainConfigError(f"checkpoint {path} belongs to another job ({detail})")
    state = _load_tensors(path)
    if sorted(state["stages"]) != sorted(modules):
        raise TrainConfigError(f"checkpoint {path} holds stages {sorted(state['stages'])}, this rank runs {sorted(modules)}")
    for s, module in modules.items():
        module.load_state_dict(state["stages"][s])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"]["torch"])
    version, internal, gauss = meta["python_rng"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state["rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    return Resumed(step, path)
