"""The discrete-event simulator of pipeline schedules: costs in, iteration time, memory and timeline out."""

from pipeplan.sim.cost.synthetic import uniform_costs
from pipeplan.sim.cost.types import Costs, Flow, StageCost
from pipeplan.sim.engine.lower_bound import lower_bound
from pipeplan.sim.engine.simulator import simulate
from pipeplan.sim.result import ComputeSpan, RankStats, SimResult, TransferSpan

__all__ = [
    "ComputeSpan",
    "Costs",
    "Flow",
    "RankStats",
    "SimResult",
    "StageCost",
    "TransferSpan",
    "lower_bound",
    "simulate",
    "uniform_costs",
]
