"""A plan on N processes from your own training script (torch is imported when called): `load_plan` reads the plan
file, `distribute` builds this process's stages of your model (docs/api.md, "Your own training script")."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pipeplan.api.arguments import PLAN, PROFILE, Choice, Function, Instance, Integer, Text, check, load_profile
from pipeplan.api.local import TIMEOUT
from pipeplan.core.errors import PlanError
from pipeplan.core.limits import SEED
from pipeplan.core.plan import Plan
from pipeplan.core.profile import ModelProfile

if TYPE_CHECKING:
    from torch import nn

    from pipeplan.models.model_spec import ModelSpec
    from pipeplan.runtime.execution.distributed_pipeline import DistributedPipeline

BACKENDS = ("gloo", "nccl")


def load_plan(path: str) -> Plan:
    """The plan a plan file holds (`plan --out`, `save_plan`), its schedule's options checked (what `train --plan`
    reads); a plan that names its layers (a graph's) is placed with the profile it records.

    Raises:
        PlanError: naming `path` when it is not a file path, or the file and the field that is bad.
    """
    check(PlanError, {"path": (path, Text("a plan file path"))})
    from pipeplan.presets.resolve import load_plan as read

    return read(path)[0]


def distribute(
    model: nn.Module,
    plan: Plan,
    loss_fn: Callable[..., Any],
    *,
    profile: ModelProfile | str | None = None,
    backend: str | None = None,
    timeout_s: float = 300.0,
    seed: int = 0,
) -> DistributedPipeline:
    """This process's part of `plan` on your model, in a script started by `torchrun --nproc-per-node N` (N the
    plan's devices): `.parameters()` for your optimizer (or `.optimizer(torch.optim.Adam, lr=...)`: its state sharded
    under a plan's zero 1), `.step(inputs, targets)` on each global batch (the mean loss,
    on every process), `.clip_grad_norm_(max_norm)`, `.state_dict()` / `.load_state_dict(state)` of the whole model.

    Every process builds the same `model` (an nn.Module: a chain of blocks, a graph that traces, or a stock Hugging
    Face model captured with torch.export, split as the profiler splits it) and calls this; `loss_fn(output,
    target)` is a mean over its samples. Dropout and every other random draw inside a layer are seeded per layer
    call from `seed` (docs/architecture.md, "Randomness"), so they do not depend on the plan. With `profile` (the
    plan's profile: a value, a file path or a built-in name), the model's layer names must be the profile's.

    Raises:
        PlanError: naming the argument that is bad, or a model whose layers are not the plan's (count) or the
            profile's (names), before the process group is joined.
        ProfileError: the model is neither a chain of blocks nor a graph that traces.
        TrainConfigError: not started by torchrun.
    """
    from torch import nn

    check(PlanError, {
        "model": (model, Instance((nn.Module,), "an nn.Module (every process builds the same)")), "plan": (plan, PLAN),
        "loss_fn": (loss_fn, Function("a function (output, target) -> loss")),
        "profile": (profile, Instance(PROFILE.types, PROFILE.what, named=True, optional=True)),
        "backend": (backend, Choice(BACKENDS, optional=True)), "timeout_s": (timeout_s, TIMEOUT),
        "seed": (seed, Integer(0, SEED)),
    })  # fmt: skip
    from pipeplan.runtime.execution.distributed_pipeline import model_spec, start_pipeline

    spec = model_spec(model)
    check_layers(spec, plan, None if profile is None else load_profile(profile))
    return start_pipeline(model, spec, plan, loss_fn, backend, timeout_s, seed)


def check_layers(spec: ModelSpec, plan: Plan, profile: ModelProfile | None) -> None:
    """The model's layers against the plan's layer count and, with a profile, against its layer count and names.

    Raises:
        PlanError: one line naming the model's count or first differing name and the plan's or profile's.
    """
    names = spec.layer_names
    if len(names) != plan.num_layers:
        raise PlanError(
            f"model {spec.name} has {len(names)} layers ({_few(names)}) but the plan's stages cover {plan.num_layers}: "
            "the plan was made for another model; plan this model's profile (pipeplan.profile_model, pipeplan.plan)"
        )
    if profile is None:
        return
    expected = tuple(layer.name for layer in profile.layers)
    if len(expected) != len(names):
        raise PlanError(f"profile {profile.name!r} has {len(expected)} layers but model {spec.name} has {len(names)}: "
                        "give the profile the plan was made from")  # fmt: skip
    for i, (have, want) in enumerate(zip(names, expected, strict=True)):
        if have != want:
            raise PlanError(
                f"model {spec.name} layer {i} is {have!r} but profile {profile.name!r} names it {want!r}: the plan was "
                "made for another model; plan this model's profile"
            )


def _few(names: tuple[str, ...]) -> str:
    """The first names of a model's layers, for a message."""
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
