"""Local processes through the API (torch is imported when called): probed as a cluster, or training a plan with
its prediction beside the measurement."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pipeplan.api.arguments import (
    PLAN,
    PROFILE,
    PROGRESS,
    Choice,
    Flag,
    Instance,
    Integer,
    Number,
    Output,
    Text,
    check,
    check_sources,
    cost_arguments,
    load_profile,
    shown,
)
from pipeplan.api.data_checks import DATA_SPEC, LOSS_SPEC, check_user_data, user_dataset
from pipeplan.api.simulation import simulate
from pipeplan.core.errors import PlanError, ProfileError, TrainConfigError
from pipeplan.core.hardware.cluster import Cluster
from pipeplan.core.limits import TIMEOUT_S
from pipeplan.core.model_source import USER_DATA
from pipeplan.core.plan import Plan
from pipeplan.core.profile import ModelProfile
from pipeplan.io import file_kinds

TIMEOUT = Number(0.0, above=True, limit=TIMEOUT_S)


def probe_local(
    nprocs: int,
    profile: ModelProfile | str | None = None,
    *,
    steps: int = 16,
    rounds: int = 10,
    optimizer: str = "adam",
    name: str | None = None,
    out: str | None = None,
    timeout_s: float = 60.0,
    on_progress: Callable[[int, int], None] | None = None,
    module: str | None = None,
) -> Cluster:
    """Start `nprocs` processes here and measure them as a cluster (`pipeplan probe --local N`; torch).

    With `out`, the cluster file is written there too (pipeplan.cluster/1, with the probe's notes).

    With a profile from `profile_model` (a measured one, which records how its model was built), each process's
    speed is measured against it and the messages' costs are fitted. One thread per process, as training runs.
    A profile never chooses code to run: when it records a `pkg.module:factory`, name that module yourself with
    `module` (a built-in name it records needs none). The run trains in the numbers the profile was measured in
    (its dtype and precision, core.precision) unless `dtype` (float32, float64) or `precision` (full, bf16, fp16)
    says otherwise; a profile measured in other numbers than those asked is refused (it would predict another run).

    Raises:
        TrainConfigError: naming the bad argument and its value (a profile recording a module that `module` does
            not name).
        ProfileError: `dtype` or `precision` other than the profile's, naming both and the way out.
        RuntimeFault: a process failed (its reason printed on stderr).
    """
    from pipeplan.core.limits import ROUNDS
    from pipeplan.io.cluster_json import cluster_from_json
    from pipeplan.io.profile_json import profile_to_json
    from pipeplan.runtime.options import OPTIMIZERS
    from pipeplan.runtime.training.local_jobs import run_local_job

    check(ProfileError, {"profile": (profile, Instance(PROFILE.types, PROFILE.what, named=True, optional=True))})
    check(TrainConfigError, {"nprocs": (nprocs, Integer(1)), "steps": (steps, Integer(1, ROUNDS)),
                             "rounds": (rounds, Integer(1, ROUNDS)), "optimizer": (optimizer, Choice(OPTIMIZERS)),
                             "name": (name, Text(optional=True)), "out": (out, Output(file_kinds.CLUSTER, optional=True)),
                             "timeout_s": (timeout_s, TIMEOUT), "on_progress": (on_progress, PROGRESS),
                             "module": (module, Text(optional=True))})  # fmt: skip
    _check_job(nprocs, optimizer)
    spec, options, measured = None, {}, None
    if profile is not None:
        measured = load_profile(profile)  # read once, here: the workers are handed its value
        spec = _model_of(measured, profile, module)
        options = dict(measured.source.options) if measured.source is not None else {}
    elif module is not None:
        raise TrainConfigError(f"module names the model of a profile; give profile too, or leave module out (got {module!r})")
    params = {"profile": None if measured is None else profile_to_json(measured), "steps": steps, "rounds": rounds,
              "timeout_s": timeout_s, "optimizer": optimizer, "threads": 1, "name": name, "module": spec,
              "options": options}  # fmt: skip
    obj = run_local_job("probe", nprocs, params, 1, on_progress, timeout_s=timeout_s * 10)
    cluster = cluster_from_json(obj, f"probe of {nprocs} local processes")
    if out is not None:
        import json

        from pipeplan.io.atomic import write_text_atomic

        write_text_atomic(out, json.dumps(obj, indent=2, sort_keys=True) + "\n")
    return cluster


@dataclass(frozen=True)
class LocalRun:
    """A training run on local processes: losses and times per step, the plan's prediction beside the measurement."""

    losses: list[float]
    step_ms: list[float]
    measured_step_ms: float | None
    predicted_step_ms: float | None
    predicted_memory_bytes: list[float] | None
    measured_memory_bytes: list[int] | None
    schedule: str
    evals: list[dict[str, float]] = field(default_factory=list)
    """With `evaluate`: each held-out evaluation (step, epoch, test_accuracy, test_loss, elapsed_s)."""


def train_local(
    plan: Plan,
    profile: ModelProfile | str,
    cluster: Cluster | str,
    *,
    steps: int = 20,
    lr: float = 1e-3,
    optimizer: str = "adam",
    seed: int = 0,
    batch_scaling: str = "auto",
    warmup_steps: int = 2,
    timeout_s: float = 300.0,
    on_progress: Callable[[int, int], None] | None = None,
    module: str | None = None,
    dtype: str | None = None,
    precision: str | None = None,
    data: str | None = None,
    loss: str | None = None,
    eval_fraction: float = 0.0,
    evaluate: bool = False,
    epochs: int = 0,
) -> LocalRun:
    """Train the model `profile` was measured on with `plan`, one local process per device (`pipeplan train --local`).

    The plan's step is predicted from `profile` and `cluster` before the first step, as `pipeplan train --plan` does.
    A profile never chooses code to run: when it records a `pkg.module:factory`, name that module yourself with
    `module` (a built-in name it records needs none). The run trains in the numbers the profile was measured in
    (its dtype and precision, core.precision) unless `dtype` (float32, float64) or `precision` (full, bf16, fp16)
    says otherwise; a profile measured in other numbers than those asked is refused (it would predict another run).

    `data` (`package.module:factory`, models.user_data) trains on your own samples (a profile measured on them
    records only that it was: name them again here), `eval_fraction` of them held out; `loss`
    (`package.module:function`) replaces the model's loss. `evaluate` scores the held-out split after each epoch and
    at the end (`evals`); `epochs` > 0 runs that many passes instead of `steps`. The data, the loss and the held-out
    split are checked on one batch here, before any process starts.

    Raises:
        TrainConfigError: naming the bad argument and its value (a profile recording a module that `module` does
            not name, data that does not fit the model, a loss that is not a scalar, `evaluate` without a held-out
            split).
        ProfileError: `dtype` or `precision` other than the profile's, naming both and the way out.
        PlanError: the plan does not match the profile or cluster, or does not fit.
        RuntimeFault: a process failed (its reason printed on stderr).
    """
    from pipeplan.core.limits import SEED
    from pipeplan.core.precision import DTYPES, PRECISIONS, check_numerics, prediction_mismatch
    from pipeplan.runtime.options import OPTIMIZERS
    from pipeplan.runtime.training.local_jobs import job_files, run_local_job

    check(PlanError, {"plan": (plan, PLAN)})
    check_sources(profile, cluster)
    check(TrainConfigError, {"steps": (steps, Integer(1)), "lr": (lr, Number(0.0)), "optimizer": (optimizer, Choice(OPTIMIZERS)),
                             "seed": (seed, Integer(0, SEED)), "warmup_steps": (warmup_steps, Integer(0)),
                             "timeout_s": (timeout_s, TIMEOUT), "on_progress": (on_progress, PROGRESS),
                             "module": (module, Text(optional=True)),
                             "dtype": (dtype, Choice(DTYPES, optional=True)),
                             "precision": (precision, Choice(PRECISIONS, optional=True)),
                             "data": (data, Text(DATA_SPEC, optional=True)),
                             "loss": (loss, Text(LOSS_SPEC, optional=True)), "eval_fraction": (eval_fraction, Number(0.0)),
                             "evaluate": (evaluate, Flag()), "epochs": (epochs, Integer(0))})  # fmt: skip
    check(ProfileError, cost_arguments(batch_scaling, optimizer))
    _check_job(1, optimizer)
    model = load_profile(profile)
    numerics = (dtype or model.numerics[0], precision or model.numerics[1])
    check_numerics(*numerics, TrainConfigError, ("dtype", "precision"))
    mismatch = prediction_mismatch(shown(profile), model.numerics, numerics)
    if mismatch is not None:
        raise ProfileError(mismatch)
    spec = _model_of(model, profile, module)
    simulate(plan, model, cluster, batch_scaling=batch_scaling, optimizer=optimizer)  # every check of train --plan
    _check_job(len(plan.all_devices), optimizer)
    source = model.source
    assert source is not None
    if source.dataset == USER_DATA and data is None:
        raise TrainConfigError(
            f"profile {shown(profile)} was measured on your own samples (data=), which a profile does not record: give "
            "data='package.module:factory' again"
        )
    dataset = user_dataset(source.dataset, data, None, None)
    check_user_data(spec, dict(source.options), dataset, data=data, loss=loss, eval_fraction=eval_fraction,
                    evaluate=evaluate, seed=seed)  # fmt: skip
    from pipeplan.runtime.training.config_json import config_to_json
    from pipeplan.runtime.training.train_config import TrainConfig

    with job_files(profile=profile, cluster=cluster) as paths:
        config = TrainConfig(
            plan=plan, module=spec, module_options=tuple(sorted(dict(source.options).items())), dataset=dataset,
            steps=steps, lr=lr, optimizer=optimizer, seed=seed, timeout_s=timeout_s, profile=paths["profile"],
            cluster=paths["cluster"], batch_scaling=batch_scaling, warmup_steps=warmup_steps, dtype=numerics[0],
            precision=numerics[1], data=data, loss=loss, eval_fraction=eval_fraction, evaluate=evaluate, epochs=epochs,
        ).loaded()  # fmt: skip  # the profile and cluster read here, once: the workers are handed them
        # the job's TrainConfig as the workers run it; the MODULE_SPECs beside it, for the launcher to find first
        params = {"config": config_to_json(config), "module": spec, "options": dict(source.options), "data": data,
                  "loss": loss}  # fmt: skip
        out = run_local_job("train", len(plan.all_devices), params, steps, on_progress, timeout_s=timeout_s)
    return LocalRun(out["losses"], out["step_ms"], out["measured_step_ms"], out["predicted_step_ms"],
                    out["predicted_memory_bytes"], out["measured_memory_bytes"], out["schedule"],
                    out.get("evals", []))  # fmt: skip


def _model_of(model: ModelProfile, profile: ModelProfile | str, module: object) -> str:
    """The MODULE_SPEC of a profile's model: its recorded built-in, or the `module` the caller named, which must be
    the one it records (core.model_source).

    Raises:
        TrainConfigError: no source recorded, a module argument that is not a string, or core.model_source's refusal.
    """
    from pipeplan.core.model_source import model_to_build

    if model.source is None:
        raise TrainConfigError(f"profile {shown(profile)} does not record how its model was built: use profile_model's")
    if module is not None and not isinstance(module, str):
        raise TrainConfigError(f"module must be a MODULE_SPEC string, got {type(module).__name__}")
    spec = model_to_build(model.source, module, shown(profile), "module=")
    assert spec is not None
    return spec


def _check_job(processes: int, optimizer: object) -> None:
    """The process count fits this machine (runtime.options.check_local) and train knows the optimizer.

    Raises:
        TrainConfigError: naming nprocs (the processes a plan's devices need) or optimizer, and the value.
    """
    from pipeplan.runtime.options import OPTIMIZERS, check_local

    if not isinstance(optimizer, str) or optimizer not in OPTIMIZERS:
        raise TrainConfigError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    try:
        check_local(processes)
    except TrainConfigError as exc:
        raise TrainConfigError(str(exc).replace("--local", "nprocs", 1)) from None


def job_speaks(line: str) -> bool:
    """Whether this process of a torchrun or --local job is the one that says `line`, an error every rank meets
    (runtime.training.error_once.speaks, through the job's store): the CLI's one line per job, not one per rank."""
    from pipeplan.runtime.training.error_once import speaks

    return speaks(line)
