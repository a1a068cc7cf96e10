"""A torch model through the API (torch is imported when called): measured into a profile, split into a plan's
stages, or run by a plan's schedule in this process."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pipeplan.api.arguments import PLAN, Choice, Flag, Function, Integer, Number, Options, Sizes, Text, check, check_model
from pipeplan.api.data_checks import DATA_SPEC, LOSS_SPEC, check_user_data
from pipeplan.core.errors import PlanError, ProfileError
from pipeplan.core.plan import Plan
from pipeplan.core.profile import ModelProfile

if TYPE_CHECKING:
    from torch import nn

    from pipeplan.runtime.execution.in_process import InProcessPipeline


def profile_model(
    module_spec: str,
    batch_size: int,
    *,
    options: dict[str, Any] | None = None,
    dataset: str = "auto",
    batch_sizes: Sequence[int] | None = None,
    project_to: str | None = None,
    dtype: str = "fp32",
    efficiency: float = 1.0,
    runs: int = 10,
    warmup: int = 3,
    threads: int = 1,
    progress: bool = False,
    device: str = "cpu",
    precision: str = "full",
    data: str | None = None,
    loss: str | None = None,
) -> ModelProfile:
    """Measure MODULE_SPEC layer by layer at several batch sizes, or project it onto a GPU (`pipeplan profile`; torch).

        `options` are the factory's (hidden=512); `dataset` fixes the layers as training builds them (digits, sample or
        auto); without `batch_sizes`, powers of two up to batch_size. `project_to` (A100, H100, ...) counts FLOPs and
        bytes on the meta device instead of measuring. `device` is where to measure (cpu, cuda, cuda:N). `dtype` is the
    weights' (fp32 = float32, float64; bf16: a bfloat16 model, projected only) and `precision` what the layers compute in
    (full: the dtype; bf16 or fp16: autocast over float32 weights, measured only); the profile records both, and a run
    is predicted only from a profile in its own numbers (core.precision).
    `data`
    (`package.module:factory`, models.user_data) measures on batches of your own samples instead of a dataset, and
    `loss` (`package.module:function`) times your loss with the last layer; both are imported because you name them,
    and checked on one batch before anything is measured (a projection takes neither).

        Raises:
            ProfileError: naming the bad argument and its value.
    """
    from pipeplan.core.hardware.devices import GPU_SPECS
    from pipeplan.core.limits import BATCH, ROUNDS, THREADS
    from pipeplan.core.precision import PRECISIONS, PROFILE_DTYPES, check_profile_numerics
    from pipeplan.models.zoo.datasets import DATASETS
    from pipeplan.profiler.session import profile_spec, session_batch_sizes, torch_device

    check(ProfileError, {
        "module_spec": (module_spec, Text("a built-in name or package.module:factory")),
        "batch_size": (batch_size, Integer(1, BATCH)), "options": (options, Options(optional=True)),
        "dataset": (dataset, Choice(("auto", *DATASETS))), "batch_sizes": (batch_sizes, Sizes(optional=True)),
        "project_to": (project_to, Choice(tuple(GPU_SPECS), fold_case=True, optional=True)),
        "dtype": (dtype, Choice(PROFILE_DTYPES)), "precision": (precision, Choice(PRECISIONS)),
        "efficiency": (efficiency, Number(0.0, above=True, most=1.0)),
        "runs": (runs, Integer(0 if project_to else 1, ROUNDS)), "warmup": (warmup, Integer(0, ROUNDS)),
        "threads": (threads, Integer(1, THREADS)), "progress": (progress, Flag()),
        "device": (device, Text("cpu, cuda or cuda:N")), "data": (data, Text(DATA_SPEC, optional=True)),
        "loss": (loss, Text(LOSS_SPEC, optional=True)),
    })  # fmt: skip
    check_profile_numerics(dtype, precision, project_to is not None)
    session_batch_sizes(batch_size, batch_sizes)
    torch_device(device)
    check_model(module_spec, options or {}, dataset, ("module_spec", "dataset"))
    if project_to is not None and (data is not None or loss is not None):
        raise ProfileError("data and loss are measured on this machine; a projection (project_to) counts shapes only")
    check_user_data(module_spec, options or {}, dataset, data=data, loss=loss, build=False, error=ProfileError)
    return profile_spec(module_spec, batch_size, dict(options or {}), dataset, batch_sizes, project_to, dtype, efficiency,
                        runs, warmup, threads, progress, device, precision, data, loss)  # fmt: skip


def profile_batch_sizes(batch_size: int, given: Sequence[int] | None, flag: str = "--batch-sizes") -> tuple[int, ...]:
    """The sizes `pipeplan profile` measures: `given` (from `flag`) checked against batch_size, or the default powers
    of two up to it.

    Raises:
        ProfileError: sizes that are not increasing, or do not end at batch_size, naming `flag`.
    """
    from pipeplan.core.profile import check_batch_sizes
    from pipeplan.profiler.curves import default_batch_sizes

    if given is None:
        return default_batch_sizes(batch_size)
    sizes = check_batch_sizes(list(given), flag)
    if sizes[-1] != batch_size:
        raise ProfileError(f"{flag} must end at --batch-size {batch_size} (the reference size), got {list(sizes)}")
    return sizes


def check_profile_target(project_to: str | None, efficiency: float, device: str) -> None:
    """`pipeplan profile`'s --project-to (a GPU pipeplan knows) and --efficiency in (0, 1], or --device (one here).

    Raises:
        ProfileError: naming the flag and its value.
    """
    if project_to is not None:
        from pipeplan.profiler.projection import resolve_gpu

        resolve_gpu(project_to)
        if not 0 < efficiency <= 1:
            raise ProfileError(f"--efficiency must be in (0, 1], got {efficiency}")
    else:
        from pipeplan.profiler.session import torch_device

        torch_device(device, "--device")


def stage_modules(model: nn.Module | Sequence[nn.Module], plan: Plan) -> list[nn.Sequential]:
    """The plan's (chunk-)stages of `model` (an nn.Sequential or a list of layers) as nn.Sequentials sharing its layers.

    Raises:
        PlanError: naming `model` when it is not a chain, or its layer count is not the plan's.
    """
    from pipeplan.runtime.execution.in_process import model_layers, split_layers

    model_layers(model)
    check(PlanError, {"plan": (plan, PLAN)})
    return split_layers(model, plan)


def pipeline(
    model: nn.Module | Sequence[nn.Module], plan: Plan, loss_fn: Callable[..., Any], *, seed: int = 0
) -> InProcessPipeline:
    """The plan's schedule in your own loop: `pipe.step(inputs, targets)` runs one iteration in this process.

    Every rank's actions run in their order, interleaved as their messages allow, activations and gradients handed
    over in memory: the losses and gradients of the distributed run, not its timing (one process does all the work).
    Step your optimizer after it. On several processes, `train_local` (or `pipeplan train`) runs the plan.
    Dropout and every other random draw inside a layer are seeded per layer call from `seed`, the step (counted
    by the pipeline from 0), the microbatch's first sample and the layer (docs/architecture.md, "Randomness"), as
    `train --seed` seeds them: the same numbers on any plan; your own generator state is left as it was.

    Raises:
        PlanError: naming `model`, `plan`, `loss_fn` or `seed` when it does not fit.
    """
    from pipeplan.core.limits import SEED
    from pipeplan.runtime.execution.in_process import InProcessPipeline, model_layers

    model_layers(model)
    check(PlanError, {"plan": (plan, PLAN), "loss_fn": (loss_fn, Function("a function (output, target) -> loss")),
                      "seed": (seed, Integer(0, SEED))})  # fmt: skip
    return InProcessPipeline(model, plan, loss_fn, seed)
