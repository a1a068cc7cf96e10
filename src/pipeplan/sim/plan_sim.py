"""A Plan simulated: its costs (sim.cost) and its schedule run through the discrete-event engine (sim.engine)."""

from __future__ import annotations

from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace
from pipeplan.core.plan import Plan
from pipeplan.schedules.plan_schedule import plan_schedule
from pipeplan.sim.cost.model import CostModel
from pipeplan.sim.cost.plan_costs import plan_costs
from pipeplan.sim.engine.simulator import simulate
from pipeplan.sim.result import SimResult


def simulate_plan(plan: Plan, model: CostModel, trace: BandwidthTrace | None = None, record: bool = True) -> SimResult:
    """Simulate one iteration of `plan` under `model` (see plan_costs and plan_schedule)."""
    return simulate(plan_schedule(plan), plan_costs(plan, model, trace), trace=trace, record=record)
