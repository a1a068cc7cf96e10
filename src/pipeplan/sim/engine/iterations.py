"""Many iterations under one bandwidth trace: each starts when the previous one's optimizer step ends."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeplan.core.schedule import Schedule
from pipeplan.sim.cost.types import Costs
from pipeplan.sim.engine.program import compile_schedule
from pipeplan.sim.engine.simulator import simulate
from pipeplan.sim.result import SimResult
from pipeplan.sim.trace import BandwidthTrace


@dataclass(frozen=True, slots=True)
class IterationRun:
    """Per-iteration start (on the trace's clock), duration and peak memory (the largest rank's bytes)."""

    start_ms: tuple[float, ...]
    iteration_ms: tuple[float, ...]
    peak_bytes: tuple[float, ...]

    @property
    def total_ms(self) -> float:
        """When the last iteration ends (0 for no iterations)."""
        return self.start_ms[-1] + self.iteration_ms[-1] if self.start_ms else 0.0

    def to_json(self) -> dict[str, Any]:
        """{"total_ms", "start_ms", "iteration_ms", "peak_bytes"}."""
        return {
            "total_ms": self.total_ms,
            "start_ms": list(self.start_ms),
            "iteration_ms": list(self.iteration_ms),
            "peak_bytes": list(self.peak_bytes),
        }


def steady_after(trace: BandwidthTrace | None, offset_ms: float) -> bool:
    """True when no step of `trace` lies after `offset_ms`: from there every iteration of a schedule runs alike."""
    return trace is None or trace.end_ms <= offset_ms


def peak_bytes(result: SimResult) -> float:
    """The largest per-rank peak memory of a simulated iteration."""
    return max((r.peak_memory_bytes for r in result.per_rank), default=0.0)


def simulate_iterations(
    schedule: Schedule, costs: Costs, trace: BandwidthTrace | None, iterations: int, start_ms: float = 0.0
) -> IterationRun:
    """Simulate `iterations` back-to-back iterations of one schedule, the trace's clock running across them.

    Iteration i starts at the end of iteration i - 1 (its last optimizer step,
    sim.engine) and sees the trace from there (simulate's offset_ms). Once the
    trace has no step left ahead, every later iteration runs exactly as the
    first one past its last step, which is reused instead of simulated again.
    """
    program = compile_schedule(schedule)
    starts: list[float] = []
    times: list[float] = []
    peaks: list[float] = []
    t = start_ms
    steady: tuple[float, float] | None = None
    for _ in range(iterations):
        if steady is None:
            result = simulate(schedule, costs, trace, record=False, offset_ms=t, program=program)
            current = (result.iteration_time, peak_bytes(result))
            if steady_after(trace, t):
                steady = current
        else:
            current = steady
        starts.append(t)
        times.append(current[0])
        peaks.append(current[1])
        t += current[0]
    return IterationRun(tuple(starts), tuple(times), tuple(peaks))
