"""Checkpoints: each process saves its stages (weights, optimizer, step, data position, RNG); resume reloads them.

Layout: `DIR/step-000010/rank-3.pt` holds process 3's tensors after 10
iterations (stage weights, optimizer state, torch RNG) and `rank-3.json`
beside it the rest (format, step, samples seen, the job's fingerprint,
Python's RNG); `DIR/latest.json` is the folder's record (runtime.state.manifest):
the last complete checkpoint, and every file pipeplan wrote with its size and SHA-256.

Note:
    A checkpoint is taken by every process together (`take`): process 0 records the step folder as being
    written, every process writes its two files (each whole: a temporary name, then a rename), and only when
    all have, process 0 records the checkpoint complete, with every file's size and hash, and prunes with
    `--keep-last` what the record lists. A write that fails (a full disk) stops every process with one
    message naming the file and the reason; the files of the unfinished checkpoint are removed and the record
    still names the last complete one. A run killed at any moment leaves the previous checkpoint usable.
    Resuming (`prepare`, before any process starts) reads every file of the checkpoint through the bounded
    reader and checks every field and tensor (runtime.state.checkpoint_read).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeplan.core.errors import OutputError, PipeplanError
from pipeplan.io.files import something_at
from pipeplan.runtime.rank_errors import TrainConfigError
from pipeplan.runtime.state import manifest as records
from pipeplan.runtime.state.checkpoint_prepare import Expect, foreign_folder, prepare, step_dirs, verify
from pipeplan.runtime.state.checkpoint_read import meta_name, read_rank, tensors_name
from pipeplan.runtime.state.checkpoint_state import check_against
from pipeplan.runtime.state.manifest import LATEST, FileRecord, Manifest, file_record, read_manifest, step_dir

CHECKPOINT_FORMAT = records.FORMAT
"""Of a rank's JSON and of latest.json (format 1 was one pickle per rank, which only an unsafe load could read)."""
Exchange = Callable[[Any], list[Any]]
"""Give every process's value to every process (JSON through all_gather_json, or a stand-in in tests)."""

__all__ = [
    "CHECKPOINT_FORMAT",
    "LATEST",
    "Expect",
    "Resumed",
    "load_rank",
    "prepare",
    "rank_file",
    "step_dir",
    "step_dirs",
    "take",
    "verify",
]


@dataclass(frozen=True, slots=True)
class Resumed:
    """Where a resumed run continues: the next iteration to run."""

    step: int
    path: Path


def rank_file(root: Path, step: int, process: int) -> Path:
    """Process `process`'s tensors (.pt) in the checkpoint after `step` iterations; its JSON is beside it."""
    return step_dir(root, step) / tensors_name(process)


def meta_file(tensors: Path) -> Path:
    """The JSON beside a rank's .pt: format, step, samples seen, fingerprint, Python's RNG."""
    return tensors.with_suffix(".json")


def _all_gather(value: Any) -> list[Any]:
    from pipeplan.runtime.transport.exchange import all_gather_json

    return all_gather_json(value)


def take(
    root: Path,
    step: int,
    process: int,
    modules: dict[int, nn.Module],
    optimizer: torch.optim.Optimizer,
    samples_seen: int,
    fingerprint: dict[str, Any],
    keep_last: int = 0,
    exchange: Exchange = _all_gather,
) -> str | None:
    """Take the checkpoint after `step` iterations on every process together; process 0's note for the user
    (`wrote checkpoint DIR/step-...; removed ...`), None elsewhere.

    Raises:
        OutputError: a file could not be written (naming it and "no space left on device"), on every process;
            nothing of this checkpoint is left and latest.json names the last complete one.
        TrainConfigError: the step folder exists and is not pipeplan's (prepare refuses this before any start).
    """
    folder = step_dir(root, step)
    manifest = None
    failure = None
    if process == 0:
        try:
            manifest = _begin(root, step)
        except OutputError as exc:
            failure = _not_written(root, step, str(exc))
        except PipeplanError as exc:
            failure = exc
    _raise_first(exchange(_said(failure)), failure)
    written: dict[str, FileRecord] = {}
    try:
        _write_rank(folder, step, process, modules, optimizer, samples_seen, fingerprint, written)
    except OutputError as exc:
        failure = exc
    rows = {name: [record.bytes, record.sha256] for name, record in written.items()}  # FileRecord as JSON
    gathered = exchange([rows, _said(failure)])
    failed = next((said for _, said in gathered if said is not None), None)
    note = None
    if failed is None and process == 0:
        assert manifest is not None
        try:
            files = {k: FileRecord(int(size), str(sha)) for theirs, _ in gathered for k, (size, sha) in theirs.items()}
            note = _commit(root, step, manifest, files, keep_last)
        except OutputError as exc:
            failed = _said(exc)
    failed = next((said for said in exchange(failed) if said is not None), None)
    if failed is not None:
        _remove_unfinished(folder, written)
        exchange(None)  # every process has removed its files
        if process == 0:
            with contextlib.suppress(OSError):
                os.rmdir(folder)
        raise _not_written(root, step, failed[1])
    return note


def _not_written(root: Path, step: int, reason: str) -> OutputError:
    """The one error of a checkpoint that could not be written: which file, why, and that the last complete one stays."""
    return OutputError(f"checkpoint after step {step} not written: {reason}; {root / LATEST} still names the last complete one")


def _said(exc: BaseException | None) -> tuple[str, str] | None:
    """An error as it crosses processes: its kind and line."""
    return None if exc is None else (type(exc).__name__, str(exc).splitlines()[0])


def _raise_first(said: list[Any], own: BaseException | None) -> None:
    """Raise the first process's error (this process's own object when it is that one) on every process."""
    first = next((s for s in said if s is not None), None)
    if first is None:
        return
    if own is not None:
        raise own
    kind, line = first
    raise (OutputError if kind == "OutputError" else TrainConfigError)(line)


def _begin(root: Path, step: int) -> Manifest:
    """Process 0, before anyone writes: record the step folder as being written, and make it."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"--checkpoint-dir {str(root)!r} cannot be made: {records.write_reason(exc)}") from None
    manifest = read_manifest(root) or Manifest()
    folder = step_dir(root, step)
    if not manifest.recorded:
        raise TrainConfigError(
            f"{root / LATEST} records no files (written before checkpoint records); use an empty --checkpoint-dir"
        )
    if something_at(str(folder)) and not manifest.owns(step):
        raise TrainConfigError(foreign_folder(folder))
    manifest.writing = step
    records.write_manifest(root, manifest)
    try:
        folder.mkdir(exist_ok=True)
    except OSError as exc:
        raise OutputError(f"checkpoint folder {folder} cannot be made: {records.write_reason(exc)}") from None
    return manifest


def _write_rank(
    folder: Path,
    step: int,
    process: int,
    modules: dict[int, nn.Module],
    optimizer: torch.optim.Optimizer,
    samples_seen: int,
    fingerprint: dict[str, Any],
    written: dict[str, FileRecord],
) -> None:
    """Write this process's two files (the tensors, then the JSON), each whole or not at all; `written` gets each
    file's record as it lands."""
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
    buffer = io.BytesIO()
    torch.save(tensors, buffer)
    for name, data in (
        (tensors_name(process), buffer.getvalue()),
        (meta_name(process), (json.dumps(meta, sort_keys=True) + "\n").encode()),
    ):
        records.write_file(folder / name, data, f"checkpoint file {folder / name}")
        written[name] = file_record(data)


def _commit(root: Path, step: int, manifest: Manifest, files: dict[str, FileRecord], keep_last: int) -> str:
    """Process 0, once every process has written: record the checkpoint complete, then prune (--keep-last)."""
    manifest.checkpoints[step] = files
    manifest.step = step
    manifest.writing = None
    older = sorted(manifest.checkpoints)[:-keep_last] if keep_last > 0 else []
    dropped = {old: manifest.checkpoints.pop(old) for old in older}
    records.write_manifest(root, manifest)  # first: a stop before the deletions leaves files, never a record of none
    removed, kept = records.delete_recorded(root, dropped)
    note = f"wrote checkpoint {step_dir(root, step)}"
    if removed:
        note += f"; removed {len(removed)} older (--keep-last {keep_last})"
    if kept:
        shown = ", ".join(str(p) for p in kept[:3]) + (f" and {len(kept) - 3} more" if len(kept) > 3 else "")
        note += f"; kept {shown}: not written by pipeplan, or changed since"
    return note


def _remove_unfinished(folder: Path, written: dict[str, FileRecord]) -> None:
    """Remove this process's files of an unfinished checkpoint (those still as it wrote them)."""
    for name, record in written.items():
        if records.unchanged(folder / name, record):
            with contextlib.suppress(OSError):
                (folder / name).unlink()


def load_rank(
    root: Path,
    process: int,
    modules: dict[int, nn.Module],
    optimizer: torch.optim.Optimizer,
    fingerprint: dict[str, Any],
) -> Resumed | None:
    """Restore this process's stages, optimizer and RNG from the last complete checkpoint; None if there is none.

    The files are read as recorded and checked as `prepare` checks them; the JSON's fingerprint must be this
    job's before the tensors are read, and the tensors must fit this process's stages and optimizer.

    Raises:
        TrainConfigError: a missing, altered, malformed or hostile file, or a checkpoint taken by a different job (plan,
            schedule, model, world size), naming the file and the field.
    """
    manifest = read_manifest(root)
    if manifest is None or manifest.step is None:
        return None
    if not manifest.recorded:
        raise TrainConfigError(f"checkpoint index {root / LATEST} records no files; start again in an empty --checkpoint-dir")
    step = manifest.step
    path = rank_file(root, step, process)
    meta, state = read_rank(root, manifest, step, process, fingerprint)
    check_against(path, state, modules, optimizer)
    for s, module in modules.items():
        module.load_state_dict(state["stages"][s])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"]["torch"])
    version, internal, gauss = meta["python_rng"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state["rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    return Resumed(step, path)
