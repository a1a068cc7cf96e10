"""What `pipeplan train` (api.train.training) checks and resolves before any process starts: flags' values, PipeMare's
switches, the files a plan's step is predicted with, and the model a plan's profile was measured on."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeplan.schedules.registry import ASYNCHRONOUS

if TYPE_CHECKING:
    from pipeplan.api.train.train_inputs import Loaded, PlanInputs
    from pipeplan.core.hardware.cluster import Cluster
    from pipeplan.core.plan import Plan
    from pipeplan.core.profile import ModelProfile
    from pipeplan.core.schedule import Schedule
    from pipeplan.runtime.execution.job import ScheduleLayout
    from pipeplan.runtime.options import AsyncSettings


def split_ints(flag: str, text: str | None) -> tuple[int, ...] | None:
    from pipeplan.runtime.rank_errors import TrainConfigError

    if text is None:
        return None
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise TrainConfigError(f"{flag} must be a comma-separated list of integers, got {text!r}") from None
    return values


def async_settings(
    schedule: str | None,
    lr_reschedule: int | None,
    discrepancy_decay: float | None,
    sync_warmup: int,
    weight_prediction: bool,
    steps: int | None,
    unsupported: dict[str, object],
) -> AsyncSettings | None:
    """PipeMare's switches for --schedule pipemare (checked: one line naming the flag), None for other schedules,
    whose runs refuse the switches; pipemare refuses what it does not support (checkpoints, timelines, predictions)."""
    from pipeplan.runtime.options import AsyncSettings, check_async_settings
    from pipeplan.runtime.rank_errors import TrainConfigError

    given = {"--lr-reschedule": lr_reschedule, "--discrepancy-decay": discrepancy_decay, "--sync-warmup": sync_warmup or None,
             "--weight-prediction": weight_prediction or None}  # fmt: skip
    if schedule not in ASYNCHRONOUS:
        for flag, value in given.items():
            if value is not None:
                raise TrainConfigError(f"{flag} applies only to --schedule pipemare (asynchronous training)")
        return None
    for flag, value in unsupported.items():
        if value is not None:
            raise TrainConfigError(f"{flag} is not supported with --schedule pipemare (one asynchronous walk, no iterations)")
    settings = AsyncSettings(lr_reschedule, discrepancy_decay, sync_warmup, weight_prediction)
    return check_async_settings(settings, steps)  # with --epochs (steps None) W is checked again by each process


def check_options(
    *,
    local: int | None,
    steps: int,
    lr: float,
    threads: int,
    timeout: float,
    warmup_steps: int,
    checkpoint_every: int,
    checkpoint_dir: str | None,
    resume: bool,
    optimizer: str,
    dtype: str,
    keep_last: int,
    lr_schedule: str,
    batch_scaling: str = "auto",
    backend: str | None = None,
    batch_size: int | None = None,
    precision: str = "full",
    check_outputs: Callable[[], None] = lambda: None,
) -> None:
    """Every option that needs no torch and no peer, checked once before any process starts (one line, exit 2):
    the job's own (runtime.options, as TrainConfig checks them on every process), --local and the outputs (the one
    output guard the caller gives as `check_outputs`: none may name an input, another output, a non-regular file, or
    a file pipeplan did not write)."""
    from pipeplan.runtime.options import check_backend, check_global_batch, check_local, check_train_options

    check_local(local)
    check_backend(backend, local)
    check_train_options(steps=steps, lr=lr, optimizer=optimizer, dtype=dtype, threads=threads, timeout_s=timeout,
                        warmup_steps=warmup_steps, checkpoint_every=checkpoint_every, keep_last=keep_last,
                        checkpoint_dir=checkpoint_dir, resume=resume, lr_schedule=lr_schedule,
                        batch_scaling=batch_scaling, backend=backend, precision=precision)  # fmt: skip
    if batch_size is not None:
        check_global_batch(batch_size, "--batch-size")
    check_outputs()


def check_model_flags(module: str, options: dict[str, str], dataset: str, given_module: str | None) -> None:
    """--module, --opt and --dataset, checked as profile_model checks its arguments (api.arguments.check_model: the
    factory resolved and its signature read, nothing built), so a bad one stops the launcher before any process
    starts, and each torchrun process before its process group forms.

    A module that came from a plan's profile rather than the command line is checked only when it is a built-in:
    a profile is data and never chooses code to import here (its workers refuse it).

    Raises:
        ProfileError, TrainConfigError: naming the flag and the value.
    """
    from pipeplan.api.arguments import check_model
    from pipeplan.models.zoo.builtin import BUILTIN_SPECS

    if module != given_module and module not in BUILTIN_SPECS:
        return
    check_model(module, options, dataset, ("--module", "--dataset"))


def check_layout(layout: ScheduleLayout, local: int | None) -> tuple[Schedule, tuple[int, ...], int] | None:
    """A --schedule job's sizes against its processes, before any starts: --local N's, or under torchrun
    WORLD_SIZE's (each process, before the process group forms); the schedule alone when neither is known.
    Returns ScheduleLayout.check's (schedule, replicas per rank, pipeline copies) for --local N, else None.

    Raises:
        ScheduleError, TrainConfigError: naming the flag and the value.
    """
    world = os.environ.get("WORLD_SIZE", "")
    if local is not None:
        return layout.check(local)
    if world.isdigit() and int(world) >= 1:
        layout.check(int(world))
    else:
        layout.schedule()
    return None


def refuse_asynchronous_split(
    layout: ScheduleLayout | None,
    local: int | None,
    model: tuple[str, dict[str, str], str, str, int, str | None, str | None],
) -> None:
    """--schedule pipemare with a model whose tied weights its stages split: refused before any process starts, the
    model built as each worker will build it (module, options, dataset, dtype, seed, --data, --loss). The processes
    are --local N's, or under torchrun WORLD_SIZE's (each process, before the process group forms).

    Raises:
        TrainConfigError: naming the parameter, its layers and stages (runtime.execution.shared_grads).
    """
    world = local if local is not None else int(os.environ.get("WORLD_SIZE", "0") or 0)
    if layout is None or not layout.asynchronous or world < 1:
        return
    from pipeplan.models.build import build_model
    from pipeplan.runtime.execution.shared_grads import check_asynchronous_sharing

    module, options, dataset, dtype, seed, data, loss = model
    built = build_model(module, dict(options), dataset, dtype, seed, data=data, loss=loss)
    plan, _ = layout.build(len(built.layers), world)
    check_asynchronous_sharing(built.layers, built.layer_names, plan, layout.name)


def refuse_beside_plan(given: dict[str, object]) -> None:
    """Raise TrainConfigError for the first flag given (not None) beside --plan whose value a plan file fixes (stages,
    microbatches, batch size, k, chunks, replicas), naming it and its value."""
    from pipeplan.runtime.rank_errors import TrainConfigError

    for flag, value in given.items():
        if value is not None:
            raise TrainConfigError(
                f"{flag} {value} does not apply with --plan: the plan file fixes stages, microbatches, their size, k, "
                "chunks and replicas; leave it out, or make another plan (pipeplan plan)"
            )


def check_plan(
    path: str,
    plan: Plan,
    files: tuple[ModelProfile | None, Cluster | None],
    costs: tuple[str, str],
) -> None:
    """Everything `simulate --plan` checks, with the same code (api.simulation.simulate_read_plan): plan file `path`'s
    `plan` against its profile and cluster (`files`, as the launcher read them: layers, devices, replicas, schedule)
    and whether each device holds its stages (`optimizer`'s state).

    Without a profile and a cluster (the plan's own cannot be loaded and none was given) there is nothing to check
    against; the workers still check the plan against the model they build.

    Raises:
        PlanError: as `simulate --plan` would say it.
    """
    profile, cluster = files
    if profile is None or cluster is None:
        return
    from pipeplan.api.simulation import simulate_read_plan

    batch_scaling, optimizer = costs
    simulate_read_plan(plan, path, profile, cluster, batch_scaling, optimizer,
                       remedy="train would run out of memory; make a plan that fits (pipeplan plan), or name the "
                       "machines it runs on with --cluster")  # fmt: skip


def prediction_inputs(
    inputs: PlanInputs, given: tuple[bool, bool], notes: list[str]
) -> tuple[Loaded[ModelProfile], Loaded[Cluster]] | None:
    """The profile and cluster to predict the plan's step with, as the launcher read them (`inputs`): --profile/
    --cluster (`given`: which must load), else the plan's own; a plan whose own files cannot be loaded runs without a
    prediction (None), and a line saying why is added to `notes` (printed by the caller once every check has passed:
    a refusal stays one line).

    Raises:
        ProfileError, ClusterError: a given profile or cluster that does not load.
    """
    for read, was_given in zip((inputs.profile, inputs.cluster), given, strict=True):
        if was_given:
            read.get()  # a given file or name must load: a PipeplanError ends the command here, exit 2
        elif read.error is not None:
            notes.append(f"note: no predicted step: {read.error}")
            return None
    return inputs.profile, inputs.cluster


def prediction_numerics(
    profile: Loaded[ModelProfile] | None, explicit: bool, numerics: tuple[str, str], notes: list[str]
) -> bool:
    """Whether `profile` (as read) may predict a run in `numerics` (--dtype, --precision): only when it was measured in
    them.

    A profile measured in other numbers never predicts this run (core.precision): when the user asked for that
    prediction (`explicit`: --profile or --predict) the command is refused before any process starts; the plan's own
    profile, not asked for, gives no prediction and one line added to `notes` says why.

    Raises:
        ProfileError: an `explicit` profile measured in other numbers, naming both and the way out.
    """
    if profile is None:
        return False
    from pipeplan.core.errors import ProfileError
    from pipeplan.core.precision import prediction_mismatch

    mismatch = prediction_mismatch(profile.spec, profile.get().numerics, numerics)
    if mismatch is None:
        return True
    if explicit:
        raise ProfileError(mismatch)
    notes.append(f"note: no predicted step: {mismatch}")
    return False


def model_of_profile(
    profile: Loaded[ModelProfile] | None,
    module: str | None,
    options: dict[str, str],
    dataset: str | None,
    options_given: bool,
) -> tuple[str | None, dict[str, str], str | None]:
    """--module, --opt and --dataset, each taken from the plan's profile (as read: its recorded source) when not given.

    The profile's module is taken only when it is a built-in name; a `pkg.module:factory` it records runs only when
    --module names it too, and a --module other than the recorded one is refused (core.model_source). A profile that
    does not exist or records no source leaves them as given (train checks the layers later).

    Raises:
        TrainConfigError: naming the profile, the module it records and the --module to give.
    """
    if profile is None:
        return module, options, dataset
    from pipeplan.core.model_source import model_to_build

    source = None if profile.value is None else profile.value.source
    if source is None:
        return module, options, dataset
    return (
        model_to_build(source, module, profile.spec, "--module"),
        options if options_given else dict(source.options),
        dataset or source.dataset,
    )


def refuse_predict_for_graph(plan_path: str, plan: Plan, profile: ModelProfile | None) -> None:
    """--predict re-profiles a chain's stages: refused for a plan of a graph (a layer order, or a profile, as read,
    with layer inputs), before any process starts. (A --schedule run of a graph model is refused by its workers.)"""
    from pipeplan.runtime.rank_errors import TrainConfigError

    graph = plan.layer_order is not None or (profile is not None and profile.layer_inputs is not None)
    if graph:
        raise TrainConfigError(
            f"--predict re-profiles a chain's stages; plan {plan_path} is a graph's (its stages are sets of layers): "
            "leave --predict out (the plan's step is still predicted from its profile and cluster)"
        )


def prepare_checkpoints(
    checkpoint_dir: str,
    resume: bool,
    every: int,
    steps: int,
    job: dict[str, Any],
    plan: tuple[Plan | None, str | None, ScheduleLayout | None],
    local: int | None,
) -> tuple[str | None, bool]:
    """The checkpoint folder checked before any process starts (runtime.state.checkpoint.prepare): writable, nothing
    in it that pipeplan did not record, and with --resume every file and field of the checkpoint, and its tensors
    against the stages each process will build (the job's model, `plan` = (plan, its path, or a --schedule layout)).
    `job`: module, module_options (a dict), dataset, dtype, optimizer, seed, lr. Returns a note for the user and
    whether the run is already finished."""
    from pipeplan.runtime.state.checkpoint import prepare

    world = local if local is not None else os.environ.get("WORLD_SIZE", "")
    size = world if isinstance(world, int) else int(world) if world.isdigit() else None
    fields = {"module": job["module"], "module_options": sorted((k, str(v)) for k, v in job["module_options"].items()),
              "dataset": job["dataset"], "dtype": job["dtype"], "optimizer": job["optimizer"], "seed": job["seed"]}  # fmt: skip
    fields |= {key: job[key] for key in ("data", "loss") if job.get(key) is not None}
    if job.get("eval_fraction"):
        fields["eval_fraction"] = job["eval_fraction"]
    if size is not None:
        fields["world_size"] = size

    def expect() -> tuple[dict[str, Any], Any]:
        from pipeplan.runtime.training.resume_check import resume_targets
        from pipeplan.runtime.training.train_config import TrainConfig

        config = TrainConfig(plan=plan[0], plan_path=plan[1], layout=plan[2], module=job["module"],
                             module_options=tuple(sorted(job["module_options"].items())), dataset=job["dataset"],
                             dtype=job["dtype"], optimizer=job["optimizer"], seed=job["seed"], lr=job["lr"],
                             steps=steps, data=job.get("data"), loss=job.get("loss"),
                             eval_fraction=job.get("eval_fraction", 0.0))  # fmt: skip
        assert size is not None
        return resume_targets(config, size)

    checks_model = size is not None  # torchrun's processes each check; --local's launcher checks once for its workers
    return prepare(
        Path(checkpoint_dir), resume, every > 0, steps, every=every, job=fields, expect=expect if checks_model else None
    )


def adaptive_budget(
    plan: Plan,
    given: float | None,
    name: str,
    files: tuple[ModelProfile | None, Cluster | None],
    batch_scaling: str,
    optimizer: str,
) -> float | None:
    """The memory budget of `train --plan` with --adaptive (or a plan's adaptive setting), checked before any process
    starts against the plan's 1F1B peak under its profile and cluster (`files`, as read; adapt.budget.resolve_budget: `given`,
    named `name`, else the device memory less the margin, never below 1F1B's peak). Without a profile and cluster
    `given` is returned unchecked (the controller checks it against the measured peaks).

    Raises:
        AdaptError: a budget below 1F1B's peak, naming `name`, the peak, the stage and by how much.
    """
    profile, cluster = files
    if profile is None or cluster is None:
        return given
    from pipeplan.adapt.budget import resolve_budget
    from pipeplan.adapt.pipeline import PipelineModel
    from pipeplan.sim.cost.model import CostModel

    model = CostModel.build(profile, cluster, batch_scaling, optimizer)
    return resolve_budget(PipelineModel.from_plan(plan, model), given, name)
