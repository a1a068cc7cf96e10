"""Many iterations under one bandwidth trace: each starts when the previous one's optimizer step ends."""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any

from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace
from pipeplan.core.schedule import Schedule
from pipeplan.sim.cost.types import Costs
from pipeplan.sim.engine.program import compile_schedule
from pipeplan.sim.engine.simulator import simulate
from pipeplan.sim.result import SimResult


@dataclass(frozen=True, slots=True)
class IterationRun:
    """Per-iteration start (on the trace's clock), duration and peak memory (the largest rank's bytes); `allreduce_ms`:
    per iteration, each stage's data-parallel all-reduce from its start to its end (0 for a stage without one;
    empty when not recorded)."""

    start_ms: tuple[float, ...]
    iteration_ms: tuple[float, ...]
    peak_bytes: tuple[float, ...]
    allreduce_ms: tuple[tuple[float, ...], ...] = field(default=(), kw_only=True)

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


Iteration = tuple[float, float, tuple[float, ...]]
"""One simulated iteration as a run keeps it: (ms, peak bytes, each stage's all-reduce ms)."""


class Reuse:
    """Iterations of one schedule that ran under constant link factors, kept to stand for later ones that would too.

    An iteration's times depend on the trace only through the factors its
    transfers' links and its all-reduces' ring links run at while it runs (used_links). When none of those links changes
    factor inside an iteration's span, the iteration runs as any other that
    starts at the same factors and also sees no change (to rounding: a
    simulation adds the iteration's start to its times on the trace's clock
    and takes it away): so one simulation per set of factors stands for all
    of them (`known` returns it when the next change lies beyond its span). Steps far past any time a
    run reaches (t = 1e300) cost nothing: they are never inside a span. The
    iterations simulated in full number at most 2 x (changes) + 1, whatever
    the count of iterations (core.work prices a run with that).
    """

    def __init__(self, costs: Costs, trace: BandwidthTrace | None) -> None:
        self.links = trace.representatives(used_links(costs)) if trace is not None else ()
        self.stages = costs.stages
        self.trace = trace
        self.changes = trace.changes(self.links) if trace is not None else ()
        self.simulated = 0
        self._seen: dict[tuple[float, ...], Iteration] = {}

    def fresh(self) -> Reuse:
        """An empty Reuse for another schedule of the same costs and trace (the changes are not looked up again)."""
        other = object.__new__(Reuse)
        other.links, other.trace, other.changes, other.simulated, other._seen = self.links, self.trace, self.changes, 0, {}
        other.stages = self.stages
        return other

    def _key(self, t_ms: float) -> tuple[float, ...]:
        trace = self.trace
        return tuple(trace.factor_at(link, t_ms) for link in self.links) if trace is not None else ()

    def _clear(self, t_ms: float, iteration_ms: float) -> bool:
        """Whether no factor changes in (t_ms, t_ms + iteration_ms]."""
        i = bisect_right(self.changes, t_ms)
        return i == len(self.changes) or self.changes[i] > t_ms + iteration_ms

    def known(self, t_ms: float) -> Iteration | None:
        """(iteration ms, peak bytes, all-reduce ms per stage) of an iteration starting at `t_ms`, when one already
        simulated stands for it."""
        seen = self._seen.get(self._key(t_ms))
        return seen if seen is not None and self._clear(t_ms, seen[0]) else None

    def keep(self, t_ms: float, result: SimResult) -> Iteration:
        """Record an iteration simulated from `t_ms` on (kept when it saw no change); its (ms, peak bytes, all-reduce
        ms per stage)."""
        self.simulated += 1
        current = (result.iteration_time, peak_bytes(result), allreduce_durations(result, len(self.stages)))
        if self._clear(t_ms, current[0]):
            self._seen.setdefault(self._key(t_ms), current)
        return current


def used_links(costs: Costs) -> list[tuple[int, int]]:
    """Every link an iteration's traffic uses: the transfers' flows, each stage's all-reduce ring and each shared
    parameter's exchange ring."""
    links = [f.link for flows in costs.forward + costs.backward for f in flows]
    for c in costs.stages:
        links += c.allreduce_links
    for x in costs.shared:
        links += x.links
    return links


def trace_changes(trace: BandwidthTrace | None) -> int:
    """At most how often the factors of any set of links change: the trace's distinct step times after 0 (a run
    simulates at most 2 x this + 1 iterations in full, Reuse)."""
    return len({step.t_ms for step in trace.steps if step.t_ms > 0}) if trace is not None else 0


def iteration_events(schedule: Schedule, costs: Costs) -> int:
    """Events of one simulated iteration: the schedule's actions and every flow of every transfer (one per
    microbatch, boundary and direction)."""
    flows = sum(len(f) for f in costs.forward + costs.backward)
    return sum(map(len, schedule.ranks)) + flows * schedule.num_microbatches


def allreduce_durations(result: SimResult, stages: int) -> tuple[float, ...]:
    """Each stage's all-reduce in `result`, its last span's end - its first span's start (a bucketed all-reduce has
    one span per bucket; 0 for a stage without one)."""
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    for span in result.collectives:
        first[span.stage] = min(first.get(span.stage, span.start_ms), span.start_ms)
        last[span.stage] = max(last.get(span.stage, span.end_ms), span.end_ms)
    return tuple(last[s] - first[s] if s in first else 0.0 for s in range(stages))


def peak_bytes(result: SimResult) -> float:
    """The largest per-rank peak memory of a simulated iteration."""
    return max((r.peak_memory_bytes for r in result.per_rank), default=0.0)


def simulate_iterations(
    schedule: Schedule, costs: Costs, trace: BandwidthTrace | None, iterations: int, start_ms: float = 0.0
) -> IterationRun:
    """Simulate `iterations` back-to-back iterations of one schedule, the trace's clock running across them.

    Iteration i starts at the end of iteration i - 1 (its last optimizer step,
    sim.engine) and sees the trace from there (simulate's offset_ms). An
    iteration that sees no change of its links' factors is simulated once per
    set of factors and reused (Reuse): after the trace's last step, or
    between steps far apart, iterations cost no simulation.
    """
    program = compile_schedule(schedule)
    reuse = Reuse(costs, trace)
    starts: list[float] = []
    times: list[float] = []
    peaks: list[float] = []
    allreduce: list[tuple[float, ...]] = []
    t = start_ms
    for _ in range(iterations):
        current = reuse.known(t)
        if current is None:
            current = reuse.keep(t, simulate(schedule, costs, trace, record=False, offset_ms=t, program=program))
        starts.append(t)
        times.append(current[0])
        peaks.append(current[1])
        allreduce.append(current[2])
        t += current[0]
    return IterationRun(tuple(starts), tuple(times), tuple(peaks), allreduce_ms=tuple(allreduce))
