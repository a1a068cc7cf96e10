"""Reading a rank's checkpoint files back: every file through io.files' one bounded reader, every field checked.

A rank's files are `rank-N.json` (format, step, samples seen, the job's fingerprint, Python's RNG) and
`rank-N.pt` (stage tensors, optimizer state, torch's RNG). Both are read only as the plain files the
folder's record (manifest) lists: no link is followed, a FIFO or device is refused before it is opened, no
more bytes are read than the record says, and the bytes must have the recorded SHA-256. Then every field
is checked (types, ranges, the step, samples seen = step x global batch, RNG states' type and size) and
every tensor (a strided CPU tensor, finite, floating ones of the job's dtype, optimizer state shaped as its
parameter: checkpoint_state), so a damaged or crafted checkpoint is refused before any process starts, naming
the file and the field.

Note:
    The .pt is read with `torch.load(weights_only=True)`, whose unpickler builds tensors and plain containers
    only and refuses any other object before it is made, so a crafted file cannot run anything, even one
    whose record was rewritten to match it.
"""

from __future__ import annotations

import io
import math
import pickle
import random
import re
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch

from pipeplan.core.limits import Limit
from pipeplan.io.files import read_input_bytes
from pipeplan.io.json_parse import parse_json
from pipeplan.runtime.rank_errors import TrainConfigError
from pipeplan.runtime.state.checkpoint_state import DTYPES, check_state, short, whole
from pipeplan.runtime.state.manifest import FORMAT, LATEST, FileRecord, Manifest, file_record, step_dir

META_KEYS = ("format", "step", "samples_seen", "fingerprint", "python_rng")
STATE_KEYS = ("stages", "optimizer", "rng")
_REFUSALS = tuple(
    re.compile(pattern, re.IGNORECASE)
    for pattern in (r"(unsupported global: GLOBAL [\w.]+)", r"(unsupported GLOBAL [\w.]+)", r"(Unsupported operand \d+)",
                    r"WeightsUnpickler error: ([^\n]+)")
)  # fmt: skip
"""The reason in torch's weights-only refusal across its wordings, the most telling first."""
_MT_WORDS = 625
"""Python's Mersenne Twister state: 624 words and the position."""


def tensors_name(process: int) -> str:
    """The name of process `process`'s tensors in a step folder."""
    return f"rank-{process}.pt"


def meta_name(process: int) -> str:
    """The name of process `process`'s JSON in a step folder."""
    return f"rank-{process}.json"


def read_recorded(folder: Path, name: str, files: dict[str, FileRecord], index: Path) -> bytes:
    """The bytes of `folder/name`, read as the record lists it (a regular file, no link, its recorded size and SHA-256).

    Raises:
        TrainConfigError: the record does not list it, or what stands there is not that file (naming it and why).
    """
    path = folder / name
    record = files.get(name)
    if record is None:
        raise TrainConfigError(
            f"checkpoint file {path} is not recorded in {index}: pipeplan did not write it there (a rank's file is "
            "missing from the checkpoint); restore the folder, or start again in an empty --checkpoint-dir"
        )
    limit = Limit(record.bytes, "bytes", f"{index} records this file at {record.bytes:,} bytes")
    data = read_input_bytes(path, "checkpoint file", TrainConfigError, limit, links=False)
    if file_record(data) != record:
        said = "is shorter than" if len(data) < record.bytes else "has other contents than"
        raise TrainConfigError(
            f"checkpoint file {path} {said} pipeplan wrote ({len(data):,} bytes, SHA-256 {file_record(data).sha256[:12]}..., "
            f"{index} records {record.bytes:,} bytes, {record.sha256[:12]}...): it was truncated or changed; restore it, "
            "or start again in an empty --checkpoint-dir"
        )
    return data


def read_rank(
    root: Path, manifest: Manifest, step: int, process: int, job: dict[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Process `process`'s JSON and tensors of the checkpoint after `step`, both read and checked; the JSON's
    fingerprint must agree with every field of `job` given (None: no job to compare with), before the tensors are
    read.

    Raises:
        TrainConfigError: a file missing, not as recorded, malformed or out of range (naming the file and field),
            or a checkpoint of another job.
    """
    folder = step_dir(root, step)
    files = manifest.checkpoints.get(step, {})
    index = root / LATEST
    meta = check_meta(folder / meta_name(process), read_recorded(folder, meta_name(process), files, index), step)
    if job is not None:
        _same_job(folder / meta_name(process), meta["fingerprint"], job)
    path = folder / tensors_name(process)
    state = load_tensors(path, read_recorded(folder, tensors_name(process), files, index))
    check_state(path, state, meta["fingerprint"])
    return meta, state


def check_meta(path: Path, data: bytes, step: int) -> dict[str, Any]:
    """A rank's JSON, every field checked: format, step, samples seen, fingerprint, Python's RNG state."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise TrainConfigError(f"{path}: cannot read checkpoint: not a UTF-8 text file") from None
    meta = parse_json(text, str(path), TrainConfigError)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise TrainConfigError(f"{path} is not a pipeplan checkpoint (format {found!r}, expected {FORMAT!r})")
    missing = [key for key in META_KEYS if key not in meta]
    if missing:
        raise TrainConfigError(f"{path} is missing field {missing[0]!r}")
    unknown = sorted(set(meta) - set(META_KEYS))
    if unknown:
        raise TrainConfigError(f"{path} has unknown field {unknown[0]!r}")
    if meta["step"] != step or not whole(meta["step"]):
        raise TrainConfigError(f"{path}: field 'step' is {short(meta['step'])}, but the file lies in the folder of step {step}")
    fingerprint = meta["fingerprint"]
    if not isinstance(fingerprint, dict):
        raise TrainConfigError(f"{path}: field 'fingerprint' must be an object, got {short(fingerprint)}")
    for key in ("world_size", "global_batch"):
        if not whole(fingerprint.get(key)) or fingerprint[key] < 1:
            raise TrainConfigError(
                f"{path}: field 'fingerprint.{key}' must be an integer >= 1, got {short(fingerprint.get(key))}"
            )
    if fingerprint.get("dtype", "float32") not in DTYPES:
        raise TrainConfigError(f"{path}: field 'fingerprint.dtype' must be float32 or float64, got {short(fingerprint['dtype'])}")
    seen, expected = meta["samples_seen"], step * fingerprint["global_batch"]
    if not whole(seen) or seen != expected:
        raise TrainConfigError(
            f"{path}: field 'samples_seen' is {short(seen)}, but {step} steps of global batch "
            f"{fingerprint['global_batch']} saw {expected}"
        )
    _check_python_rng(path, meta["python_rng"])
    return meta


def _check_python_rng(path: Path, rng: object) -> None:
    """[3, [624 words < 2^32 and a position <= 624], gauss (null or a finite number)], as random.getstate gives it."""
    bad = f"{path}: field 'python_rng' must be Python's random state [3, [625 integers], null or a number], got {short(rng)}"
    if not (isinstance(rng, list) and len(rng) == 3 and rng[0] == 3 and whole(rng[0]) and isinstance(rng[1], list)):
        raise TrainConfigError(bad)
    words, gauss = rng[1], rng[2]
    if len(words) != _MT_WORDS or not all(whole(w) and 0 <= w < 2**32 for w in words) or not 0 <= words[-1] <= 624:
        raise TrainConfigError(bad)
    if gauss is not None and (isinstance(gauss, bool) or not isinstance(gauss, (int, float)) or not math.isfinite(gauss)):
        raise TrainConfigError(bad)
    try:
        random.Random().setstate((3, tuple(words), gauss))
    except (TypeError, ValueError, OverflowError):
        raise TrainConfigError(bad) from None


def _same_job(path: Path, theirs: dict[str, Any], ours: dict[str, Any]) -> None:
    """Every field of `ours` (as JSON holds it) equals the checkpoint's, else 'belongs to another job (field: a != b)'."""
    ours = _as_json(ours)
    diff = sorted(k for k in ours if ours[k] != theirs.get(k))
    if diff:
        detail = ", ".join(f"{k}: {str(theirs.get(k))[:60]} != {str(ours.get(k))[:60]}" for k in diff)
        raise TrainConfigError(f"checkpoint {path} belongs to another job ({detail})")


def _as_json(value: dict[str, Any]) -> dict[str, Any]:
    """A dict as a JSON round trip gives it back (tuples become lists)."""
    import json

    return dict(json.loads(json.dumps(value)))


def load_tensors(path: Path, data: bytes) -> dict[str, Any]:
    """A rank's .pt read as data only (weights_only: tensors and plain containers; any other object is refused before
    it is built, so nothing in the file runs)."""
    if not zipfile.is_zipfile(io.BytesIO(data)):  # torch.save writes a zip archive; anything else is not ours
        raise TrainConfigError(
            f"checkpoint file {path} cannot be read as data, refused: not a zip archive of tensors as torch.save writes"
        )
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols; the error below is the message
            warnings.simplefilter("ignore")
            state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many kinds for a truncated, foreign or hostile file
        if isinstance(exc, pickle.UnpicklingError) and "weights only" in str(exc).lower():
            raise TrainConfigError(
                f"checkpoint file {path} cannot be read as data, refused: {_unpickler_reason(str(exc))} (a checkpoint "
                "holds only tensors and plain values; loading any other object could run code)"
            ) from None
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise TrainConfigError(f"checkpoint file {path} cannot be read ({type(exc).__name__}: {first[:120]})") from None
    if not isinstance(state, dict) or set(state) != set(STATE_KEYS):
        found = sorted(map(str, state)) if isinstance(state, dict) else type(state).__name__
        raise TrainConfigError(
            f"checkpoint file {path} is not a pipeplan checkpoint (holds {found}, expected stages, optimizer, rng)"
        )
    return state


def _unpickler_reason(message: str) -> str:
    """What torch's weights-only unpickler refused (`unsupported GLOBAL posix.system`), without its advice to load the
    file unsafely."""
    found = next((match for pattern in _REFUSALS if (match := pattern.search(message))), None)
    return found.group(1).strip()[:120] if found else "not tensors and plain values"
