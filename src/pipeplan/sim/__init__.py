"""The discrete-event simulator of pipeline schedules: costs in, iteration time, memory and timeline out."""

from pipeplan.sim.cost.synthetic import uniform_costs
from pipeplan.sim.cost.types import Costs, Flow, StageCost
from pipeplan.sim.engine.lower_bound import lower_bound
from pipeplan.sim.engine.simulator import simulate
from pipeplan.sim.result import ComputeSpan, RankStats, SimResult, TransferSpan
from pipeplan.sim.trace import BandwidthTrace, TraceStep, bandwidth_trace_from_json, read_bandwidth_trace

__all__ = [
    "BandwidthTrace",
    "ComputeSpan",
    "Costs",
    "Flow",
    "RankStats",
    "SimResult",
    "StageCost",
    "TraceStep",
    "TransferSpan",
    "bandwidth_trace_from_json",
    "lower_bound",
    "read_bandwidth_trace",
    "simulate",
    "uniform_costs",
]
