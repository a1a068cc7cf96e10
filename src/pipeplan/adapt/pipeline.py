"""The pipeline the controller reasons about: the simulator's costs at nominal bandwidth, memory, bytes per link."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pipeplan.adapt.observation import Link
from pipeplan.core.errors import AdaptError, CostError
from pipeplan.core.plan import Plan
from pipeplan.sim.cost.model import CostModel
from pipeplan.sim.cost.types import Costs, Flow, StageCost
from pipeplan.sim.trace import BandwidthTrace

SYNCHRONOUS = ("gpipe", "1f1b", "kfkb", "interleaved-1f1b", "zb-h1", "list")
"""Schedules whose plans the controller can regroup: one flush per iteration (pipemare streams without one)."""


@dataclass(frozen=True)
class PipelineModel:
    """One pipeline replica as the simulator prices it, plus what the controller needs to read measurements.

    `costs`: per-stage compute and memory and per-boundary flows at nominal
    bandwidth (stage s on rank s). `memory_limit_bytes[s]`: the capacity of
    stage s's smallest device. `link_bytes[link]`: bytes one microbatch moves
    over that ordered device pair (each direction of a boundary is its own
    link), so a measured transfer gives the link's rate against its nominal
    one (`nominal_ms`). Derived: `flows[link]`, the flow on each link, and `wire_rates[link]`, its (ms per byte
    at nominal rate, latency ms).
    """

    costs: Costs
    microbatches: int
    memory_limit_bytes: tuple[float, ...]
    link_bytes: Mapping[Link, float]
    flows: dict[Link, Flow] = field(init=False, repr=False, compare=False)
    wire_rates: dict[Link, tuple[float, float]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        stages = len(self.costs.stages)
        if isinstance(self.microbatches, bool) or not isinstance(self.microbatches, int) or self.microbatches < 1:
            raise AdaptError(f"microbatches must be an integer >= 1, got {self.microbatches!r}")
        if len(self.memory_limit_bytes) != stages:
            raise AdaptError(f"memory_limit_bytes has {len(self.memory_limit_bytes)} values for {stages} stages")
        flows = {f.link: f for boundary in self.costs.forward + self.costs.backward for f in boundary}
        missing = sorted(set(flows) - set(self.link_bytes))
        if missing:
            raise AdaptError(f"link_bytes misses link {list(missing[0])} that a transfer uses")
        object.__setattr__(self, "flows", flows)
        rates = {
            link: (f.work_ms / self.link_bytes[link] if self.link_bytes[link] > 0 else 0.0, f.latency_ms)
            for link, f in flows.items()
        }
        object.__setattr__(self, "wire_rates", rates)

    @property
    def num_stages(self) -> int:
        """Pipeline stages p (one per rank)."""
        return len(self.costs.stages)

    @property
    def links(self) -> tuple[Link, ...]:
        """Every ordered device pair a transfer uses: activations stage by stage, then gradients."""
        return tuple(self.flows)

    def nominal_ms(self, link: Link, nbytes: float) -> float:
        """Wire time of nbytes on `link` at its nominal rate (latency excluded).

        Raises:
            AdaptError: no transfer of this pipeline uses `link`.
        """
        flow = self.flows.get(link)
        if flow is None:
            known = ", ".join(f"{a}->{b}" for a, b in self.links) or "none"
            raise AdaptError(f"transfer on link {list(link)}: no stage boundary of this pipeline uses it (links: {known})")
        return nbytes * self.wire_rates[link][0]

    def latency_ms(self, link: Link) -> float:
        """The fixed part of every transfer on `link`."""
        return self.flows[link].latency_ms

    def nominal_gb_per_s(self, link: Link) -> float:
        """The nominal effective rate of `link` in GB/s (inf when its transfers take no wire time)."""
        work = self.flows[link].work_ms
        return self.link_bytes[link] / work / 1e6 if work > 0 else math.inf

    @classmethod
    def from_plan(cls, plan: Plan, model: CostModel, trace: BandwidthTrace | None = None) -> PipelineModel:
        """The pipeline of `plan` under `model` (sim.stage_costs.plan_costs), its schedule left to the controller.

        Raises:
            AdaptError: the plan interleaves chunks or runs an asynchronous schedule (no flush to switch k at).
            PlanError: the plan does not match the profile or cluster.
        """
        from pipeplan.sim.cost.chain_view import chain_view
        from pipeplan.sim.cost.plan_costs import plan_costs

        if plan.chunks != 1:
            raise AdaptError(f"the controller regroups one stage per rank; the plan interleaves v={plan.chunks} chunks")
        if plan.schedule not in SYNCHRONOUS:
            raise AdaptError(f"schedule {plan.schedule!r} has no flush between iterations, so k cannot change there")
        costs = plan_costs(plan, model, trace)
        plan, model = chain_view(plan, model)  # a DAG plan's cut bytes are those of its order's chain
        link_bytes: dict[Link, float] = {}
        for b in range(len(plan.stages) - 1):
            cut = model.layers.cut_bytes(plan.stages[b].last_layer, plan.microbatch_size)
            pairs = min(plan.replicas_of(b), plan.replicas_of(b + 1))
            for flow in costs.forward[b] + costs.backward[b]:
                link_bytes[flow.link] = cut / pairs
        devices = model.cluster.devices
        limits = tuple(float(min(devices[d].memory_bytes for d in stage.devices)) for stage in plan.stages)
        return cls(costs, plan.microbatches, limits, link_bytes)

    @classmethod
    def from_measurements(
        cls,
        fwd_ms: Sequence[float],
        bwd_ms: Sequence[float],
        boundary_bytes: Sequence[float],
        boundary_links: Sequence[Link],
        bandwidth_gb_per_s: Sequence[float],
        static_bytes: Sequence[float],
        activation_bytes: Sequence[float],
        memory_limit_bytes: Sequence[float],
        microbatches: int,
        latency_ms: Sequence[float] | None = None,
        allreduce_ms: Sequence[float] | None = None,
        optimizer_ms: Sequence[float] | None = None,
    ) -> PipelineModel:
        """A pipeline of one device per stage from numbers a runtime measures.

        Args:
            fwd_ms, bwd_ms: per stage, ms of one microbatch's forward and full backward.
            boundary_bytes: per boundary b (stage b to b+1), bytes of one microbatch's activation (the gradient
                going back is as large).
            boundary_links: per boundary, (device of stage b, device of stage b+1); the gradient uses the reverse pair.
            bandwidth_gb_per_s: per boundary, the nominal rate of each direction (GB/s, 10^9 bytes/s).
            static_bytes: per stage, bytes held all the time (weights, gradients, optimizer state).
            activation_bytes: per stage, bytes saved per in-flight microbatch.
            memory_limit_bytes: per stage, the device's capacity.
            microbatches: microbatches per iteration m.
            latency_ms: per boundary, the fixed part of each transfer (default 0).
            allreduce_ms, optimizer_ms: per stage, the gradient all-reduce after its last backward and its
                optimizer step (default 0).

        Raises:
            AdaptError: a list of the wrong length or a bad value, naming it.
        """
        p = len(fwd_ms)
        if p < 1:
            raise AdaptError("fwd_ms must hold one value per stage, got none")
        per_stage = {"bwd_ms": bwd_ms, "static_bytes": static_bytes, "activation_bytes": activation_bytes,
                     "memory_limit_bytes": memory_limit_bytes, "allreduce_ms": allreduce_ms or [0.0] * p,
                     "optimizer_ms": optimizer_ms or [0.0] * p}  # fmt: skip
        per_boundary = {"boundary_bytes": boundary_bytes, "boundary_links": boundary_links,
                        "bandwidth_gb_per_s": bandwidth_gb_per_s, "latency_ms": latency_ms or [0.0] * (p - 1)}  # fmt: skip
        for name, values in per_stage.items():
            if len(values) != p:
                raise AdaptError(f"{name} needs {p} values (one per stage, as fwd_ms), got {len(values)}")
        for name, values in per_boundary.items():
            if len(values) != p - 1:
                raise AdaptError(f"{name} needs {p - 1} values (one per stage boundary), got {len(values)}")
        try:
            stages = tuple(
                StageCost(
                    fwd_ms=float(fwd_ms[s]),
                    bwd_ms=float(bwd_ms[s]),
                    saved_bytes=float(activation_bytes[s]),
                    static_bytes=float(static_bytes[s]),
                    allreduce_ms=float(per_stage["allreduce_ms"][s]),
                    optimizer_ms=float(per_stage["optimizer_ms"][s]),
                )
                for s in range(p)
            )
        except (CostError, TypeError, ValueError) as exc:
            raise AdaptError(f"stage costs: {exc}") from None
        forward: list[tuple[Flow, ...]] = []
        backward: list[tuple[Flow, ...]] = []
        link_bytes: dict[Link, float] = {}
        for b in range(p - 1):
            link = tuple(boundary_links[b])
            rate = bandwidth_gb_per_s[b]
            nbytes = boundary_bytes[b]
            if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
                raise AdaptError(f"bandwidth_gb_per_s[{b}] must be a finite number > 0, got {rate!r}")
            if not (isinstance(nbytes, (int, float)) and math.isfinite(nbytes) and nbytes >= 0):
                raise AdaptError(f"boundary_bytes[{b}] must be a finite number >= 0, got {nbytes!r}")
            if len(link) != 2 or link[0] == link[1]:
                raise AdaptError(f"boundary_links[{b}] must be two different device ids, got {boundary_links[b]!r}")
            src, dst = int(link[0]), int(link[1])
            work = nbytes / (rate * 1e9) * 1000.0
            latency = float(per_boundary["latency_ms"][b])  # type: ignore[arg-type]
            try:
                forward.append((Flow((f"pair:{src}->{dst}",), (src, dst), latency, work),))
                backward.append((Flow((f"pair:{dst}->{src}",), (dst, src), latency, work),))
            except CostError as exc:
                raise AdaptError(f"boundary {b}: {exc}") from None
            link_bytes[(src, dst)] = link_bytes[(dst, src)] = float(nbytes)
        limits = tuple(float(x) for x in memory_limit_bytes)
        return cls(Costs(stages, tuple(forward), tuple(backward)), microbatches, limits, link_bytes)

    def with_compute(self, fwd_ms: Sequence[float], bwd_ms: Sequence[float]) -> Costs:
        """The costs with each stage's forward and backward replaced (the backward's I/W split kept in proportion)."""
        stages = []
        for cost, fwd, bwd in zip(self.costs.stages, fwd_ms, bwd_ms, strict=True):
            scale = bwd / cost.bwd_ms if cost.bwd_ms > 0 else 0.0
            stages.append(
                dataclasses.replace(
                    cost,
                    fwd_ms=fwd,
                    bwd_ms=bwd,
                    bwd_input_ms=cost.bwd_input_ms * scale if scale else bwd / 2,  # type: ignore[operator]
                    bwd_weight_ms=cost.bwd_weight_ms * scale if scale else bwd / 2,  # type: ignore[operator]
                )
            )
        return Costs(tuple(stages), self.costs.forward, self.costs.backward, self.costs.shared)
