"""Steady-state figures of an asynchronous (flush-free) schedule's simulation: utilization, delays, weight memory.

A synchronous schedule's iteration is its steady state (it flushes every
minibatch), so 1 - bubble_fraction is its utilization. An asynchronous one
(pipemare) streams many minibatches; its fill and drain happen once per run,
not per minibatch, so utilization is measured over a window between them:
from the end of stage 0's optimizer step of minibatch ceil(p/m) to the end
of its step of minibatch n - 1 - ceil(p/m) (n minibatches): every rank busy
time inside the window over ranks x window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeplan.core.errors import ScheduleError
from pipeplan.core.schedule import Schedule
from pipeplan.schedules.pipemare import fill_minibatches
from pipeplan.sim.delays import stage_delays
from pipeplan.sim.result import SimResult

WEIGHT_COPIES = 2
"""Weight-sized buffers a PipeMare stage keeps: the weights and the discrepancy-correction velocity δ."""


@dataclass(frozen=True, slots=True)
class SteadyState:
    """Utilization over the steady window (start_ms, end_ms), and per stage the delays and weight copies."""

    utilization: float
    start_ms: float
    end_ms: float
    delays: tuple[int, ...]
    mean_delays: tuple[float, ...]
    weight_copies: tuple[int, ...]
    stashed_weight_copies: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        """The `pipemare` part of `simulate --json`."""
        return {
            "utilization": self.utilization,
            "window_ms": [self.start_ms, self.end_ms],
            "delays": list(self.delays),
            "mean_delays": list(self.mean_delays),
            "memory": {"weight_copies": list(self.weight_copies), "weight_stashing_copies": list(self.stashed_weight_copies)},
        }


def steady_state(schedule: Schedule, result: SimResult, microbatches: int) -> SteadyState:
    """The steady window of a recorded simulation of an asynchronous `schedule` of `microbatches` per minibatch.

    Raises:
        ScheduleError: the schedule holds no optimizer steps on stage 0, or too few minibatches for a window.
    """
    steps = sorted((span.microbatch, span.end_ms) for span in result.compute if span.stage == 0 and span.op == "U")
    fill = fill_minibatches(schedule.num_ranks, microbatches)
    first, last = fill, len(steps) - 1 - fill
    if not steps or last <= first:
        raise ScheduleError(
            f"schedule {schedule.name!r} has {len(steps)} minibatches; a steady window needs at least {2 * fill + 2} "
            f"(fill and drain take {fill} each)"
        )
    start, end = steps[first][1], steps[last][1]
    busy = sum(max(0.0, min(span.end_ms, end) - max(span.start_ms, start)) for span in result.compute)
    utilization = busy / (schedule.num_ranks * (end - start)) if end > start else 1.0
    delays = stage_delays(schedule)
    return SteadyState(
        utilization,
        start,
        end,
        delays.delays,
        delays.mean_delays,
        (WEIGHT_COPIES,) * schedule.num_stages,
        delays.stashed_versions,
    )
