"""Simulating a plan through the API: one iteration of a plan on a profile and cluster, its memory checked."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeplan.api.arguments import PLAN, Flag, Instance, check, check_sources, cost_arguments, load_cluster, load_profile
from pipeplan.core.cluster import Cluster
from pipeplan.core.errors import PlanError, ProfileError
from pipeplan.core.plan import Plan
from pipeplan.core.profile import ModelProfile

if TYPE_CHECKING:
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

    `bandwidth_trace` is a core.bandwidth_trace.BandwidthTrace (or None); `record` keeps every action's span (for timelines).

    Raises:
        PlanError: `plan` is not a Plan, or does not match the profile or cluster.
        PlanDoesNotFit: with `check_memory`, a device cannot hold its stages.
        ProfileError: naming batch_scaling or optimizer and the value.
    """
    from pipeplan.core.bandwidth_trace import BandwidthTrace
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
