"""pipeplan's Python API: every CLI command is a thin layer over these functions (docs/api.md has the example).

Planning and simulation need no torch (`import pipeplan` stays torch-free); `profile_model`, `stage_modules`,
`pipeline`, `probe_local` and `train_local` import it when called. A bad argument raises the typed error the CLI
prints (core.errors), in one line naming the argument and the value. Times are ms, sizes bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeplan.core.cluster import Cluster
from pipeplan.core.errors import PlanError, ProfileError, TrainConfigError
from pipeplan.core.plan import Plan
from pipeplan.core.profile import ModelProfile

if TYPE_CHECKING:
    from torch import nn

    from pipeplan.planner.compare import Row
    from pipeplan.planner.request import PlanRequest, PlanResult
    from pipeplan.runtime.execution.in_process import InProcessPipeline
    from pipeplan.sim.result import SimResult

__all__ = [
    "LocalRun", "PlanDoesNotFit", "PlannerComparison", "compare", "load_cluster", "load_profile", "pipeline", "plan",
    "plan_request", "probe_local", "profile_model", "run_planner", "save_plan", "save_profile", "simulate",
    "stage_modules", "train_local",
]  # fmt: skip

Progress = Callable[[str, float], None]


class PlanDoesNotFit(PlanError):
    """simulate's memory check: the plan needs more memory than a device has (the message names stage, device, bytes)."""


def _check_costs(batch_scaling: object, optimizer: object) -> None:
    """batch_scaling and optimizer are ones the cost model knows.

    Raises:
        ProfileError: naming the argument and its value.
    """
    from pipeplan.sim.cost.layers import OPTIMIZER_STATE, SCALINGS

    for name, value, known in (("batch_scaling", batch_scaling, SCALINGS), ("optimizer", optimizer, OPTIMIZER_STATE)):
        if not isinstance(value, str) or value not in known:
            raise ProfileError(f"{name} must be one of {', '.join(known)}, got {value!r}")


def load_profile(profile: ModelProfile | str) -> ModelProfile:
    """A profile value as given, or read from a file path or a built-in name (`pipeplan show profiles`).

    Raises:
        ProfileError: naming `profile` and the value (an unknown name lists close matches).
    """
    if isinstance(profile, ModelProfile):
        return profile
    from pipeplan.presets.resolve import load_profile as resolve

    return resolve(profile)


def load_cluster(cluster: Cluster | str) -> Cluster:
    """A cluster value as given, or read from a file path or a built-in name (`pipeplan show clusters`).

    Raises:
        ClusterError: naming `cluster` and the value.
    """
    if isinstance(cluster, Cluster):
        return cluster
    from pipeplan.presets.resolve import load_cluster as resolve

    return resolve(cluster)


def plan_request(
    profile: ModelProfile | str,
    cluster: Cluster | str,
    global_batch: int,
    *,
    microbatch_size: int | None = None,
    schedule: str = "auto",
    batch_scaling: str = "auto",
    optimizer: str = "adam",
    optimizer_factor: float | None = None,
    replication: str = "any",
) -> PlanRequest:
    """The planning problem every planner takes: model, cluster, global batch and the options of `pipeplan plan`.

    Raises:
        PlanError, ProfileError, ClusterError: naming the bad argument and its value.
    """
    from pipeplan.core.limits import OPTIMIZER_FACTOR
    from pipeplan.planner.request import PlanRequest

    if optimizer_factor is not None:
        if isinstance(optimizer_factor, bool) or not isinstance(optimizer_factor, int | float) or not optimizer_factor >= 0:
            raise PlanError(f"optimizer_factor must be a finite number >= 0, got {optimizer_factor!r}")
        OPTIMIZER_FACTOR.check(PlanError, "optimizer_factor", optimizer_factor)
    _check_costs(batch_scaling, optimizer)
    return PlanRequest(load_profile(profile), load_cluster(cluster), global_batch, microbatch_size, schedule,
                       optimizer=optimizer, batch_scaling=batch_scaling, optimizer_factor=optimizer_factor,
                       replication=replication)  # fmt: skip


def run_planner(planner: str, request: PlanRequest, progress: Progress | None = None) -> PlanResult:
    """Run planner `planner` (pipeplan, dapple, pipedream, balanced, exact) on `request`.

    Raises:
        PlanError: naming an unknown planner, or why no plan fits.
    """
    from pipeplan.planner import registry

    if not isinstance(planner, str):
        raise PlanError(f"unknown planner {planner!r}; choose one of {', '.join(sorted(registry.PLANNERS))}")
    return registry.run_planner(planner, request, progress)


def plan(
    profile: ModelProfile | str,
    cluster: Cluster | str,
    global_batch: int,
    *,
    planner: str = "pipeplan",
    progress: Progress | None = None,
    **options: Any,
) -> PlanResult:
    """The fastest plan that fits: stages, devices, replicas, microbatches and schedule (`pipeplan plan`).

    `options` are plan_request's (microbatch_size, schedule, batch_scaling, optimizer, optimizer_factor,
    replication). The result holds `.plan`, `.iteration_time` (ms), `.memory_per_device` and `.sim`.

    Raises:
        PlanError, ProfileError, ClusterError: naming the bad argument and its value, or why no plan fits.
    """
    return run_planner(planner, plan_request(profile, cluster, global_batch, **options), progress)


@dataclass(frozen=True)
class PlannerComparison:
    """Every planner's row on one request (a PlanResult, or a PlannerFailure with its reason), all simulated alike."""

    request: PlanRequest
    rows: list[Row]

    @property
    def best(self) -> PlanResult | None:
        """The fastest plan found, or None when no planner found one."""
        from pipeplan.planner.compare import best_row

        return best_row(self.rows)


def compare(
    profile: ModelProfile | str,
    cluster: Cluster | str,
    global_batch: int,
    *,
    planners: Sequence[str] | None = None,
    progress: Progress | None = None,
    **options: Any,
) -> PlannerComparison:
    """Run several planners (all registered when `planners` is None) on one problem (`pipeplan compare`).

    Raises:
        PlanError: naming an unknown or repeated planner, or a bad option.
    """
    from pipeplan.planner.compare import compare as compare_planners
    from pipeplan.planner.compare import planner_names

    if planners is not None and (isinstance(planners, str) or not all(isinstance(p, str) for p in planners)):
        raise PlanError(f"planners must be a list of planner names, got {planners!r}")
    try:
        names = planner_names(list(planners) if planners is not None else None)
    except PlanError as exc:
        raise PlanError(f"planners {list(planners or [])!r}: {exc}") from None
    request = plan_request(profile, cluster, global_batch, **options)
    return PlannerComparison(request, list(compare_planners(request, names, progress)))


def simulate(
    plan: Plan,
    profile: ModelProfile | str,
    cluster: Cluster | str,
    *,
    batch_scaling: str = "auto",
    optimizer: str = "adam",
    bandwidth_trace: Any = None,
    record: bool = False,
    check_memory: bool = True,
) -> SimResult:
    """Simulate one iteration of `plan` on `profile` and `cluster` (`pipeplan simulate --plan`).

    `bandwidth_trace` is a sim.trace.BandwidthTrace (or None); `record` keeps every action's span (for timelines).

    Raises:
        PlanError: `plan` is not a Plan, or does not match the profile or cluster.
        PlanDoesNotFit: with `check_memory`, a device cannot hold its stages.
        ProfileError: naming batch_scaling or optimizer and the value.
    """
    from pipeplan.sim.cost.memory import check_fits
    from pipeplan.sim.cost.model import CostModel
    from pipeplan.sim.cost.plan_costs import check_plan_matches
    from pipeplan.sim.plan_sim import simulate_plan
    from pipeplan.sim.trace import BandwidthTrace

    if not isinstance(plan, Plan):
        raise PlanError(f"plan must be a Plan (api.plan(...).plan, or presets.resolve.load_plan), got {_given(plan)}")
    _check_costs(batch_scaling, optimizer)
    model = CostModel.build(load_profile(profile), load_cluster(cluster), batch_scaling, optimizer)
    if bandwidth_trace is not None and not isinstance(bandwidth_trace, BandwidthTrace):
        raise PlanError(f"bandwidth_trace must be a BandwidthTrace or None, got {_given(bandwidth_trace)}")
    if bandwidth_trace is not None:
        bandwidth_trace.check_devices(model.cluster.num_devices, f"cluster {model.cluster.name}")
    check_plan_matches(plan, model)
    result = simulate_plan(plan, model, trace=bandwidth_trace, record=record)
    if check_memory:
        try:
            check_fits(plan, model, result)
        except PlanError as exc:
            raise PlanDoesNotFit(str(exc)) from None
    return result


def save_plan(plan: Plan, path: str, profile: str, cluster: str) -> None:
    """Write a plan file naming its profile and cluster (a file path, kept relative to the plan, or a built-in name).

    Raises:
        PlanError: `profile` or `cluster` is not a name or path (a value has none: save it first).
    """
    from pipeplan.io.plan_json import write_plan

    if not isinstance(plan, Plan):
        raise PlanError(f"plan must be a Plan, got {_given(plan)}")
    for name, value in (("profile", profile), ("cluster", cluster)):
        if not isinstance(value, str) or not value:
            raise PlanError(f"{name} must be the file path or built-in name the plan file records, got {_given(value)}")
    write_plan(plan, path, profile, cluster)


def save_profile(profile: ModelProfile, path: str) -> None:
    """Write a profile file (pipeplan.profile JSON), whole or not at all: what `--profile` reads.

    Raises:
        ProfileError: `profile` is not a ModelProfile.
    """
    from pipeplan.io.profile_json import write_profile_json

    if not isinstance(profile, ModelProfile):
        raise ProfileError(f"profile must be a ModelProfile (profile_model's), got {_given(profile)}")
    write_profile_json(profile, path)


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
) -> ModelProfile:
    """Measure MODULE_SPEC layer by layer at several batch sizes, or project it onto a GPU (`pipeplan profile`; torch).

    `options` are the factory's (hidden=512); `dataset` fixes the layers as training builds them (digits, sample or
    auto); without `batch_sizes`, powers of two up to batch_size. `project_to` (A100, H100, ...) counts FLOPs and
    bytes on the meta device instead of measuring. `device` is where to measure (cpu, cuda, cuda:N).

    Raises:
        ProfileError: naming the bad argument and its value.
    """
    from pipeplan.core.limits import BATCH, ROUNDS, THREADS
    from pipeplan.profiler.session import profile_spec

    for name, value, low, limit in (("batch_size", batch_size, 1, BATCH), ("runs", runs, 0 if project_to else 1, ROUNDS),
                                    ("warmup", warmup, 0, ROUNDS), ("threads", threads, 1, THREADS)):  # fmt: skip
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ProfileError(f"{name} must be an integer >= {low}, got {value!r}")
        limit.check(ProfileError, name, value)
    if not isinstance(module_spec, str) or not module_spec:
        raise ProfileError(f"module_spec must be a built-in name or package.module:factory, got {module_spec!r}")
    return profile_spec(module_spec, batch_size, dict(options or {}), dataset, batch_sizes, project_to, dtype, efficiency,
                        runs, warmup, threads, progress, device)  # fmt: skip


def stage_modules(model: nn.Module | Sequence[nn.Module], plan: Plan) -> list[nn.Sequential]:
    """The plan's (chunk-)stages of `model` (an nn.Sequential or a list of layers) as nn.Sequentials sharing its layers.

    Raises:
        PlanError: naming `model` when it is not a chain, or its layer count is not the plan's.
    """
    from pipeplan.runtime.execution.in_process import split_layers

    if not isinstance(plan, Plan):
        raise PlanError(f"plan must be a Plan, got {_given(plan)}")
    return split_layers(model, plan)


def pipeline(model: nn.Module | Sequence[nn.Module], plan: Plan, loss_fn: Callable[..., Any]) -> InProcessPipeline:
    """The plan's schedule in your own loop: `pipe.step(inputs, targets)` runs one iteration in this process.

    Every rank's actions run in their order, interleaved as their messages allow, activations and gradients handed
    over in memory: the losses and gradients of the distributed run, not its timing (one process does all the work).
    Step your optimizer after it. On several processes, `train_local` (or `pipeplan train`) runs the plan.

    Raises:
        PlanError: naming `model`, `plan` or `loss_fn` when it does not fit.
    """
    from pipeplan.runtime.execution.in_process import InProcessPipeline

    if not isinstance(plan, Plan):
        raise PlanError(f"plan must be a Plan, got {_given(plan)}")
    return InProcessPipeline(model, plan, loss_fn)


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
) -> Cluster:
    """Start `nprocs` processes here and measure them as a cluster (`pipeplan probe --local N`; torch).

    With `out`, the cluster file is written there too (pipeplan.cluster/1, with the probe's notes).

    With a profile from `profile_model` (a measured one, which records how its model was built), each process's
    speed is measured against it and the messages' costs are fitted. One thread per process, as training runs.

    Raises:
        TrainConfigError: naming the bad argument and its value.
        RuntimeFault: a process failed (its reason printed on stderr).
    """
    from pipeplan.io.cluster_json import cluster_from_json
    from pipeplan.runtime.training.local_jobs import job_files, run_local_job

    for arg, value in (("nprocs", nprocs), ("steps", steps), ("rounds", rounds)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TrainConfigError(f"{arg} must be an integer >= 1, got {value!r}")
    _check_job(nprocs, optimizer)
    with job_files(profile=profile) as paths:
        if profile is not None and load_profile(paths["profile"]).source is None:
            raise TrainConfigError(f"profile {_shown(profile)} does not record how its model was built: use profile_model's")
        params = {"profile": paths.get("profile"), "steps": steps, "rounds": rounds, "timeout_s": timeout_s,
                  "optimizer": optimizer, "threads": 1, "name": name}  # fmt: skip
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
) -> LocalRun:
    """Train the model `profile` was measured on with `plan`, one local process per device (`pipeplan train --local`).

    The plan's step is predicted from `profile` and `cluster` before the first step, as `pipeplan train --plan` does.

    Raises:
        TrainConfigError: naming the bad argument and its value.
        PlanError: the plan does not match the profile or cluster, or does not fit.
        RuntimeFault: a process failed (its reason printed on stderr).
    """
    from pipeplan.runtime.training.local_jobs import job_files, run_local_job

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise TrainConfigError(f"steps must be an integer >= 1, got {steps!r}")
    _check_job(1, optimizer)
    model = load_profile(profile)
    if model.source is None:
        raise TrainConfigError(f"profile {_shown(profile)} does not record how its model was built: use profile_model's")
    simulate(plan, model, cluster, batch_scaling=batch_scaling, optimizer=optimizer)  # every check of train --plan
    _check_job(len(plan.all_devices), optimizer)
    with job_files(profile=profile, cluster=cluster, plan=plan) as paths:
        source = model.source
        params = {"plan": paths["plan"], "profile": paths["profile"], "cluster": paths["cluster"], "steps": steps,
                  "lr": lr, "optimizer": optimizer, "seed": seed, "timeout_s": timeout_s, "batch_scaling": batch_scaling,
                  "warmup_steps": warmup_steps, "module": source.module, "options": dict(source.options),
                  "dataset": source.dataset}  # fmt: skip
        out = run_local_job("train", len(plan.all_devices), params, steps, on_progress, timeout_s=timeout_s)
    return LocalRun(out["losses"], out["step_ms"], out["measured_step_ms"], out["predicted_step_ms"],
                    out["predicted_memory_bytes"], out["measured_memory_bytes"], out["schedule"])  # fmt: skip


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


def _given(value: object) -> str:
    """A wrong-typed argument as a message shows it: its type, and its repr when short (42, 'plan.json')."""
    text = repr(value) if isinstance(value, int | float | str | bytes | type(None)) else ""
    return type(value).__name__ + (f" {text[:60]}" if text else "")


def _shown(value: object) -> str:
    """A profile or cluster argument as a message shows it: its name, or the path given."""
    return repr(value) if isinstance(value, str) else repr(getattr(value, "name", type(value).__name__))
