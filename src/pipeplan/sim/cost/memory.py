"""Memory in the cost model: peak activation bytes from a rank's order, bytes per device, and whether a plan fits."""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter, itemgetter

from pipeplan.core.errors import PlanError
from pipeplan.core.hardware.cluster import Cluster
from pipeplan.core.plan import Plan
from pipeplan.core.schedule import Schedule
from pipeplan.schedules.plan_schedule import plan_schedule
from pipeplan.sim.cost.held import peak_held
from pipeplan.sim.cost.model import CostModel
from pipeplan.sim.cost.plan_costs import plan_costs
from pipeplan.sim.cost.shared import copies_note
from pipeplan.sim.cost.types import Costs
from pipeplan.sim.result import SimResult

GIB = float(1 << 30)


def order_peak_activation(schedule: Schedule, saved_bytes: Sequence[float]) -> tuple[float, ...]:
    """Peak activation bytes per rank, from each rank's order (peak_held)."""
    return tuple(peak_held(((a.stage, a.op) for a in actions), saved_bytes) for actions in schedule.ranks)


def rank_memory(plan: Plan, costs: Costs, schedule: Schedule) -> tuple[float, ...]:
    """Peak bytes per rank: static bytes of all its (chunk-)stages plus its activation peak under `schedule`."""
    p = plan.num_ranks
    static = [0.0] * p
    for s, cost in enumerate(costs.stages):
        static[s % p] += cost.static_bytes
    activation = order_peak_activation(schedule, tuple(c.saved_bytes for c in costs.stages))
    return tuple(static[r] + activation[r] for r in range(p))


def memory_excess(plan: Plan, cluster: Cluster, per_rank: Sequence[float]) -> tuple[float, int, int]:
    """(largest bytes over capacity on any device of the plan, its rank, that device); <= 0 when the plan fits.

    Ties keep the first rank and device in plan order.
    """
    worst, worst_rank, worst_device = -float("inf"), -1, -1
    for rank in range(plan.num_ranks):
        stage_devices = plan.stages[rank].devices
        capacity = device_memories(cluster, stage_devices)
        need = per_rank[rank]
        least = min(capacity)
        excess = need - least  # the rank's largest excess: subtraction rounds monotonically
        if excess > worst:
            # its first device in plan order (one with more memory may round to the same excess)
            first = capacity.index(least)
            first = next((i for i in range(first) if need - capacity[i] == excess), first)
            worst, worst_rank, worst_device = excess, rank, stage_devices[first]
    return worst, worst_rank, worst_device


def device_memories(cluster: Cluster, devices: tuple[int, ...]) -> list[float]:
    """memory_bytes of each of `devices`, in order (whole-tuple lookups: a stage may span thousands of devices)."""
    if len(devices) == 1:
        return [cluster.devices[devices[0]].memory_bytes]
    return list(map(_MEMORY, itemgetter(*devices)(cluster.devices)))


_MEMORY = attrgetter("memory_bytes")


def per_device(plan: Plan, cluster: Cluster, per_rank: Sequence[float]) -> tuple[float, ...]:
    """Per-rank bytes spread onto every cluster device (0 for devices the plan leaves unused)."""
    memory = [0.0] * cluster.num_devices
    for rank in range(plan.num_ranks):
        for d in plan.stages[rank].devices:
            memory[d] = per_rank[rank]
    return tuple(memory)


def fit_error(plan: Plan, cluster: Cluster, per_rank: Sequence[float], what: str) -> PlanError | None:
    """The PlanError of the device that overflows the most (naming stage, device, need, capacity, excess), or None."""
    excess, rank, d = memory_excess(plan, cluster, per_rank)
    if excess <= 0:
        return None
    device = cluster.devices[d]
    return PlanError(
        f"stage {rank} needs {per_rank[rank] / GIB:.2f} GiB on device {d} ({device.kind}, "
        f"{device.memory_bytes / GIB:.2f} GiB): {excess / GIB:.2f} GiB too much "
        f"({what}, microbatch size {plan.microbatch_size}, schedule {plan.schedule})"
    )


def result_memory(plan: Plan, result: SimResult) -> tuple[float, ...]:
    """Per-rank peak memory of a simulation of `plan` at its full microbatch count.

    Raises:
        PlanError: the result has another number of ranks.
    """
    if len(result.per_rank) != plan.num_ranks:
        raise PlanError(f"simulation result has {len(result.per_rank)} ranks but the plan has {plan.num_ranks}")
    return tuple(r.peak_memory_bytes for r in result.per_rank)


def memory_per_device(plan: Plan, model: CostModel, result: SimResult | None = None) -> tuple[float, ...]:
    """Peak bytes on every cluster device (0 for devices the plan leaves unused).

    Every (chunk-)stage's static bytes on the device (param_bytes_s x static_factor, or its ZeRO share:
    sim.cost.holding),
    plus the peak of in-flight microbatches' saved bytes (per replica).

    Args:
        result: a simulation of this plan with its full microbatch count; when
            given, its per-rank peak memory is used. When None, the peak is
            taken from the schedule's order (the same value: a rank runs its
            actions one at a time, so in-flight counts do not depend on timing).
    """
    if result is not None:
        per_rank = result_memory(plan, result)
    else:
        per_rank = rank_memory(plan, plan_costs(plan, model), plan_schedule(plan))
    return per_device(plan, model.cluster, per_rank)


def check_fits(plan: Plan, model: CostModel, result: SimResult | None = None) -> tuple[float, ...]:
    """Return memory_per_device, or raise PlanError for the device that overflows the most.

    Raises:
        PlanError: naming the stage, device, need and capacity in GiB and the excess (and the shared parameters the
            stage holds a copy of).
    """
    if result is not None:
        per_rank = result_memory(plan, result)
    else:
        per_rank = rank_memory(plan, plan_costs(plan, model), plan_schedule(plan))
    error = fit_error(plan, model.cluster, per_rank, model.profile.name)
    if error is not None:
        rank = memory_excess(plan, model.cluster, per_rank)[1]
        stages = [s for s in range(len(plan.stages)) if s % plan.num_ranks == rank]
        note = copies_note(plan, model.profile, model.optimizer_factor, stages)  # why a shared weight weighs there
        raise PlanError(f"{error}{note}") if note else error
    return per_device(plan, model.cluster, per_rank)
