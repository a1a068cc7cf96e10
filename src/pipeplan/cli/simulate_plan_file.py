"""simulate --plan: a plan file with its profile and cluster simulated through the API, every check of a plan
against them on the way (train --plan runs it too)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeplan.cli.flags import plan_profile_and_cluster
from pipeplan.cli.simulate_schedule import check_iterations, check_timeline
from pipeplan.core.errors import PlanError
from pipeplan.schedules.registry import TABLE

if TYPE_CHECKING:
    from pipeplan.sim.engine.iterations import IterationRun
    from pipeplan.sim.result import SimResult


def simulate_plan_file(
    plan_path: str,
    profile: str | None,
    cluster: str | None,
    trace: object,
    record: bool,
    scaling: str,
    optimizer: str,
    check_memory: bool = True,
    profile_batch_size: int | None = None,
    remedy: str = "--ignore-memory simulates it anyway",
    iterations: int | None = None,
) -> tuple[SimResult, IterationRun | None]:
    """Read a plan file with its profile and cluster, and simulate it under the cost model of `scaling` and `optimizer`.

    Without --profile or --cluster, the names the plan file records are used.
    This is every check of a plan against its profile and cluster (layers,
    devices, replicas, schedule, memory): `train --plan` runs it too, before
    any process starts; `remedy` ends the memory error's message. With
    `iterations`, also the run of that many iterations on the trace's clock.

    Raises:
        PlanError: naming the plan file; also when the plan needs more memory than a device has (unless not
            `check_memory`).
    """
    from pipeplan import api
    from pipeplan.core.bandwidth_trace import BandwidthTrace
    from pipeplan.presets.resolve import load_plan, load_profile
    from pipeplan.sim.cost.layers import check_optimizer, check_scaling
    from pipeplan.sim.cost.model import CostModel

    plan, names = load_plan(plan_path, profile, profile_batch_size)
    if record:
        facts = TABLE.get(plan.schedule)
        per = 3 if facts is not None and facts.split_backward else 2
        check_timeline(per * len(plan.stages) * plan.microbatches, f"plan {plan_path}")
    if iterations is not None:  # an upper bound (every flow a boundary's devices may carry), before any simulation
        from pipeplan.core.work import plan_events

        per = 3 if TABLE.get(plan.schedule) is not None and TABLE[plan.schedule].split_backward else 2
        events = plan_events([len(s.devices) for s in plan.stages], plan.microbatches, per)
        check_iterations(f"plan {plan_path}", iterations, events, trace)
    profile, cluster = plan_profile_and_cluster(f"simulate --plan {plan_path}", profile, cluster, names)
    model_profile, machines = load_profile(profile, profile_batch_size), api.load_cluster(cluster)
    check_scaling(scaling)  # named as flags, before the API names them as arguments
    check_optimizer(optimizer)
    if isinstance(trace, BandwidthTrace):
        trace.check_devices(machines.num_devices, f"cluster {cluster}")
    try:
        result = api.simulate(plan, model_profile, machines, batch_scaling=scaling, optimizer=optimizer,
                              bandwidth_trace=trace, record=record, check_memory=check_memory)  # fmt: skip
    except api.PlanDoesNotFit as exc:
        raise PlanError(f"plan {plan_path} does not fit: {exc}; {remedy}") from None
    except PlanError as exc:
        raise PlanError(f"{plan_path}: {exc}") from None
    run = None
    if iterations is not None:
        from pipeplan.schedules.plan_schedule import plan_schedule
        from pipeplan.sim.cost.plan_costs import plan_costs
        from pipeplan.sim.engine.iterations import simulate_iterations

        bandwidth = trace if isinstance(trace, BandwidthTrace) else None
        model = CostModel.build(model_profile, machines, scaling, optimizer)
        run = simulate_iterations(plan_schedule(plan), plan_costs(plan, model, bandwidth), bandwidth, iterations)
    return result, run
