"""The user's own data and loss (`--data MODULE:FACTORY`, `--loss MODULE:FN`): imported only because the user named
them, the samples read once into the tensors a run draws its batches from (models.zoo.datasets.Dataset).

A data factory takes no arguments and returns a map-style dataset (a torch `Dataset` or any sequence: `len` and
`[i]`), or a pair `(train, held_out)` of them. A sample is an `(input, target)` pair, or a dict of tensors in
Hugging Face style: the input is the key named as the model's forward's first parameter (`input_ids`,
`pixel_values`), else the first key that is not `labels`; the target is `labels`. Keys that the model would not
read are refused unless they hold the value the model assumes without them (`attention_mask` all ones,
`token_type_ids` all zeros), so that no input the user gave is silently dropped. Every sample's input has the same
shape and dtype (so has every target): the samples are stacked.

A loss is called `FN(output, target)` and returns a scalar tensor, the mean over the samples it is given (the runtime
weighs each microbatch's loss by its share of the global batch).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from pipeplan.core.errors import PipeplanError, TrainConfigError
from pipeplan.models.model_spec import LossFn
from pipeplan.models.zoo.datasets import Dataset

LABELS = "labels"
"""The target's key in a dict sample (Hugging Face's name)."""
DEFAULT_KEYS = {"attention_mask": 1, "token_type_ids": 0}
"""Dict keys a model assumes when they are left out, and the one value they may hold to be left out exactly."""
FIT_SAMPLES = 2
"""Samples the fit check runs through the model (2: BatchNorm needs more than one value per channel)."""
HELD_OUT_SALT = 999_983
"""Added to `seed * 1_000_003` for the generator of --eval-fraction's permutation (apart from the epochs' orders,
models.zoo.datasets.batch_indices, whose generators take `seed * 1_000_003 + epoch`)."""
"""Samples the fit check runs through the model (2: BatchNorm needs more than one value per channel)."""


def import_named(spec: str, flag: str) -> Callable[..., Any]:
    """The callable `package.module:attr` names; the module is found as a MODULE_SPEC's is (the working folder last,
    models.specs.module_origin), so the --local launcher and its workers import the same file.

    Raises:
        TrainConfigError: naming `flag`, the spec and why it cannot be imported or called.
    """
    from pipeplan.models.specs import module_origin

    module_name, _, attr_path = spec.strip().partition(":")
    if not module_name or not attr_path:
        raise TrainConfigError(f"{flag} {spec!r} must be of the form package.module:function")
    try:
        module_origin(spec.strip())
        obj: object = importlib.import_module(module_name)
    except PipeplanError as exc:
        raise TrainConfigError(str(exc).replace("MODULE_SPEC", flag, 1)) from None
    except Exception as exc:  # the user's module raised while it was imported
        raise TrainConfigError(f"{flag} {spec!r}: cannot import module {module_name!r} ({_first_line(exc)})") from None
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            raise TrainConfigError(f"{flag} {spec!r}: module {module_name!r} has no attribute {attr_path!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise TrainConfigError(f"{flag} {spec!r}: {attr_path!r} is not callable")
    return obj  # type: ignore[return-value]


def load_loss(spec: str) -> LossFn:
    """The loss function `--loss MODULE:FN` names (checked on a real batch by check_fit)."""
    return import_named(spec, "--loss")


@dataclass(frozen=True)
class UserSamples:
    """What a data factory returned, read but not yet stacked: the input of a dict sample depends on the model's
    forward (`dataset(input_name)`), and a model that gives no way to make an input of its own is built with the
    first samples' (`first_inputs`)."""

    spec: str
    train: Any
    held_out: Any | None
    seed: int
    eval_fraction: float

    def first_inputs(self, batch_size: int) -> torch.Tensor:
        """The inputs of the first `batch_size` samples (cycled when there are fewer), the first non-label key of a
        dict sample as the input: a model's sample input when it has none of its own."""
        n = len(self.train)
        rows = [_pair(f"--data {self.spec}", i % n, self.train[i % n], None)[0] for i in range(batch_size)]
        return torch.stack(rows)

    def dataset(self, input_name: str | None) -> Dataset:
        """The samples stacked into a Dataset named `spec`, `input_name` the key of a dict sample's input (module
        docstring); held out as load_data says.

        Raises:
            TrainConfigError: as load_data.
        """
        spec = self.spec
        if self.held_out is not None:
            inputs, targets = _stack(spec, "train", self.train, input_name)
            test_inputs, test_targets = _stack(spec, "held-out", self.held_out, input_name)
            _same_kind(spec, (inputs, targets), (test_inputs, test_targets))
            return Dataset(spec, inputs, targets, None, test_inputs, test_targets)
        inputs, targets = _stack(spec, "", self.train, input_name)
        if not self.eval_fraction:
            return Dataset(spec, inputs, targets)
        n = len(inputs)
        held = max(1, round(self.eval_fraction * n))
        if held >= n:
            raise TrainConfigError(
                f"--eval-fraction {self.eval_fraction} of --data {spec}'s {n} samples leaves none to train on: give a "
                "smaller fraction"
            )
        order = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed * 1_000_003 + HELD_OUT_SALT))
        test, train = order[:held].sort().values, order[held:].sort().values
        return Dataset(spec, inputs[train], targets[train], None, inputs[test], targets[test])


def read_data(spec: str, seed: int, eval_fraction: float = 0.0) -> UserSamples:
    """Call the factory `--data MODULE:FACTORY` names, with torch's generator seeded from `seed` (inside fork_rng), so
    every process reads the same samples. `eval_fraction` > 0 holds out that share of a single dataset (at least one
    sample, chosen by a permutation seeded from `seed`, HELD_OUT_SALT); a factory's own `(train, held_out)` pair is
    taken as it is.

    Raises:
        TrainConfigError: one line naming --data and what does not fit (nothing returned, not a dataset, both a
            held-out pair and a fraction); the samples themselves are checked when stacked (UserSamples.dataset).
    """
    factory = import_named(spec, "--data")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            made = factory()
        except Exception as exc:
            raise TrainConfigError(f"--data {spec}: the factory raised {type(exc).__name__}: {_first_line(exc)}") from None
    if made is None:
        raise TrainConfigError(
            f"--data {spec} returned nothing (None): return a map-style Dataset or a list of (input, target) samples, "
            "or a pair (train, held_out) of them"
        )
    if _is_split(made):
        if eval_fraction:
            raise TrainConfigError(
                f"--eval-fraction {eval_fraction} holds out part of the data, but --data {spec} returns its own "
                "(train, held_out) pair: leave --eval-fraction out"
            )
        return UserSamples(spec, made[0], made[1], seed, 0.0)  # type: ignore[index]
    _length(f"--data {spec}", made)
    return UserSamples(spec, made, None, seed, eval_fraction)


def load_data(spec: str, input_name: str | None, seed: int, eval_fraction: float = 0.0) -> Dataset:
    """read_data, stacked with `input_name` as the input of a dict sample (UserSamples.dataset)."""
    return read_data(spec, seed, eval_fraction).dataset(input_name)


def input_name_of(layers: Sequence[nn.Module]) -> str | None:
    """The name of the first parameter of the first layer's forward (`input_ids` for a captured HF model), or None."""
    try:
        params = list(inspect.signature(layers[0].forward).parameters.values())
    except (TypeError, ValueError, IndexError):
        return None
    named = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return named[0] if named else None


def check_fit(model: nn.Module, loss_fn: LossFn, inputs: torch.Tensor, targets: torch.Tensor, what: str) -> None:
    """Run FIT_SAMPLES samples through `model` and the loss (no gradients, evaluation mode, the random state and the
    model's mode as they were): a batch that does not fit the model, or a loss that is not a scalar, is refused.

    `what` names the data and the loss for the messages (`--data d:build with --loss l:fn`).

    Raises:
        TrainConfigError: one line naming `what`, the batch's shape and dtype, and the failure.
    """
    x, y = inputs[:FIT_SAMPLES], targets[:FIT_SAMPLES]
    shown = f"a batch of {len(x)} (input {tuple(x.shape)} {_dtype(x)}, target {tuple(y.shape)} {_dtype(y)})"
    modes = [m.training for m in model.modules()]
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            model.eval()
            try:
                out = model(x)
            except Exception as exc:
                raise TrainConfigError(
                    f"{what}: {shown} does not fit the model: {type(exc).__name__}: {_first_line(exc)}"
                ) from None
            try:
                loss = loss_fn(out, y)
            except Exception as exc:
                raise TrainConfigError(
                    f"{what}: the loss fails on the model's output {_shape(out)} and {shown}: "
                    f"{type(exc).__name__}: {_first_line(exc)}"
                ) from None
    finally:
        for m, mode in zip(model.modules(), modes, strict=True):
            m.training = mode
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.is_floating_point():
        got = f"shape {tuple(loss.shape)} {_dtype(loss)}" if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise TrainConfigError(
            f"{what}: the loss must return a scalar floating-point tensor (the mean over the batch), got {got} for "
            f"{shown}: reduce it (e.g. .mean())"
        )


def _is_split(made: object) -> bool:
    """True for a pair (train, held_out) of datasets; a pair of samples (tensors or dicts inside) is data itself."""
    if not isinstance(made, tuple) or len(made) != 2:
        return False
    return all(_is_collection(part) and len(part) > 0 and _is_sample(part[0]) for part in made)  # type: ignore[arg-type,index]


def _is_collection(obj: object) -> bool:
    return not isinstance(obj, (torch.Tensor, Mapping, str, bytes)) and hasattr(obj, "__len__") and hasattr(obj, "__getitem__")


def _is_sample(obj: object) -> bool:
    return isinstance(obj, Mapping) or (isinstance(obj, (tuple, list)) and len(obj) == 2)


def _stack(spec: str, part: str, data: object, input_name: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Every sample of `data` as (inputs, targets), stacked along a new first dimension."""
    label = f"--data {spec}" + (f" ({part} part)" if part else "")
    n = _length(label, data)
    inputs, targets = [], []
    for i in range(n):
        try:
            sample = data[i]  # type: ignore[index]
        except Exception as exc:
            raise TrainConfigError(f"{label}: sample {i} raised {type(exc).__name__}: {_first_line(exc)}") from None
        x, y = _pair(label, i, sample, input_name)
        for kind, value, first in (("input", x, inputs[0] if inputs else None), ("target", y, targets[0] if targets else None)):
            if first is not None and (value.shape != first.shape or value.dtype != first.dtype):
                raise TrainConfigError(
                    f"{label}: sample {i}'s {kind} is {tuple(value.shape)} {_dtype(value)} but sample 0's is "
                    f"{tuple(first.shape)} {_dtype(first)}: every sample's {kind} must have one shape and dtype (pad "
                    "them to one length)"
                )
        inputs.append(x)
        targets.append(y)
    return torch.stack(inputs), torch.stack(targets)


def _length(label: str, data: object) -> int:
    """The number of samples of a map-style dataset (len and [i]), at least one."""
    if not _is_collection(data):
        raise TrainConfigError(
            f"{label} returned a {type(data).__name__}: return a map-style Dataset (len and [i]) or a list of "
            "samples; read an iterable into a list first"
        )
    try:
        n = len(data)  # type: ignore[arg-type]
    except Exception as exc:
        raise TrainConfigError(f"{label}: len() raised {type(exc).__name__}: {_first_line(exc)}") from None
    if n == 0:
        raise TrainConfigError(f"{label} holds no samples: return at least one (input, target) sample")
    return int(n)


def _pair(label: str, i: int, sample: object, input_name: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(input, target) of one sample: a pair, or a Hugging Face style dict (see the module docstring)."""
    if isinstance(sample, Mapping):
        return _from_dict(label, i, sample, input_name)
    if isinstance(sample, (tuple, list)) and len(sample) == 2:
        return _tensor(label, i, "input", sample[0]), _tensor(label, i, "target", sample[1])
    raise TrainConfigError(
        f"{label}: sample {i} is a {type(sample).__name__}"
        + (f" of {len(sample)}" if isinstance(sample, (tuple, list)) else "")
        + ": each sample must be an (input, target) pair or a dict with 'labels'"
    )


def _from_dict(label: str, i: int, sample: Mapping[Any, Any], input_name: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    keys = list(sample)
    if LABELS not in sample:
        raise TrainConfigError(f"{label}: sample {i} is a dict without {LABELS!r} (keys {keys}): add the target as 'labels'")
    rest = [k for k in keys if k != LABELS and k not in DEFAULT_KEYS]
    key = input_name if input_name in sample else (rest[0] if rest else None)
    if key is None:
        raise TrainConfigError(f"{label}: sample {i} has no input beside 'labels' (keys {keys})")
    for other in keys:
        if other in (key, LABELS):
            continue
        value = _tensor(label, i, repr(other), sample[other])
        if other not in DEFAULT_KEYS or not bool((value == DEFAULT_KEYS[other]).all()):
            raise TrainConfigError(
                f"{label}: sample {i} has key {other!r} beside the input {key!r} and 'labels'; the model is called "
                f"with the input alone, so only an all-{DEFAULT_KEYS.get(other, 'default')} attention_mask or "
                "token_type_ids may stay: leave the others out (pad to one length without a mask)"
            )
    return _tensor(label, i, repr(key), sample[key]), _tensor(label, i, "'labels'", sample[LABELS])


def _tensor(label: str, i: int, what: str, value: object) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        raise TrainConfigError(f"{label}: sample {i}'s {what} is a {type(value).__name__}, not a tensor or numbers") from None


def _same_kind(spec: str, train: tuple[torch.Tensor, torch.Tensor], held: tuple[torch.Tensor, torch.Tensor]) -> None:
    for kind, a, b in (("input", train[0], held[0]), ("target", train[1], held[1])):
        if a.shape[1:] != b.shape[1:] or a.dtype != b.dtype:
            raise TrainConfigError(
                f"--data {spec}: the held-out samples' {kind} is {tuple(b.shape[1:])} {_dtype(b)} but the training "
                f"samples' is {tuple(a.shape[1:])} {_dtype(a)}: give both parts one shape and dtype"
            )


def _shape(out: object) -> str:
    return f"{tuple(out.shape)} {_dtype(out)}" if isinstance(out, torch.Tensor) else f"of type {type(out).__name__}"


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
