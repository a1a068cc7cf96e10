"""A checkpoint folder's own record (`latest.json`): the last complete step, and every file pipeplan wrote there.

Layout of the record (format `pipeplan.checkpoint/2`, as the rank files):

    {"format": ..., "step": 10 | null, "writing": 12 | null,
     "checkpoints": {"10": {"rank-0.pt": {"bytes": N, "sha256": "..."}, "rank-0.json": {...}, ...}, ...}}

`step` names the last complete checkpoint; `checkpoints` lists, per step folder pipeplan made, the files it
wrote there with their sizes and SHA-256; `writing` names the step folder a checkpoint is being written into
(declared before any process writes there, so a run stopped half-way is known to have made it).

Note:
    The record is what makes deleting safe. `--keep-last` removes only files the record lists, and only while
    each still has the size and hash pipeplan wrote (a file changed since is the user's now, and is kept and
    named); a step folder goes only once it is empty. A folder without a record (no `latest.json`, or one from
    before records) is refused by `--resume`, as it is without: nothing in it is known to be pipeplan's. The
    record itself is written to a fresh temporary name and renamed, so it always names a complete checkpoint.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from pipeplan.core.errors import OutputError
from pipeplan.io.atomic import current_umask
from pipeplan.io.files import read_input_text, something_at
from pipeplan.io.json_parse import parse_json
from pipeplan.runtime.rank_errors import TrainConfigError

FORMAT = "pipeplan.checkpoint/2"
OLD_FORMATS = ("pipeplan.checkpoint/1", FORMAT)
LATEST = "latest.json"
_SHA256 = re.compile(r"[0-9a-f]{64}")
_FILE_NAME = re.compile(r"rank-\d{1,6}\.(pt|json)")
_MOST_STEPS = 10**9
"""A step number in a record above this is not one pipeplan wrote (core.limits bounds --steps far below)."""


@dataclass(frozen=True, slots=True)
class FileRecord:
    """One file pipeplan wrote: its size and SHA-256."""

    bytes: int
    sha256: str


@dataclass
class Manifest:
    """A checkpoint folder's record (see the module's docstring); `recorded` is False for an index written before
    records (a step and no files)."""

    step: int | None = None
    checkpoints: dict[int, dict[str, FileRecord]] = field(default_factory=dict)
    writing: int | None = None
    recorded: bool = True

    def owns(self, step: int) -> bool:
        """Whether the folder of `step` is one pipeplan made (recorded, or declared as being written)."""
        return step in self.checkpoints or step == self.writing


def step_dir(root: Path, step: int) -> Path:
    """The directory of the checkpoint taken after `step` iterations."""
    return root / f"step-{step:06d}"


def file_record(data: bytes) -> FileRecord:
    """The record of bytes as written."""
    return FileRecord(len(data), hashlib.sha256(data).hexdigest())


def read_manifest(root: Path) -> Manifest | None:
    """The folder's record, checked field by field; None when there is no latest.json.

    Raises:
        TrainConfigError: latest.json cannot be read (what stands there, its size) or a field is malformed (naming it).
    """
    path = root / LATEST
    if not something_at(str(path)):
        return None
    index = parse_json(read_input_text(path, "checkpoint index", TrainConfigError, links=False), str(path), TrainConfigError)
    if not isinstance(index, dict) or "step" not in index:
        raise TrainConfigError(f"checkpoint index {path} is malformed: expected an object with 'step'")
    if index.get("format", OLD_FORMATS[0]) not in OLD_FORMATS:
        raise TrainConfigError(f"checkpoint index {path} has format {index.get('format')!r}, expected {FORMAT!r}")
    unknown = sorted(set(index) - {"format", "step", "writing", "checkpoints"})
    if unknown:
        raise TrainConfigError(f"checkpoint index {path} has unknown field {unknown[0]!r}")
    step = index["step"]
    if step is not None:
        step = _step_number(path, "step", step)
    writing = index.get("writing")
    if writing is not None:
        writing = _step_number(path, "writing", writing)
    if "checkpoints" not in index:
        return Manifest(step, {}, writing, recorded=False)
    found = index["checkpoints"]
    if not isinstance(found, dict):
        raise TrainConfigError(f"checkpoint index {path}: field 'checkpoints' must be an object, got {type(found).__name__}")
    checkpoints = {}
    for key, files in found.items():
        number = _step_number(path, f"checkpoints key {key!r}", int(key) if key.isdigit() and len(key) < 12 else key)
        checkpoints[number] = _files(path, f"checkpoints.{key}", files)
    if step is not None and step not in checkpoints:
        raise TrainConfigError(f"checkpoint index {path} names step {step}, but records no files for it (field 'checkpoints')")
    return Manifest(step, checkpoints, writing)


def _step_number(path: Path, name: str, value: object) -> int:
    """A step number of the record: an integer from 0 to _MOST_STEPS."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MOST_STEPS:
        raise TrainConfigError(
            f"checkpoint index {path} has {name} {str(value)[:40]!r}, expected an integer from 0 to {_MOST_STEPS}"
        )
    return value


def _files(path: Path, where: str, files: object) -> dict[str, FileRecord]:
    """A step's files in the record: `rank-N.pt`/`rank-N.json` names, each with a size and a SHA-256."""
    if not isinstance(files, dict):
        raise TrainConfigError(f"checkpoint index {path}: field {where!r} must be an object of files")
    records = {}
    for name, record in files.items():
        if not _FILE_NAME.fullmatch(name):
            raise TrainConfigError(
                f"checkpoint index {path}: field {where!r} names {name[:40]!r}, not a rank file pipeplan writes"
            )
        if not (isinstance(record, dict) and set(record) == {"bytes", "sha256"}):
            raise TrainConfigError(f"checkpoint index {path}: field '{where}.{name}' must be {{bytes, sha256}}")
        size, digest = record["bytes"], record["sha256"]
        if (
            isinstance(size, bool)
            or not isinstance(size, int)
            or size < 0
            or not isinstance(digest, str)
            or not _SHA256.fullmatch(digest)
        ):
            raise TrainConfigError(
                f"checkpoint index {path}: field '{where}.{name}' holds {str(record)[:80]}, not a size and a SHA-256"
            )
        records[name] = FileRecord(size, digest)
    return records


def write_manifest(root: Path, manifest: Manifest) -> None:
    """Write the record whole or not at all (a fresh temporary name in root, then a rename).

    Raises:
        OutputError: it cannot be written (naming latest.json and the reason: "no space left on device", ...);
            the record before stays in place.
    """
    body = {
        "format": FORMAT,
        "step": manifest.step,
        "writing": manifest.writing,
        "checkpoints": {
            str(step): {name: {"bytes": r.bytes, "sha256": r.sha256} for name, r in sorted(files.items())}
            for step, files in sorted(manifest.checkpoints.items())
        },
    }
    data = (json.dumps(body, sort_keys=True) + "\n").encode()
    write_file(root / LATEST, data, f"checkpoint index {root / LATEST}")


def write_file(path: Path, data: bytes, what: str) -> None:
    """Write data to a fresh temporary file beside path, flush it to disk, rename it over path; on failure remove the
    temporary file and raise OutputError naming `what` and the reason (`no space left on device`)."""
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        try:
            os.fchmod(fd, 0o666 & ~current_umask())  # as open() would make it, not mkstemp's 0600
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise OutputError(f"{what} not written: {write_reason(exc)}") from None


def write_reason(exc: OSError) -> str:
    """Why a write failed, in words a user acts on: "no space left on device (free some, or ...)", else the OS's."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "no space left on device (free some, or choose another --checkpoint-dir)"
    return (exc.strerror or str(exc)).lower()


def delete_recorded(root: Path, checkpoints: dict[int, dict[str, FileRecord]]) -> tuple[list[Path], list[Path]]:
    """Delete the files of `checkpoints` (dropped from the record, which the caller has written) that are still as
    pipeplan wrote them (same size and SHA-256; never a link); a step folder goes once it is empty.

    Returns the folders removed and the paths kept in the others (a file changed since, or one pipeplan did not
    write).
    """
    removed: list[Path] = []
    kept: list[Path] = []
    for step, files in sorted(checkpoints.items()):
        folder = step_dir(root, step)
        if not _real_folder(folder):
            continue
        for name, record in sorted(files.items()):
            if unchanged(folder / name, record):
                with contextlib.suppress(FileNotFoundError):
                    (folder / name).unlink()
        try:
            os.rmdir(folder)
        except OSError:
            with contextlib.suppress(OSError):
                kept += sorted(folder.iterdir())
            continue
        removed.append(folder)
    return removed, kept


def _real_folder(path: Path) -> bool:
    """A folder itself, not a link to one (a link's target is not this folder's to delete from)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def unchanged(path: Path, record: FileRecord) -> bool:
    """Whether path is a regular file (not a link, never opened if it is something else) with the recorded size and
    SHA-256."""
    try:
        fd = os.open(
            path,
            os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0),
        )
    except OSError:
        return False
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size != record.bytes:
            return False
        digest = hashlib.sha256()
        while chunk := os.read(fd, 1 << 20):
            digest.update(chunk)
    except OSError:
        return False
    finally:
        os.close(fd)
    return digest.hexdigest() == record.sha256
