"""Checking a rank's checkpoint tensors: every tensor and field of its .pt (dtype, finite values, optimizer state
shaped as its parameter, RNG states), and the whole against the stages and optimizer this process builds.

checkpoint_read reads the files (the one bounded reader, the record's size and SHA-256, torch's weights-only
loading) and checks the JSON; it hands the loaded state here.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeplan.runtime.rank_errors import TrainConfigError

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def check_state(path: Path, state: dict[str, Any], fingerprint: dict[str, Any]) -> None:
    """Every tensor and field of a rank's .pt: stages (stage index -> name -> tensor of the job's dtype, finite),
    optimizer (its groups' parameters, finite numbers, state shaped as its parameter), RNG (torch's byte state)."""
    dtype = DTYPES[fingerprint.get("dtype", "float32")]
    stages = state["stages"]
    count = len(fingerprint["stages"]) if isinstance(fingerprint.get("stages"), list) else None
    if not isinstance(stages, dict) or not stages:
        raise TrainConfigError(f"checkpoint file {path}: field 'stages' must map stage indexes to weights, got {short(stages)}")
    weights: list[torch.Tensor] = []
    for s in sorted(stages, key=index_order):
        if not whole(s) or s < 0 or (count is not None and s >= count):
            raise TrainConfigError(
                f"checkpoint file {path}: field 'stages' has stage {short(s)}, the job has stages 0..{(count or 1) - 1}"
            )
        tensors = stages[s]
        if not isinstance(tensors, dict):
            raise TrainConfigError(f"checkpoint file {path}: field 'stages.{s}' must map names to tensors, got {short(tensors)}")
        for name, tensor in tensors.items():
            _check_tensor(path, f"stages.{s}.{name}", tensor, dtype)
            weights.append(tensor)
    _check_optimizer(path, state["optimizer"], weights)
    _check_rng(path, state["rng"])


def _check_tensor(path: Path, where: str, tensor: object, dtype: torch.dtype | None) -> torch.Tensor:
    """A dense CPU tensor whose values are finite (and, with `dtype`, a floating one of that dtype)."""
    if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.strided:
        raise TrainConfigError(f"checkpoint file {path}: field '{where}' must be a tensor, got {short(tensor)}")
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
            f"checkpoint file {path}: field 'optimizer' must hold state and param_groups, got {short(optimizer)}"
        )
    groups, per_param = optimizer["param_groups"], optimizer["state"]
    if not isinstance(groups, list) or not all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups):
        raise TrainConfigError(f"checkpoint file {path}: field 'optimizer.param_groups' must be a list of groups with params")
    params = [p for g in groups for p in g["params"]]
    if not all(whole(p) for p in params) or sorted(params) != list(range(len(params))):
        raise TrainConfigError(
            f"checkpoint file {path}: field 'optimizer.param_groups' names parameters {short(params)}, expected "
            f"0..{len(params) - 1} once each"
        )
    for i, group in enumerate(groups):
        for key, value in group.items():
            if key != "params":
                _check_plain(path, f"optimizer.param_groups.{i}.{key}", value)
    if not isinstance(per_param, dict) or not all(whole(k) and 0 <= k < len(params) for k in per_param):
        raise TrainConfigError(
            f"checkpoint file {path}: field 'optimizer.state' must map parameters 0..{len(params) - 1} to their state"
        )
    shapes = [w.shape for w in weights] if len(weights) == len(params) else None
    for p, entries in per_param.items():
        if not isinstance(entries, dict):
            raise TrainConfigError(f"checkpoint file {path}: field 'optimizer.state.{p}' must be an object, got {short(entries)}")
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
    if value is None or isinstance(value, (bool, str)) or whole(value):
        return
    if not isinstance(value, float) or not math.isfinite(value):
        raise TrainConfigError(f"checkpoint file {path}: field '{where}' must be a finite number or a flag, got {short(value)}")


def _check_rng(path: Path, rng: object) -> None:
    """{"torch": torch's CPU generator state (uint8, its size), "cuda": optional list of such states}."""
    size = torch.get_rng_state().numel()
    if not isinstance(rng, dict) or "torch" not in rng or not set(rng) <= {"torch", "cuda"}:
        raise TrainConfigError(f"checkpoint file {path}: field 'rng' must hold torch (and cuda), got {short(rng)}")
    states = [("rng.torch", rng["torch"])]
    if "cuda" in rng:
        if not isinstance(rng["cuda"], list):
            raise TrainConfigError(f"checkpoint file {path}: field 'rng.cuda' must be a list of generator states")
        states += [(f"rng.cuda.{i}", s) for i, s in enumerate(rng["cuda"])]
    for where, tensor in states:
        ok = isinstance(tensor, torch.Tensor) and tensor.layout == torch.strided and tensor.dtype == torch.uint8
        if not ok or tensor.dim() != 1 or (where == "rng.torch" and tensor.numel() != size):
            said = f"uint8 [{tensor.numel()}]" if isinstance(tensor, torch.Tensor) else short(tensor)
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


def index_order(key: object) -> tuple[int, int, str]:
    """A sort key for a file's index keys: whole numbers first, in numeric order (stage 10 after stage 2, as the
    optimizer holds their parameters), then anything else by its repr (a damaged file's keys sort without a TypeError)."""
    if isinstance(key, int) and not isinstance(key, bool):
        return (0, key, "")
    return (1, 0, repr(key))


def whole(value: object) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def short(value: object) -> str:
    """A value for a message, at most 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
