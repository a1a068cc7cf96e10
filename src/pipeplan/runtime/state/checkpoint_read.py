"""Reading a rank's checkpoint files back: every file through io.files' one bounded reader, every field checked.

A rank's files are `rank-N.json` (format, step, samples seen, the job's fingerprint, Python's RNG) and
`rank-N.pt` (stage tensors, optimizer state, torch's RNG). Both are read only as the plain files the
folder's record (manifest) lists: no link is followed, a FIFO or device is refused before it is opened, no
more bytes are read than the record says, and the bytes must have the recorded SHA-256. Then every field
is checked (types, ranges, the step, samples seen = step x global batch, RNG states' type and size) and
every tensor (a strided CPU tensor, finite, floating ones of the job's dtype, optimizer state shaped as its
parameter), so a damaged or crafted checkpoint is refused before any process starts, naming the file and
the field.

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
from torch import nn

from pipeplan.core.limits import Limit
from pipeplan.io.files import read_input_bytes
from pipeplan.io.json_parse import parse_json
from pipeplan.runtime.errors import TrainConfigError
from pipeplan.runtime.state.manifest import FORMAT, LATEST, FileRecord, Manifest, file_record, step_dir

META_KEYS = ("format", "step", "samples_seen", "fingerprint", "python_rng")
STATE_KEYS = ("stages", "optimizer", "rng")
DTYPES = {"float32": torch.float32, "float64": torch.float64}
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
    if meta["step"] != step or not _whole(meta["step"]):
        raise TrainConfigError(f"{path}: field 'step' is {_short(meta['step'])}, but the file lies in the folder of step {step}")
    fingerprint = meta["fingerprint"]
    if not isinstance(fingerprint, dict):
        raise TrainConfigError(f"{path}: field 'fingerprint' must be an object, got {_short(fingerprint)}")
    for key in ("world_size", "global_batch"):
        if not _whole(fingerprint.get(key)) or fingerprint[key] < 1:
            raise TrainConfigError(
                f"{path}: field 'fingerprint.{key}' must be an integer >= 1, got {_short(fingerprint.get(key))}"
            )
    if fingerprint.get("dtype", "float32") not in DTYPES:
        raise TrainConfigError(
            f"{path}: field 'fingerprint.dtype' must be float32 or float64, got {_short(fingerprint['dtype'])}"
        )
    seen, expected = meta["samples_seen"], step * fingerprint["global_batch"]
    if not _whole(seen) or seen != expected:
        raise TrainConfigError(
            f"{path}: field 'samples_seen' is {_short(seen)}, but {step} steps of global batch "
            f"{fingerprint['global_batch']} saw {expected}"
        )
    _check_python_rng(path, meta["python_rng"])
    return meta


def _check_python_rng(path: Path, rng: object) -> None:
    """[3, [624 words < 2^32 and a position <= 624], gauss (null or a finite number)], as random.getstate gives it."""
    bad = f"{path}: field 'python_rng' must be Python's random state [3, [625 integers], null or a number], got {_short(rng)}"
    if not (isinstance(rng, list) and len(rng) == 3 and rng[0] == 3 and _whole(rng[0]) and isinstance(rng[1], list)):
        raise TrainConfigError(bad)
    words, gauss = rng[1], rng[2]
    if len(words) != _MT_WORDS or not all(_whole(w) and 0 <= w < 2**32 for w in words) or not 0 <= words[-1] <= 624:
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


def check_state(path: Path, state: dict[str, Any], fingerprint: dict[str, Any]) -> None:
    """Every tensor and field of a rank's .pt: stages (stage index -> name -> tensor of the job's dtype, finite),
    optimizer (its groups' parameters, finite numbers, state shaped as its parameter), RNG (torch's byte state)."""
    dtype = DTYPES[fingerprint.get("dtype", "float32")]
    stages = state["stages"]
    count = len(fingerprint["stages"]) if isinstance(fingerprint.get("stages"), list) else None
    if not isinstance(stages, dict) or not stages:
        raise TrainConfigError(f"checkpoint file {path}: field 'stages' must map stage indexes to weights, got {_short(stages)}")
    weights: list[torch.Tensor] = []
    for s in sorted(stages, key=str):
        if not _whole(s) or s < 0 or (count is not None and s >= count):
            raise TrainConfigError(
                f"checkpoint file {path}: field 'stages' has stage {_short(s)}, the job has stages 0..{(count or 1) - 1}"
            )
        tensors = stages[s]
        if not isinstance(tensors, dict):
            raise TrainConfigError(f"checkpoint file {path}: field 'stages.{s}' must map names to tensors, got {_short(tensors)}")
        for name, tensor in tensors.items():
            _check_tensor(path, f"stages.{s}.{name}", tensor, dtype)
            weights.append(tensor)
    _check_optimizer(path, state["optimizer"], weights)
    _check_rng(path, state["rng"])


def _check_tensor(path: Path, where: str, tensor: object, dtype: torch.dtype | None) -> torch.Tensor:
    """A dense CPU tensor whose values are finite (and, with `dtype`, a floating one of that dtype)."""
    if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.strided:
        raise TrainConfigError(f"checkpoint file {path}: field '{where}' must be a tensor, got {_short(tensor)}")
    if tensor.is_complex() or (dtype is not None and tensor.is_floating_point() and tensor.dtype != dtype):
        raise TrainConfigError(f"checkpoint file {path}: field '{where}' has dtype {tensor.dtype}, the job's is {dtype}")
    if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
        bad = int((~torch.isfinite(tensor)).sum())
        raise TrainConfigError(
            f"checkpoint file {path}: field '{where}' holds {bad} value(s) that are NaN or infinite; training from it "
            "would go on with NaN; resume from an earlier checkpoint, or start again"
        )
    return tensor


def _check_optimizer(path: Path, optimizer: object, weights: list[torch.Tensor]) -> None:
    """torch's optimizer state_dict: groups whose parameters are 0..P-1 once each, finite settings, and per parameter
    a state of finite numbers whose non-scalar tensors have the parameter's shape (matched in order when every stage
    tensor is a parameter)."""
    if not isinstance(optimizer, dict) or set(optimizer) != {"state", "param_groups"}:
        raise TrainConfigError(
            f"checkpoint file {path}: field 'optimizer' must hold state and param_groups, got {_short(optimizer)}"
        )
    groups, per_param = optimizer["param_groups"], optimizer["state"]
    if not isinstance(groups, list) or not all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups):
        raise TrainConfigError(f"checkpoint file {path}: field 'optimizer.param_groups' must be a list of groups with params")
    params = [p for g in groups for p in g["params"]]
    if sorted(params, key=str) != list(range(len(params))):
        raise TrainConfigError(
            f"checkpoint file {path}: field 'optimizer.param_groups' names parameters {_short(params)}, expected "
            f"0..{len(params) - 1} once each"
        )
    for i, group in enumerate(groups):
        for key, value in group.items():
            if key != "params":
                _check_plain(path, f"optimizer.param_groups.{i}.{key}", value)
    if not isinstance(per_param, dict) or not all(_whole(k) and 0 <= k < len(params) for k in per_param):
        raise TrainConfigError(
            f"checkpoint file {path}: field 'optimizer.state' must map parameters 0..{len(params) - 1} to their state"
        )
    shapes = [w.shape for w in weights] if len(weights) == len(params) else None
    for p, entries in per_param.items():
        if not isinstance(entries, dict):
            raise TrainConfigError(
                f"checkpoint file {path}: field 'optimizer.state.{p}' must be an object, got {_short(entries)}"
            )
        for key, value in entries.items():
            where = f"optimizer.state.{p}.{key}"
            if isinstance(value, torch.Tensor):
                _check_tensor(path, where, value, None)
                if value.dim() > 0 and shapes is not None and value.shape != shapes[p]:
                    raise TrainConfigError(
                        f"checkpoint file {path}: field '{where}' has shape {list(value.shape)}, its parameter's is "
                        f"{list(shapes[p])}"
                    )
            else:
                _check_plain(path, where, value)


def _check_plain(path: Path, where: str, value: object) -> None:
    """A setting: None, a bool, a string, a finite number, or a list/tuple of them."""
    if isinstance(value, (list, tuple)):
        for item in value:
            _check_plain(path, where, item)
        return
    if isinstance(value, torch.Tensor):
        _check_tensor(path, where, value, None)
        return
    if value is None or isinstance(value, (bool, str)) or _whole(value):
        return
    if not isinstance(value, float) or not math.isfinite(value):
        raise TrainConfigError(f"checkpoint file {path}: field '{where}' must be a finite number or a flag, got {_short(value)}")


def _check_rng(path: Path, rng: object) -> None:
    """{"torch": torch's CPU generator state (uint8, its size), "cuda": optional list of such states}."""
    size = torch.get_rng_state().numel()
    if not isinstance(rng, dict) or "torch" not in rng or not set(rng) <= {"torch", "cuda"}:
        raise TrainConfigError(f"checkpoint file {path}: field 'rng' must hold torch (and cuda), got {_short(rng)}")
    states = [("rng.torch", rng["torch"])]
    if "cuda" in rng:
        if not isinstance(rng["cuda"], list):
            raise TrainConfigError(f"checkpoint file {path}: field 'rng.cuda' must be a list of generator states")
        states += [(f"rng.cuda.{i}", s) for i, s in enumerate(rng["cuda"])]
    for where, tensor in states:
        ok = isinstance(tensor, torch.Tensor) and tensor.layout == torch.strided and tensor.dtype == torch.uint8
        if not ok or tensor.dim() != 1 or (where == "rng.torch" and tensor.numel() != size):
            said = f"uint8 [{tensor.numel()}]" if isinstance(tensor, torch.Tensor) else _short(tensor)
            raise TrainConfigError(
                f"checkpoint file {path}: field '{where}' must be torch's generator state (uint8, {size} bytes), got {said}"
            )


def check_against(path: Path, state: dict[str, Any], modules: dict[int, nn.Module], optimizer: torch.optim.Optimizer) -> None:
    """The checked tensors against this process's stages and optimizer: the same stages, names, shapes and dtypes,
    and optimizer groups and state that fit its parameters.

    Raises:
        TrainConfigError: naming the file and the first field that differs, with both values.
    """
    if sorted(state["stages"]) != sorted(modules):
        raise TrainConfigError(f"checkpoint {path} holds stages {sorted(state['stages'])}, this rank runs {sorted(modules)}")
    for s, module in modules.items():
        theirs, ours = state["stages"][s], module.state_dict()
        for name in sorted(set(theirs) ^ set(ours)):
            said = "holds" if name in theirs else "lacks"
            raise TrainConfigError(
                f"checkpoint file {path}: field 'stages.{s}' {said} {name!r}, which the model's stage "
                f"{'lacks' if name in theirs else 'has'}"
            )
        for name, tensor in ours.items():
            other = theirs[name]
            if other.shape != tensor.shape or other.dtype != tensor.dtype:
                raise TrainConfigError(
                    f"checkpoint file {path}: field 'stages.{s}.{name}' is {other.dtype} {list(other.shape)}, the model's "
                    f"is {tensor.dtype} {list(tensor.shape)}"
                )
    groups = state["optimizer"]["param_groups"]
    sizes = [len(g["params"]) for g in groups]
    own = [list(g["params"]) for g in optimizer.param_groups]
    if sizes != [len(g) for g in own]:
        raise TrainConfigError(
            f"checkpoint file {path}: field 'optimizer.param_groups' holds {sizes} parameters, the model's optimizer "
            f"{[len(g) for g in own]}"
        )
    params = [p for g in own for p in g]
    for p, entries in state["optimizer"]["state"].items():
        for key, value in entries.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != params[p].shape:
                raise TrainConfigError(
                    f"checkpoint file {path}: field 'optimizer.state.{p}.{key}' has shape {list(value.shape)}, the "
                    f"model's parameter {list(params[p].shape)}"
                )


def _whole(value: object) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def _short(value: object) -> str:
    """A value for a message, at most 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
