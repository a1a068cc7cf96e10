"""Simulating a plan through the API: one iteration of a plan on a profile and cluster, its memory checked; a plan
file with the profile and cluster it records (`simulate --plan`, and every check `train --plan` runs); a plan file's
policies compared under a bandwidth trace (`adapt`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeplan.api.arguments import PLAN, Flag, Instance, check, check_sources, cost_arguments, load_cluster, load_profile
from pipeplan.core.errors import PlanError, ProfileError
from pipeplan.core.hardware.cluster import Cluster
from pipeplan.core.plan import Plan
from pipeplan.core.profile import ModelProfile

if TYPE_CHECKING:
    from pipeplan.adapt.decision import ControllerConfig
    from pipeplan.adapt.fixed_baselines import AdaptComparison
    from pipeplan.adapt.pipeline import PipelineModel
    from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace
    from pipeplan.sim.engine.iterations import IterationRun
    from pipeplan.sim.result import SimResult


class PlanDoesNotFit(PlanError):
    """simulate's memory check: the plan needs more memory than a device has (the message names stage, device, bytes)."""


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

    `bandwidth_trace` is a core.hardware.bandwidth_trace.BandwidthTrace (or None); `record` keeps every action's span
    (for timelines).

    Raises:
        PlanError: `plan` is not a Plan, or does not match the profile or cluster.
        PlanDoesNotFit: with `check_memory`, a device cannot hold its stages.
        ProfileError: naming batch_scaling or optimizer and the value.
    """
    from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace
    from pipeplan.sim.cost.memory import check_fits
    from pipeplan.sim.cost.model import CostModel
    from pipeplan.sim.cost.plan_costs import check_plan_matches
    from pipeplan.sim.plan_sim import simulate_plan

    check(PlanError, {"plan": (plan, PLAN)})
    check_sources(profile, cluster)
    trace = Instance((BandwidthTrace,), "a BandwidthTrace or None", optional=True)
    flags = {"bandwidth_trace": (bandwidth_trace, trace), "record": (record, Flag()), "check_memory": (check_memory, Flag())}
    check(PlanError, flags)
    check(ProfileError, cost_arguments(batch_scaling, optimizer))
    model = CostModel.build(load_profile(profile), load_cluster(cluster), batch_scaling, optimizer)
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


def plan_sources(command: str, profile: str | None, cluster: str | None, names: dict[str, str]) -> tuple[str, str]:
    """A plan file's profile and cluster: the ones given, else the names the plan file records.

    Raises:
        PlanError: naming `command` (e.g. "adapt --plan p.json") and every flag still missing.
    """
    profile = profile or names.get("profile") or None
    cluster = cluster or names.get("cluster") or None
    missing = [flag for flag, value in (("--profile", profile), ("--cluster", cluster)) if value is None]
    if missing:
        raise PlanError(f"{command} also needs {' and '.join(missing)} (a file path or a built-in name)")
    assert profile is not None and cluster is not None
    return profile, cluster


def _split_backward_actions(plan: Plan) -> int:
    """Actions per stage and microbatch of the plan's schedule: 3 with a split backward (F, I, W), else 2."""
    from pipeplan.schedules.registry import TABLE

    facts = TABLE.get(plan.schedule)
    return 3 if facts is not None and facts.split_backward else 2


def simulate_plan_file(
    plan_path: str,
    profile: str | None,
    cluster: str | None,
    trace: Any,
    record: bool,
    scaling: str,
    optimizer: str,
    check_memory: bool = True,
    profile_batch_size: int | None = None,
    remedy: str = "--ignore-memory simulates it anyway",
    iterations: int | None = None,
) -> tuple[SimResult, IterationRun | None]:
    """Read a plan file with its profile and cluster, and simulate it under the cost model of `scaling` and `optimizer`
    (`pipeplan simulate --plan`); `trace` is a bandwidth trace file path, a BandwidthTrace or None.

    Without `profile` or `cluster`, the names the plan file records are used. This is every check of a plan against
    its profile and cluster (layers, devices, replicas, schedule, memory): `train --plan` runs it too, before any
    process starts; `remedy` ends the memory error's message. With `iterations`, also the run of that many iterations
    on the trace's clock.

    Raises:
        PlanError: naming the plan file; also when the plan needs more memory than a device has (unless not
            `check_memory`).
    """
    from pipeplan.api.arguments import profile_of
    from pipeplan.api.scheduling import check_iteration_count, check_iterations, check_timeline
    from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace
    from pipeplan.io.bandwidth_trace_json import read_bandwidth_trace
    from pipeplan.presets.resolve import load_plan
    from pipeplan.sim.cost.layers import check_optimizer, check_scaling

    check_iteration_count(iterations)
    bandwidth = read_bandwidth_trace(trace) if isinstance(trace, str) else trace
    the_plan, names = load_plan(plan_path, profile, profile_batch_size)
    per = _split_backward_actions(the_plan)
    if record:
        check_timeline(per * len(the_plan.stages) * the_plan.microbatches, f"plan {plan_path}")
    if iterations is not None:  # an upper bound (every flow a boundary's devices may carry), before any simulation
        from pipeplan.core.work import plan_events

        events = plan_events([len(s.devices) for s in the_plan.stages], the_plan.microbatches, per)
        check_iterations(f"plan {plan_path}", iterations, events, bandwidth)
    profile, cluster = plan_sources(f"simulate --plan {plan_path}", profile, cluster, names)
    model_profile, machines = profile_of(profile, profile_batch_size), load_cluster(cluster)
    check_scaling(scaling)  # named as flags, before the API names them as arguments
    check_optimizer(optimizer)
    if isinstance(bandwidth, BandwidthTrace):
        bandwidth.check_devices(machines.num_devices, f"cluster {cluster}")
    else:
        bandwidth = None
    result = simulate_read_plan(the_plan, plan_path, model_profile, machines, scaling, optimizer, bandwidth=bandwidth,
                                record=record, check_memory=check_memory, remedy=remedy)  # fmt: skip
    run = None
    if iterations is not None:
        from pipeplan.schedules.plan_schedule import plan_schedule
        from pipeplan.sim.cost.model import CostModel
        from pipeplan.sim.cost.plan_costs import plan_costs
        from pipeplan.sim.engine.iterations import simulate_iterations

        model = CostModel.build(model_profile, machines, scaling, optimizer)
        run = simulate_iterations(plan_schedule(the_plan), plan_costs(the_plan, model, bandwidth), bandwidth, iterations)
    return result, run


def simulate_read_plan(
    plan: Plan,
    plan_path: str,
    profile: ModelProfile,
    cluster: Cluster,
    scaling: str,
    optimizer: str,
    *,
    bandwidth: BandwidthTrace | None = None,
    record: bool = False,
    check_memory: bool = True,
    remedy: str = "--ignore-memory simulates it anyway",
) -> SimResult:
    """Plan file `plan_path`'s `plan`, already read with its profile and cluster, checked against them and simulated
    (simulate_plan_file's checks and simulation; `train --plan` runs it on the values its launcher read).

    Raises:
        PlanError: naming the plan file; also when the plan needs more memory than a device has (unless not
            `check_memory`), its message ended by `remedy`.
    """
    try:
        return simulate(plan, profile, cluster, batch_scaling=scaling, optimizer=optimizer, bandwidth_trace=bandwidth,
                        record=record, check_memory=check_memory)  # fmt: skip
    except PlanDoesNotFit as exc:
        raise PlanError(f"plan {plan_path} does not fit: {exc}; {remedy}") from None
    except PlanError as exc:
        raise PlanError(f"{plan_path}: {exc}") from None


@dataclass(frozen=True)
class AdaptRun:
    """adapt_policies' answer: every policy's run compared, with the pipeline and trace they ran on (for the plot)."""

    comparison: AdaptComparison
    pipeline: PipelineModel
    trace: BandwidthTrace


def adapt_policies(
    plan_path: str,
    bandwidth_trace: str,
    iterations: int,
    *,
    profile: str | None = None,
    cluster: str | None = None,
    switch_ms: float = 0.0,
    gain_threshold: float = 0.02,
    batch_scaling: str = "auto",
    optimizer: str = "adam",
    profile_batch_size: int | None = None,
    memory_budget: float | None = None,
) -> AdaptRun:
    """The adaptive controller, fixed 1F1B, GPipe, every fixed k and the oracle on a plan file under a bandwidth trace
    file (`pipeplan adapt`); `memory_budget` (bytes) overrides the plan's adaptive setting's.

    Raises:
        AdaptError: iterations < 1, a trace that touches none of the plan's links, a budget below 1F1B's peak.
        PlanError, CostError, ProfileError: the plan file, the trace or the cost model's choices, named.
    """
    from pipeplan.adapt.controller import ControllerConfig
    from pipeplan.adapt.fixed_baselines import compare_policies
    from pipeplan.adapt.pipeline import PipelineModel
    from pipeplan.api.arguments import profile_of
    from pipeplan.core.errors import AdaptError
    from pipeplan.io.bandwidth_trace_json import read_bandwidth_trace
    from pipeplan.presets.resolve import load_plan
    from pipeplan.sim.cost.memory import check_fits
    from pipeplan.sim.cost.model import CostModel

    if iterations < 1:
        raise AdaptError(f"--iterations must be an integer >= 1, got {iterations}")
    base = ControllerConfig(gain_threshold=gain_threshold, switch_ms=switch_ms)
    trace = read_bandwidth_trace(bandwidth_trace)
    the_plan, names = load_plan(plan_path, profile, profile_batch_size)
    profile, cluster = plan_sources(f"adapt --plan {plan_path}", profile, cluster, names)
    model = CostModel.build(profile_of(profile, profile_batch_size), load_cluster(cluster), batch_scaling, optimizer)
    pipeline = PipelineModel.from_plan(the_plan, model, trace)
    _check_trace_links(trace, pipeline, model.cluster.num_devices, cluster)
    check_fits(the_plan, model)
    config = _controller_config(the_plan, plan_path, pipeline, memory_budget, base)
    return AdaptRun(compare_policies(pipeline, trace, iterations, config, flag="--iterations"), pipeline, trace)


def adapt_plan(
    plan: Plan, profile: ModelProfile | str, cluster: Cluster | str, trace: BandwidthTrace, iterations: int
) -> AdaptRun:
    """The adaptive controller (its default setting: each device's memory limit), fixed 1F1B, GPipe, every fixed k and
    the oracle on `plan` under `trace`, priced on `profile` and `cluster` (the demo's Ada-Grouper step).

    Raises:
        PlanError: `plan` is not a Plan; ProfileError, ClusterError: a bad profile or cluster.
        AdaptError: iterations below 1 or more than core.limits allows.
    """
    from pipeplan.adapt.fixed_baselines import compare_policies
    from pipeplan.adapt.pipeline import PipelineModel
    from pipeplan.sim.cost.model import CostModel

    check(PlanError, {"plan": (plan, PLAN)})
    check_sources(profile, cluster)
    pipeline = PipelineModel.from_plan(plan, CostModel.build(load_profile(profile), load_cluster(cluster)), trace)
    return AdaptRun(compare_policies(pipeline, trace, iterations), pipeline, trace)


def _check_trace_links(trace: BandwidthTrace, pipeline: PipelineModel, devices: int, cluster: str) -> None:
    """A trace must name devices of the cluster, and some step must touch a link the plan's traffic uses (its
    transfers and its all-reduce rings, PipelineModel.traffic_links; a trace written for the whole cluster may name
    more; one that touches none of the plan's would change nothing).

    Raises:
        CostError: a device beyond the cluster.
        AdaptError: no step names "all" or a link of the plan, naming the plan's links.
    """
    from pipeplan.core.errors import AdaptError

    trace.check_devices(devices, f"cluster {cluster}")
    used = set(pipeline.traffic_links)
    if trace.steps and not any(step.link is None or step.link in used for step in trace.steps):
        known = ", ".join(f"{a}-{b}" for a, b in pipeline.traffic_links) or "none: one stage"
        rings = " or its all-reduce rings" if len(used) > len(pipeline.flows) else ""
        raise AdaptError(
            f"bandwidth trace: no step names a link the plan's transfers{rings} use, so it would change nothing "
            f"(the plan's links: {known})"
        )


def _controller_config(
    plan: Plan, path: str, pipeline: PipelineModel, given: float | None, base: ControllerConfig
) -> ControllerConfig:
    """`base` with the plan's adaptive setting: its memory budget, k_choices and start k (plan.k) when it has one;
    --memory-budget (`given`) overrides the budget, and then the k that fit it are the candidates and the best at
    nominal bandwidth starts. Without either, the default budget (adapt.budget.resolve_budget).

    Raises:
        AdaptError: a budget below 1F1B's peak, naming --memory-budget or the plan's field, the peak, stage and excess.
    """
    import dataclasses

    from pipeplan.adapt.budget import resolve_budget

    setting = plan.adaptive
    if given is not None or setting is None:
        budget = resolve_budget(pipeline, given, "--memory-budget")
        return dataclasses.replace(base, memory_budget_bytes=budget)
    budget = resolve_budget(pipeline, setting.memory_budget_bytes, f"plan {path} adaptive.memory_budget_bytes")
    return dataclasses.replace(base, memory_budget_bytes=budget, k_choices=setting.k_choices, initial_k=plan.k)
