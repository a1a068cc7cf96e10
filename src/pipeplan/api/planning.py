"""Planning through the API: the request every planner takes (its arguments checked here, once), one planner's plan,
every planner compared, and what `pipeplan plan` and `compare` print (plan_outcome, compare_outcome)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pipeplan.api.arguments import (
    PROGRESS,
    Choice,
    Instance,
    Integer,
    Number,
    check,
    check_sources,
    cost_arguments,
    load_cluster,
    profile_of,
)
from pipeplan.core.errors import PlanError, ProfileError
from pipeplan.core.hardware.cluster import Cluster
from pipeplan.core.limits import Limit
from pipeplan.core.profile import ModelProfile
from pipeplan.planner.time_budget import DEFAULT_TIME_BUDGET_S

if TYPE_CHECKING:
    from pipeplan.planner.bound.plan_bound import PlanBound
    from pipeplan.planner.compare import Comparison, Row
    from pipeplan.planner.request import PlanRequest, PlanResult
    from pipeplan.planner.search.trace_aware import TraceScore

Progress = Callable[[str, float], None]
ZERO_STAGES = Limit(2, "", "the ZeRO stages are 0 (none), 1 (optimizer state) and 2 (and gradients)")
"""The most a request's `zero` may ask for."""


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
    time_budget_s: float | None = DEFAULT_TIME_BUDGET_S,
    tensor_parallel: int | None = None,
    zero: int | None = None,
    sequence_parallel: str = "auto",
) -> PlanRequest:
    """The planning problem every planner takes: model, cluster, global batch and the options of `pipeplan plan`.

    `time_budget_s` bounds each planner run's wall time: pipeplan's search returns the best plan found in it and says
    so in the result's extra["planning"] (planner.time_budget); 0 or None: no limit. `tensor_parallel` forces the
    tensor-parallel degree t and `zero` the ZeRO stage (PlanRequest; None: the planner chooses); `sequence_parallel`
    is auto (the faster by the cost model), on or off for stages with t > 1.

    Raises:
        PlanError, ProfileError, ClusterError: naming the bad argument and its value.
    """
    options = RequestOptions(microbatch_size, schedule, batch_scaling, optimizer, optimizer_factor, replication,
                             time_budget_s=time_budget_s, tensor_parallel=tensor_parallel, zero=zero,
                             sequence_parallel=sequence_parallel)  # fmt: skip
    return request_of(profile, cluster, global_batch, options)


@dataclass(frozen=True)
class RequestOptions:
    """plan_request's options, with what the command line adds: the batch a graph.txt profile was measured with,
    and `labels`, the flags that name the arguments in refusals (api.arguments.check); `time_budget_s` (seconds per
    planner run, 0 or None: no limit), then the forced tensor-parallel degree and ZeRO stage (None: chosen), and
    sequence parallelism (auto, on, off)."""

    microbatch_size: int | None = None
    schedule: str = "auto"
    batch_scaling: str = "auto"
    optimizer: str = "adam"
    optimizer_factor: float | None = None
    replication: str = "any"
    profile_batch_size: int | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    time_budget_s: float | None = DEFAULT_TIME_BUDGET_S
    tensor_parallel: int | None = None
    zero: int | None = None
    sequence_parallel: str = "auto"


def check_request(profile: object, cluster: object, global_batch: object, options: RequestOptions) -> None:
    """Every argument of a planning problem against its rule (the one place they are checked), before any file is
    read.

    Raises:
        PlanError, ProfileError, ClusterError: naming the bad argument (by its label) and its value.
    """
    from pipeplan.core.limits import OPTIMIZER_FACTOR, SAMPLES
    from pipeplan.core.plan import TP_DEGREE
    from pipeplan.planner.request import REPLICATION_CHOICES, SCHEDULE_CHOICES, SEQUENCE_PARALLEL_CHOICES

    o, labels = options, options.labels
    check_sources(profile, cluster)
    check(PlanError, {"global_batch": (global_batch, Integer(1, SAMPLES)),
                      "microbatch_size": (o.microbatch_size, Integer(1, SAMPLES, optional=True)),
                      "schedule": (o.schedule, Choice(SCHEDULE_CHOICES))}, labels)  # fmt: skip
    check(ProfileError, cost_arguments(o.batch_scaling, o.optimizer)
          | {"profile_batch_size": (o.profile_batch_size, Integer(1, optional=True))}, labels)  # fmt: skip
    factor = Number(0.0, limit=OPTIMIZER_FACTOR, optional=True, unit="state bytes per parameter byte")
    budget = Number(0.0, optional=True, unit="seconds; 0 or none: no limit")
    check(PlanError, {"optimizer_factor": (o.optimizer_factor, factor),
                      "replication": (o.replication, Choice(REPLICATION_CHOICES)),
                      "time_budget_s": (o.time_budget_s, budget),
                      "tensor_parallel": (o.tensor_parallel, Integer(1, TP_DEGREE, optional=True)),
                      "zero": (o.zero, Integer(0, ZERO_STAGES, optional=True)),
                      "sequence_parallel": (o.sequence_parallel, Choice(SEQUENCE_PARALLEL_CHOICES))}, labels)  # fmt: skip


def request_of(
    profile: ModelProfile | str, cluster: Cluster | str, global_batch: int, options: RequestOptions, checked: bool = False
) -> PlanRequest:
    """The PlanRequest of a planning problem, its arguments checked first (unless already `checked`).

    Raises:
        PlanError, ProfileError, ClusterError: naming the bad argument and its value.
    """
    from pipeplan.planner.request import PlanRequest

    if not checked:
        check_request(profile, cluster, global_batch, options)
    o = options
    return PlanRequest(profile_of(profile, o.profile_batch_size), load_cluster(cluster), global_batch, o.microbatch_size,
                       o.schedule, optimizer=o.optimizer, batch_scaling=o.batch_scaling,
                       optimizer_factor=o.optimizer_factor, replication=o.replication,
                       time_budget_s=o.time_budget_s, tensor_parallel=o.tensor_parallel, zero=o.zero,
                       sequence_parallel=o.sequence_parallel)  # fmt: skip


def run_planner(planner: str, request: PlanRequest, progress: Progress | None = None) -> PlanResult:
    """Run planner `planner` (pipeplan, dapple, pipedream, balanced, exact) on `request`.

    Raises:
        PlanError: naming an unknown planner, or why no plan fits.
    """
    from pipeplan.planner import planners
    from pipeplan.planner.request import PlanRequest

    check(PlanError, {"planner": (planner, Choice(tuple(sorted(planners.PLANNERS)))),
                      "request": (request, Instance((PlanRequest,), "a PlanRequest (plan_request's)")),
                      "progress": (progress, PROGRESS)})  # fmt: skip
    return planners.run_planner(planner, request, progress)


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
    replication, time_budget_s). The result holds `.plan`, `.iteration_time` (ms), `.memory_per_device` and `.sim`.

    Raises:
        PlanError, ProfileError, ClusterError: naming the bad argument and its value, or why no plan fits.
    """
    from pipeplan.planner import planners

    check(PlanError, {"planner": (planner, Choice(tuple(sorted(planners.PLANNERS)))), "progress": (progress, PROGRESS)})
    _check_option_names(options)
    return run_planner(planner, plan_request(profile, cluster, global_batch, **options), progress)


def _check_option_names(options: dict[str, Any]) -> None:
    """plan's and compare's `options` are plan_request's keyword arguments.

    Raises:
        PlanError: naming the first unknown option.
    """
    import inspect

    known = [n for n, p in inspect.signature(plan_request).parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    for name in options:
        if name not in known:
            raise PlanError(f"unknown option {name!r}; the options are {', '.join(known)}")


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

    def outcome(self, profile: str, cluster: str) -> ComparisonOutcome:
        """These rows as `compare` prints them, naming the profile and cluster as `profile` and `cluster` (no bounds)."""
        from pipeplan.planner.compare import Comparison

        return ComparisonOutcome(Comparison(profile, cluster, self.request.profile.name, self.request, self.rows))


def compare(
    profile: ModelProfile | str,
    cluster: Cluster | str,
    global_batch: int,
    *,
    planners: Sequence[str] | None = None,
    progress: Progress | None = None,
    **options: Any,
) -> PlannerComparison:
    """Run several planners (all registered when `planners` is None) on one problem (`pipeplan compare`); a
    time_budget_s option bounds each planner run on its own.

    Raises:
        PlanError: naming an unknown or repeated planner, or a bad option.
    """
    from pipeplan.planner.compare import compare as compare_planners
    from pipeplan.planner.compare import planner_names

    if planners is not None and (not isinstance(planners, list | tuple) or not all(isinstance(p, str) for p in planners)):
        raise PlanError(f"planners must be a list of planner names, got {planners!r}")
    check(PlanError, {"progress": (progress, PROGRESS)})
    _check_option_names(options)
    try:
        names = planner_names(list(planners) if planners is not None else None)
    except PlanError as exc:
        raise PlanError(f"planners {list(planners or [])!r}: {exc}") from None
    request = plan_request(profile, cluster, global_batch, **options)
    return PlannerComparison(request, list(compare_planners(request, names, progress)))


@dataclass(frozen=True)
class PlanOutcome:
    """plan_outcome's answer: the request, the plan chosen, and what the options added: the finalists' scores under a
    bandwidth trace with the idle-network choice they were weighed against, the lower bound of the plan's class."""

    request: PlanRequest
    result: PlanResult
    trace_scores: list[TraceScore] | None = None
    idle: PlanResult | None = None
    bound: PlanBound | None = None

    def to_json(self, profile: str, cluster: str) -> dict[str, Any]:
        """`plan --json`: the plan and its timings, with "bandwidth_trace" and "lower_bound" when measured."""
        obj = self.result.to_json(profile, cluster, self.request.profile)
        if self.trace_scores is not None and self.idle is not None:
            from pipeplan.planner.search.trace_aware import trace_json

            obj["bandwidth_trace"] = trace_json(self.trace_scores, self.idle)
        if self.bound is not None:
            obj["lower_bound"] = self.bound.to_json()
        return obj


def plan_outcome(
    profile: ModelProfile | str,
    cluster: Cluster | str,
    global_batch: int,
    options: RequestOptions,
    *,
    planner: str = "pipeplan",
    progress: Progress | None = None,
    bandwidth_trace: str | None = None,
    trace_iterations: int | None = None,
    adaptive: bool = False,
    memory_budget: float | None = None,
    bound: bool = False,
) -> PlanOutcome:
    """The plan `pipeplan plan` prints: planner `planner` on the request, then with `bandwidth_trace` (a trace file)
    the finalist with the least expected time under it (`trace_iterations` each, the controller within
    `memory_budget` bytes), with `adaptive` made kfkb with its adaptive setting, with `bound` its class's lower bound.

    Raises:
        PlanError, ProfileError, ClusterError, CostError: naming the bad argument (by its label) and its value,
            before planning; or why no plan fits.
    """
    from pipeplan.planner import planners
    from pipeplan.schedules.registry import no_k_to_adapt

    label = {n: options.labels.get(n, n) for n in ("trace_iterations", "bandwidth_trace", "memory_budget", "adaptive")}
    check_request(profile, cluster, global_batch, options)
    if trace_iterations is not None and (bandwidth_trace is None or trace_iterations < 1):
        raise PlanError(
            f"{label['trace_iterations']} needs {label['bandwidth_trace']} and an integer >= 1, got {trace_iterations}"
        )
    refusal = no_k_to_adapt(options.schedule) if adaptive and options.schedule != "auto" else None
    if refusal is not None:
        raise PlanError(refusal)
    if memory_budget is not None and not (adaptive or bandwidth_trace is not None):
        raise PlanError(
            f"{label['memory_budget']} bounds an adaptive setting's k; give {label['adaptive']} "
            f"(or {label['bandwidth_trace']}) too"
        )
    trace = None
    if bandwidth_trace is not None:
        from pipeplan.io.bandwidth_trace_json import read_bandwidth_trace

        trace = read_bandwidth_trace(bandwidth_trace)
        if trace_iterations is not None:  # the smallest finalists priced before planning; the real ones after it
            from pipeplan.planner.search.trace_aware import check_rescoring

            check_rescoring(None, trace, trace_iterations, label["trace_iterations"])
    model, machines = profile_of(profile, options.profile_batch_size), load_cluster(cluster)
    if trace is not None:
        trace.check_devices(machines.num_devices, f"cluster {cluster}")
    schedule = "kfkb" if adaptive else options.schedule
    request = request_of(model, machines, global_batch, dataclasses.replace(options, schedule=schedule), checked=True)
    result = planners.run_planner(planner, request, progress)
    scores = idle = None
    if trace is not None:
        from pipeplan.planner.search.trace_aware import choose_under_trace

        idle = result
        result, scores = choose_under_trace(result, request, trace, trace_iterations, memory_budget)
    if adaptive or (trace is not None and options.schedule in ("auto", "kfkb")):
        from pipeplan.planner.adaptive_plan import adaptive_plan, as_kfkb

        if adaptive or as_kfkb(result.plan) is not None:  # a budget below the plan's 1F1B peak: refused, nothing written
            result = adaptive_plan(result, request, memory_budget)
    measured = None
    if bound:
        from pipeplan.planner.bound.plan_bound import Bounds

        measured = Bounds(request).of(result.plan, result.iteration_time)
    return PlanOutcome(request, result, scores, idle, measured)


@dataclass(frozen=True)
class ComparisonOutcome:
    """compare_outcome's answer: every planner's row (planner.compare.Comparison: profile and cluster as given, the
    model's name, the request, the rows) and, when asked, each plan's lower bound of its class."""

    comparison: Comparison
    bounds: dict[str, PlanBound] | None = None

    @property
    def best(self) -> PlanResult | None:
        """The fastest plan found, or None when no planner found one."""
        from pipeplan.planner.compare import best_row

        return best_row(self.comparison.rows)

    def to_json(self) -> dict[str, Any]:
        """`compare --json`: one `plan --json` object per planner (with its "lower_bound" when measured), or its error."""
        obj = self.comparison.to_json()
        if self.bounds is not None:
            for entry in obj["results"]:
                if entry["planner"] in self.bounds:
                    entry["lower_bound"] = self.bounds[entry["planner"]].to_json()
        return obj


def compare_outcome(
    profile: str,
    cluster: str,
    global_batch: int,
    options: RequestOptions,
    *,
    planners: Sequence[str] | None = None,
    progress: Progress | None = None,
    bound: bool = False,
) -> ComparisonOutcome:
    """What `pipeplan compare` prints: the planners `planners` (all registered when None) on one problem, each plan
    with its class's lower bound when `bound`.

    Raises:
        PlanError, ProfileError, ClusterError: naming the bad argument (planners by its label) and its value.
    """
    from pipeplan.planner.compare import Comparison, planner_names
    from pipeplan.planner.compare import compare as compare_planners
    from pipeplan.planner.request import PlanResult

    check_request(profile, cluster, global_batch, options)
    try:
        names = planner_names(planners)
    except PlanError as exc:
        raise PlanError(f"{options.labels.get('planners', f'planners {planners!r}')}: {exc}") from None
    request = request_of(profile, cluster, global_batch, options, checked=True)
    run = Comparison(profile, cluster, request.profile.name, request, compare_planners(request, names, progress))
    measured = None
    if bound:
        from pipeplan.planner.bound.plan_bound import Bounds

        bounds = Bounds(request)
        measured = {r.planner: bounds.of(r.plan, r.iteration_time) for r in run.rows if isinstance(r, PlanResult)}
    return ComparisonOutcome(run, measured)
