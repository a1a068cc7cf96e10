"""Before any process of a job starts: the checkpoint folder checked (writable, nothing in the way that pipeplan did
not record) and, with --resume, every file, field and tensor of the checkpoint to load (runtime.state.checkpoint_read),
against the stages each process will build when the launcher knows them."""

from __future__ import annotations

import contextlib
import os
import re
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeplan.io.files import kind_of, os_reason, something_at
from pipeplan.runtime.rank_errors import TrainConfigError
from pipeplan.runtime.state.checkpoint_read import meta_name, read_rank, tensors_name
from pipeplan.runtime.state.checkpoint_state import check_against
from pipeplan.runtime.state.manifest import LATEST, Manifest, read_manifest, step_dir

_STALE = re.compile(r"\.rank-\d+\.(pt|json)\.\w+\.tmp")
"""The temporary names checkpoint files are written under (manifest.write_file); only these are ever removed as stale."""
Expect = Callable[[], tuple[dict[str, Any], dict[int, tuple[dict[int, nn.Module], torch.optim.Optimizer]]]]
"""What the job will load into: its whole fingerprint, and each process's stages and optimizer (resume_check)."""


def foreign_folder(folder: Path) -> str:
    """The refusal of a step folder a run would write into that the record does not own."""
    return (
        f"checkpoint folder {folder} exists, but {folder.parent / LATEST} does not record it: pipeplan did not write "
        "it, and would write into it; move it out of the --checkpoint-dir"
    )


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
            raise TrainConfigError(foreign_folder(folder))
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
