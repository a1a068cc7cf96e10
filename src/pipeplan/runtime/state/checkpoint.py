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
import re
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeplan.core.errors import OutputError, PipeplanError
from pipeplan.io.files import kind_of, os_reason, something_at
from pipeplan.runtime.errors import TrainConfigError
from pipeplan.runtime.state import manifest as records
from pipeplan.runtime.state.checkpoint_read import check_against, meta_name, read_rank, tensors_name
from pipeplan.runtime.state.manifest import LATEST, FileRecord, Manifest, file_record, read_manifest, step_dir

CHECKPOINT_FORMAT = records.FORMAT
"""Of a rank's JSON and of latest.json (format 1 was one pickle per rank, which only an unsafe load could read)."""
_STALE = re.compile(r"\.rank-\d+\.(pt|json)\.\w+\.tmp")
"""The temporary names `take` writes rank files under (manifest.write_file); only these are ever removed as stale."""
Expect = Callable[[], tuple[dict[str, Any], dict[int, tuple[dict[int, nn.Module], torch.optim.Optimizer]]]]
"""What the job will load into: its whole fingerprint, and each process's stages and optimizer (resume_check)."""
Exchange = Callable[[Any], list[Any]]
"""Give every process's value to every process (torch.distributed's all_gather_object, or a stand-in in tests)."""

__all__ = ["CHECKPOINT_FORMAT", "LATEST", "Resumed", "load_rank", "prepare", "rank_file", "step_dir", "take"]


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
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


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
    gathered = exchange((written, _said(failure)))
    failed = next((said for _, said in gathered if said is not None), None)
    note = None
    if failed is None and process == 0:
        assert manifest is not None
        try:
            note = _commit(root, step, manifest, {k: v for files, _ in gathered for k, v in files.items()}, keep_last)
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
        raise TrainConfigError(_foreign_folder(folder))
    manifest.writing = step
    records.write_manifest(root, manifest)
    try:
        folder.mkdir(exist_ok=True)
    except OSError as exc:
        raise OutputError(f"checkpoint folder {folder} cannot be made: {records.write_reason(exc)}") from None
    return manifest


def _foreign_folder(folder: Path) -> str:
    return (
        f"checkpoint folder {folder} exists, but {folder.parent / LATEST} does not record it: pipeplan did not write "
        "it, and would write into it; move it out of the --checkpoint-dir"
    )


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


def step_dirs(root: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every `step-NNNNNN` entry in root (a folder, or whatever stands at such a name), oldest first."""
    found = []
    for path in root.glob("step-*") if root.is_dir() else ():
        digits = path.name.removeprefix("step-")
        if digits.isdigit() and len(digits) < 12:
            found.append((int(digits), path))
    return sorted(found)


def check_writable(root: Path) -> None:
    """That folders can be made in `root` (or, while it is absent, beside it) on a real, writable filesystem: a
    uniquely named folder is made and removed there, so nothing is left and processes checking at once do not meet.

    Raises:
        TrainConfigError: naming the folder and the reason (`/proc/ck`: a folder cannot be made there).
    """
    where = root if root.is_dir() else root.parent
    try:
        probe = tempfile.mkdtemp(prefix=".pipeplan-probe-", dir=where)
    except OSError as exc:
        said = "in it" if where == root else "there"
        raise TrainConfigError(
            f"--checkpoint-dir {str(root)!r} cannot be written: a folder cannot be made {said} "
            f"({exc.strerror or os_reason(exc, str(where))}); choose a folder on a writable disk"
        ) from None
    os.rmdir(probe)


def prepare(
    root: Path,
    resume: bool,
    writes: bool,
    steps: int,
    every: int = 0,
    job: dict[str, Any] | None = None,
    expect: Expect | None = None,
) -> tuple[str | None, bool]:
    """Check a checkpoint folder before any process starts; return a note for the user (or None) and whether the run is
    already finished.

    Resuming from a folder with no checkpoint starts at step 1 (a job restarted by torchrun resumes the same way
    whether or not it got as far as a checkpoint); resuming a run that already reached `steps` has nothing left to
    run. With `every`, the step folders this run will write must be absent or pipeplan's; `job` holds the
    fingerprint fields the launcher knows, which the checkpoint must match; `expect`, called only when there is a
    checkpoint to resume, gives the job's whole fingerprint and each process's stages and optimizer, which every
    rank's tensors must fit (names, shapes, dtypes, parameters).

    Raises:
        TrainConfigError: the folder is not a folder or cannot be written; it holds checkpoints and neither --resume
            was given nor writing is off; with --resume, it holds step folders but no record, latest.json names a step
            whose folder does not exist, or a file of the checkpoint is missing, not as recorded, malformed or out of
            range (naming the file and the field: `verify`).
    """
    if something_at(str(root)) and not root.is_dir():
        try:
            kind = kind_of(os.stat(root).st_mode) or "a file"
        except OSError as exc:  # a symlink loop, a broken symlink, no permission: said as it is
            raise TrainConfigError(f"--checkpoint-dir {str(root)!r}: {os_reason(exc, str(root))}") from None
        raise TrainConfigError(f"--checkpoint-dir {str(root)!r} is {kind}, not a folder")
    if writes:
        check_writable(root)
    manifest = read_manifest(root) if root.is_dir() else None
    step = manifest.step if manifest is not None else None
    existing = step_dirs(root)
    if not resume:
        if writes and (step is not None or existing):
            at = f"step {step}" if step is not None else f"{len(existing)} step folder(s)"
            raise TrainConfigError(
                f"--checkpoint-dir {str(root)!r} already holds checkpoints ({at}); add --resume to continue that run, "
                "or choose an empty folder"
            )
        return None, False
    if manifest is None and existing:
        more = f" (and {len(existing) - 1} more)" if len(existing) > 1 else ""
        raise TrainConfigError(
            f"--resume: {existing[0][1]}{more} has no record in {root / LATEST}, which pipeplan writes with every checkpoint: "
            "it is not pipeplan's, and would be overwritten or deleted; move it out of the --checkpoint-dir, or choose another"
        )
    if step is not None and not step_dir(root, step).is_dir():
        raise TrainConfigError(
            f"checkpoint index {root / LATEST} names step {step}, but {step_dir(root, step)} does not exist: the "
            f"checkpoint is gone; restore that folder, or remove {LATEST} to start over"
        )
    if step is not None and step >= steps:
        return f"--resume: the checkpoint in {str(root)!r} is at step {step}, and --steps is {steps}: nothing left to run", True
    if manifest is not None and not manifest.recorded:
        raise TrainConfigError(
            f"checkpoint index {root / LATEST} records no files (it was written before checkpoint records, or not by "
            f"pipeplan), so nothing in {str(root)!r} is known to be pipeplan's; start again in an empty --checkpoint-dir"
        )
    for number, folder in existing if writes and every > 0 else ():
        if (step or 0) < number <= steps and number % every == 0 and not (manifest and manifest.owns(number)):
            raise TrainConfigError(_foreign_folder(folder))
    if manifest is not None and step is not None:
        verify(root, manifest, step, job, expect)  # what the processes will load, checked here, before any starts
    if manifest is not None and manifest.writing is not None:
        _remove_stale(step_dir(root, manifest.writing))
    if step is None:
        return f"--resume: no checkpoint in {str(root)!r} yet; starting at step 1", False
    return f"--resume: continuing from step {step} of {steps} ({step_dir(root, step)})", False


def _remove_stale(folder: Path) -> None:
    """Remove the temporary files a killed write left in the folder the record says was being written."""
    with contextlib.suppress(OSError):
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            return
        for path in folder.iterdir():
            if _STALE.fullmatch(path.name) and stat.S_ISREG(os.lstat(path).st_mode):
                path.unlink(missing_ok=True)


def verify(root: Path, manifest: Manifest, step: int, job: dict[str, Any] | None = None, expect: Expect | None = None) -> None:
    """Check every rank's files of the checkpoint after `step` before any process starts: each read as recorded, each
    field and tensor checked, every rank of its world size there, the job's fields matched (`job`, or the whole
    fingerprint `expect` gives), and with `expect` each rank's tensors against the stages that process will build.

    Raises:
        TrainConfigError: naming the file and the field.
    """
    folder = step_dir(root, step)
    if not stat.S_ISDIR(os.lstat(folder).st_mode):
        raise TrainConfigError(f"checkpoint folder {folder} is a symbolic link, not a folder pipeplan made")
    targets = None
    if expect is not None:
        job, targets = expect()
    meta, state = read_rank(root, manifest, step, 0, job)
    world = meta["fingerprint"]["world_size"]
    names = {n for r in range(world) for n in (tensors_name(r), meta_name(r))}
    extra = sorted(set(manifest.checkpoints[step]) - names)
    if extra:
        raise TrainConfigError(
            f"checkpoint index {root / LATEST} records {folder / extra[0]}, which no rank of world size {world} writes"
        )
    for process in range(world):
        if process:
            _, state = read_rank(root, manifest, step, process, job)
        if targets is not None and process in targets:
            check_against(folder / tensors_name(process), state, *targets[process])


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
