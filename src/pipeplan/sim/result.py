"""What a simulation returns: times, memory and the full timeline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple


class ComputeSpan(NamedTuple):
    """One compute action on a rank: `op` in FBIW, from start_ms to end_ms."""

    rank: int
    stage: int
    op: str
    microbatch: int
    start_ms: float
    end_ms: float


class TransferSpan(NamedTuple):
    """One stage-to-stage transfer; `kind` 'act' (forward) or 'grad' (backward)."""

    src_rank: int
    dst_rank: int
    src_stage: int
    dst_stage: int
    kind: str
    microbatch: int
    start_ms: float
    end_ms: float


class FlowSpan(NamedTuple):
    """One flow of a transfer that the general queue timed (several pairs, a NIC, or a traced link).

    `boundary` b: activations go from stage b to b+1 (`kind` 'act'), gradients back ('grad'); `link` is the
    flow's ordered device pair. A transfer on one plain resource has no FlowSpan: its TransferSpan is its flow.
    """

    kind: str
    boundary: int
    link: tuple[int, int]
    start_ms: float
    end_ms: float


class ExchangeSpan(NamedTuple):
    """The gradient exchange of one shared parameter between the (chunk-)stages holding a copy (sim.cost.shared)."""

    name: str
    stages: tuple[int, ...]
    start_ms: float
    end_ms: float


class CollectiveSpan(NamedTuple):
    """The data-parallel all-reduce of one (chunk-)stage's gradients: from its last backward until the ring ends
    (its latency, then its work at the slowest ring link's rate under a trace); a bucketed all-reduce
    (StageCost.allreduce_buckets) has one span per bucket, in ring order."""

    stage: int
    start_ms: float
    end_ms: float


class RankStats(NamedTuple):
    """Per-rank totals: compute time, idle time within the iteration, in-flight and memory peaks."""

    busy: float
    idle: float
    peak_inflight: int
    peak_memory_bytes: float


@dataclass(frozen=True, slots=True)
class SimResult:
    """The simulated iteration (times in ms, memory in bytes).

    `bubble_fraction` = 1 - sum(busy) / (ranks * iteration_time): the idle
    share of every rank's time, so a stage split that leaves ranks
    underused counts too; `efficiency` = lower_bound / iteration_time: how
    close the schedule comes to the bound of its busiest rank (and of its
    links and all-reduces). They agree only when every rank is equally busy:
    98.8 % efficiency with a 9.5 % bubble is a schedule near its bound on an
    unbalanced split. `flows` (recorded runs only): the wire times of flows the
    general transfer queue timed (FlowSpan). `exchanges`: the gradient
    exchange of every shared parameter the plan splits over stages.
    `collectives`: the all-reduce of every stage that has one (allreduce_ms > 0), in stage order; like
    `exchanges` it is kept whether or not the run records its timeline (both set when the ranks step).
    """

    iteration_time: float
    lower_bound: float
    bubble_fraction: float
    per_rank: tuple[RankStats, ...]
    stage_peak_inflight: tuple[int, ...]
    compute: tuple[ComputeSpan, ...]
    transfers: tuple[TransferSpan, ...]
    schedule_name: str = ""
    flows: tuple[FlowSpan, ...] = ()
    exchanges: tuple[ExchangeSpan, ...] = ()
    collectives: tuple[CollectiveSpan, ...] = ()

    @property
    def efficiency(self) -> float:
        """lower_bound / iteration_time (1.0 for an empty iteration)."""
        return self.lower_bound / self.iteration_time if self.iteration_time > 0 else 1.0

    def to_json(self) -> dict[str, Any]:
        """The `simulate --json` object of the CLI contract."""
        return {
            "schedule": self.schedule_name,
            "iteration_time": self.iteration_time,
            "lower_bound": self.lower_bound,
            "efficiency": self.efficiency,
            "bubble_fraction": self.bubble_fraction,
            "per_rank": [
                {
                    "busy": r.busy,
                    "idle": r.idle,
                    "peak_inflight": r.peak_inflight,
                    "peak_memory_bytes": r.peak_memory_bytes,
                }
                for r in self.per_rank
            ],
            **(
                {
                    "shared_exchanges": [
                        {
                            "name": x.name,
                            "stages": list(x.stages),
                            "start_ms": x.start_ms,
                            "end_ms": x.end_ms,
                            "exchange_ms": x.end_ms - x.start_ms,
                        }
                        for x in self.exchanges
                    ]
                }
                if self.exchanges
                else {}
            ),
        }
