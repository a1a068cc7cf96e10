"""What the simulator needs to know: per-stage compute and memory, per-boundary transfers."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from pipeplan.core.checks import check_nonneg_float
from pipeplan.core.errors import CostError


def ring_links(devices: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """The ordered device pairs of a ring over `devices` in their order: each to the next, the last to the first
    (none for fewer than 2 devices; 2 devices give both directions of their pair)."""
    if len(devices) < 2:
        return ()
    return tuple(zip(devices, devices[1:] + devices[:1], strict=True))


@dataclass(frozen=True, slots=True)
class Flow:
    """One point-to-point piece of a transfer, on one ordered device pair.

    `resources` are the exclusive resources the flow holds while it runs (the
    ordered pair, and a node's NIC-out / NIC-in when it crosses nodes); flows
    on a common resource queue first-come first-served. `link` is the ordered
    pair (src, dst) the bandwidth trace refers to. Duration at nominal rate:
    latency_ms + work_ms, where work_ms = bytes / rate; under a bandwidth trace
    the work part stretches by 1/factor while the factor holds.
    """

    resources: tuple[str, ...]
    link: tuple[int, int]
    latency_ms: float
    work_ms: float

    def __post_init__(self) -> None:
        # fast path first: planners build hundreds of thousands of flows, almost all plain finite floats
        for name, value in (("latency_ms", self.latency_ms), ("work_ms", self.work_ms)):
            if type(value) is not float or not 0.0 <= value < math.inf:
                check_nonneg_float(CostError, f"flow {self.link} {name}", value)


@dataclass(frozen=True, slots=True)
class GradBucket:
    """One bucket of a stage's gradient all-reduce (sim.cost.grad_buckets): the fraction of the stage's last
    backward task done when its gradients are final, its ring time and that time's fixed part (a trace stretches the
    rest, as a whole all-reduce's: StageCost)."""

    ready_fraction: float
    allreduce_ms: float
    latency_ms: float = 0.0

    def __post_init__(self) -> None:
        check_nonneg_float(CostError, "bucket allreduce_ms", self.allreduce_ms)
        check_nonneg_float(CostError, "bucket latency_ms", self.latency_ms)
        if not 0.0 <= self.ready_fraction <= 1.0:
            raise CostError(f"bucket ready_fraction must be in [0, 1], got {self.ready_fraction!r}")
        if self.latency_ms > self.allreduce_ms:
            raise CostError(f"bucket latency_ms {self.latency_ms!r} exceeds its allreduce_ms {self.allreduce_ms!r}")


@dataclass(frozen=True, slots=True)
class StageCost:
    """Compute time and memory of one stage for one microbatch.

    `bwd_input_ms` + `bwd_weight_ms` split `bwd_ms` for zero-bubble schedules
    (None: half each). `saved_bytes` is held per in-flight microbatch;
    `static_bytes` (weights, gradients, optimizer state) always.
    `allreduce_ms` runs after the stage's last backward; `optimizer_ms` is the stage's
    part of its rank's optimizer step, which runs once the rank has finished all
    its actions and all-reduces (the steps of a rank's stages one after another).
    `allreduce_ring` holds the devices of the all-reduce's ring in ring order (empty: none, or not known), whose
    ordered pairs are `allreduce_links` (each device to the next, the last back to the first; none for one
    device), and `allreduce_latency_ms` is the fixed part of `allreduce_ms`; the rest (`allreduce_work_ms`) is
    the bytes over the ring's slowest rate, which a bandwidth trace stretches by 1 / the slowest ring link's
    factor (sim.engine.simulator). `allreduce_buckets` (empty: none) cut the all-reduce into buckets in the order
    they go over the ring, each starting once the stage's last backward task has passed its layers and the bucket
    before it has ended (DDP's overlap, sim.cost.grad_buckets); `allreduce_ms` is then their total.
    """

    fwd_ms: float
    bwd_ms: float
    bwd_input_ms: float | None = None
    bwd_weight_ms: float | None = None
    saved_bytes: float = 0.0
    static_bytes: float = 0.0
    allreduce_ms: float = 0.0
    optimizer_ms: float = 0.0
    allreduce_ring: tuple[int, ...] = ()
    allreduce_latency_ms: float = 0.0
    allreduce_buckets: tuple[GradBucket, ...] = ()

    def __post_init__(self) -> None:
        buckets = self.allreduce_buckets
        if buckets and any(a.ready_fraction > b.ready_fraction for a, b in itertools.pairwise(buckets)):
            fractions = [b.ready_fraction for b in self.allreduce_buckets]
            raise CostError(f"allreduce_buckets must be ready in order (non-decreasing ready_fraction), got {fractions}")
        for field in ("fwd_ms", "bwd_ms", "saved_bytes", "static_bytes", "allreduce_ms", "optimizer_ms", "allreduce_latency_ms"):
            check_nonneg_float(CostError, field, getattr(self, field))
        if self.allreduce_latency_ms > self.allreduce_ms:
            raise CostError(
                f"allreduce_latency_ms {self.allreduce_latency_ms!r} exceeds allreduce_ms {self.allreduce_ms!r} "
                "(the latency is a part of the all-reduce's time)"
            )
        if self.bwd_input_ms is None and self.bwd_weight_ms is None:
            object.__setattr__(self, "bwd_input_ms", self.bwd_ms / 2)
            object.__setattr__(self, "bwd_weight_ms", self.bwd_ms / 2)
        elif self.bwd_input_ms is None:
            object.__setattr__(self, "bwd_input_ms", max(0.0, self.bwd_ms - self.bwd_weight_ms))
        elif self.bwd_weight_ms is None:
            object.__setattr__(self, "bwd_weight_ms", max(0.0, self.bwd_ms - self.bwd_input_ms))
        check_nonneg_float(CostError, "bwd_input_ms", self.bwd_input_ms)
        check_nonneg_float(CostError, "bwd_weight_ms", self.bwd_weight_ms)

    @property
    def allreduce_links(self) -> tuple[tuple[int, int], ...]:
        """The ordered device pairs of the all-reduce's ring (ring_links of `allreduce_ring`)."""
        return ring_links(self.allreduce_ring)

    @property
    def allreduce_work_ms(self) -> float:
        """The part of `allreduce_ms` that moves bytes at the ring's nominal rate (what a slower link stretches)."""
        return self.allreduce_ms - self.allreduce_latency_ms


@dataclass(frozen=True, slots=True)
class SharedExchange:
    """The all-reduce of one shared parameter: its name, bytes, the (chunk-)stages holding a copy, the number of
    devices it runs over and its time; `ring` its devices in ring order (`links`: their ordered pairs) and
    `latency_ms` the fixed part of `exchange_ms` (a trace stretches the rest as a stage's all-reduce, StageCost)."""

    name: str
    param_bytes: float
    stages: tuple[int, ...]
    devices: int
    exchange_ms: float
    ring: tuple[int, ...] = ()
    latency_ms: float = 0.0

    def __post_init__(self) -> None:
        if len(self.stages) < 2 or any(a >= b for a, b in itertools.pairwise(self.stages)):
            raise CostError(f"shared exchange {self.name!r} must name at least 2 ascending stages, got {list(self.stages)}")
        check_nonneg_float(CostError, f"shared exchange {self.name!r} exchange_ms", self.exchange_ms)
        check_nonneg_float(CostError, f"shared exchange {self.name!r} latency_ms", self.latency_ms)
        if self.latency_ms > self.exchange_ms:
            raise CostError(
                f"shared exchange {self.name!r} latency_ms {self.latency_ms!r} exceeds its exchange_ms {self.exchange_ms!r}"
            )

    @property
    def links(self) -> tuple[tuple[int, int], ...]:
        """The ordered device pairs of the exchange's ring (ring_links of `ring`)."""
        return ring_links(self.ring)

    @property
    def work_ms(self) -> float:
        """The part of `exchange_ms` that moves bytes at the ring's nominal rate."""
        return self.exchange_ms - self.latency_ms


@dataclass(frozen=True, slots=True)
class Costs:
    """Costs of every stage and every stage boundary.

    `forward[b]` are the flows of the activation from stage b to b+1,
    `backward[b]` those of the gradient from stage b+1 to b; an empty tuple
    means the two stages share a device (no transfer). The transfer ends when
    its slowest flow ends. `shared` holds the gradient exchange of every
    shared parameter whose layers are on several stages (sim.cost.shared).
    """

    stages: tuple[StageCost, ...]
    forward: tuple[tuple[Flow, ...], ...]
    backward: tuple[tuple[Flow, ...], ...]
    shared: tuple[SharedExchange, ...] = ()

    def __post_init__(self) -> None:
        n = len(self.stages)
        if n < 1:
            raise CostError("costs must cover at least one stage, got 0")
        for field in ("forward", "backward"):
            got = len(getattr(self, field))
            if got != n - 1:
                raise CostError(f"costs {field} must have {n - 1} entries (one per stage boundary), got {got}")
        for x in self.shared:
            if x.stages[-1] >= n:
                raise CostError(f"shared exchange {x.name!r} names stage {x.stages[-1]} but the costs have stages 0..{n - 1}")
