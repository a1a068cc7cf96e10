"""The pipeline the controller reasons about: the simulator's costs at nominal bandwidth, memory, bytes per link."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pipeplan.adapt.observation import Link
from pipeplan.core.errors import AdaptError, CostError
from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace
from pipeplan.core.hardware.links import is_link
from pipeplan.core.plan import Plan
from pipeplan.sim.cost.model import CostModel
from pipeplan.sim.cost.types import Costs, Flow, StageCost, ring_links

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
    one (`nominal_ms`). `allreduce_bytes[s]`: the gradient bytes stage s's data-parallel all-reduce sums (empty
    or 0: not known; only the rates the decisions print need it). Each stage's all-reduce ring is its cost's
    `allreduce_links` (`ring_links`). Derived: `flows[link]`, the flow on each link, and `wire_rates[link]`, its
    (ms per byte at nominal rate, latency ms); `traffic_links`, every link the pipeline's traffic uses.
    """

    costs: Costs
    microbatches: int
    memory_limit_bytes: tuple[float, ...]
    link_bytes: Mapping[Link, float]
    allreduce_bytes: tuple[float, ...] = ()
    flows: dict[Link, Flow] = field(init=False, repr=False, compare=False)
    wire_rates: dict[Link, tuple[float, float]] = field(init=False, repr=False, compare=False)
    ring_stage: dict[Link, int] = field(init=False, repr=False, compare=False)
    traffic_links: tuple[Link, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        stages = len(self.costs.stages)
        if isinstance(self.microbatches, bool) or not isinstance(self.microbatches, int) or self.microbatches < 1:
            raise AdaptError(f"microbatches must be an integer >= 1, got {self.microbatches!r}")
        if len(self.memory_limit_bytes) != stages:
            raise AdaptError(f"memory_limit_bytes has {len(self.memory_limit_bytes)} values for {stages} stages")
        if self.allreduce_bytes and len(self.allreduce_bytes) != stages:
            raise AdaptError(f"allreduce_bytes has {len(self.allreduce_bytes)} values for {stages} stages")
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
        rings = {link: s for s, c in enumerate(self.costs.stages) for link in c.allreduce_links}
        object.__setattr__(self, "ring_stage", rings)
        shared = [link for x in self.costs.shared for link in x.links]
        object.__setattr__(self, "traffic_links", tuple(dict.fromkeys([*flows, *rings, *shared])))

    @property
    def num_stages(self) -> int:
        """Pipeline stages p (one per rank)."""
        return len(self.costs.stages)

    @property
    def links(self) -> tuple[Link, ...]:
        """Every ordered device pair a transfer uses: activations stage by stage, then gradients (`traffic_links`
        adds the all-reduces' rings)."""
        return tuple(self.flows)

    @property
    def ring_links(self) -> tuple[tuple[Link, ...], ...]:
        """Per stage, the ordered device pairs of its data-parallel all-reduce's ring (none for one device)."""
        return tuple(c.allreduce_links for c in self.costs.stages)

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
        """The nominal effective rate of `link` in GB/s: a transfer's link from its transfers, a ring link from the
        bytes each ring link carries, 2(n-1)/n x the stage's gradient bytes, over the all-reduce's work (inf when
        its transfers take no wire time, when the all-reduce's bytes are not known, and on a link only a shared
        parameter's exchange uses)."""
        flow = self.flows.get(link)
        if flow is not None:
            return self.link_bytes[link] / flow.work_ms / 1e6 if flow.work_ms > 0 else math.inf
        s = self.ring_stage.get(link)
        if s is None:
            return math.inf  # a shared parameter's exchange ring only: its bytes per link are not kept
        cost = self.costs.stages[s]
        n = len(cost.allreduce_links)
        nbytes = 2 * (n - 1) / n * self.allreduce_bytes[s] if self.allreduce_bytes else 0.0
        return nbytes / cost.allreduce_work_ms / 1e6 if nbytes > 0 and cost.allreduce_work_ms > 0 else math.inf

    @classmethod
    def from_plan(cls, plan: Plan, model: CostModel, trace: BandwidthTrace | None = None) -> PipelineModel:
        """The pipeline of `plan` under `model` (sim.cost.plan_costs.plan_costs), its schedule left to the controller.

        Raises:
            AdaptError: the plan interleaves chunks, runs an asynchronous schedule (no flush to switch k at), or has
                tensor-parallel stages or sharded state (the controller reads measurements of 2D plans only).
            PlanError: the plan does not match the profile or cluster.
        """
        from pipeplan.sim.cost.chain_view import chain_view
        from pipeplan.sim.cost.plan_costs import plan_costs

        if plan.tensor_parallel_or_sharded:
            raise AdaptError(
                f"the controller adapts plans without tensor parallelism or sharding; this plan has "
                f"tp {[s.tp for s in plan.stages]} and zero {plan.zero} (simulate it with `pipeplan simulate --plan`)"
            )
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
        gradients = tuple(
            model.layers.stage(range(stage.first_layer, stage.last_layer + 1), plan.microbatch_size, 1, 1.0).param_bytes
            for stage in plan.stages
        )
        return cls(costs, plan.microbatches, limits, link_bytes, gradients)

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
        ring_links: Sequence[Sequence[Link]] | None = None,
        allreduce_latency_ms: Sequence[float] | None = None,
        allreduce_bytes: Sequence[float] | None = None,
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
            ring_links: per stage, the ordered device pairs its all-reduce's ring uses (default none: a trace
                does not slow it, and a measured Collective of it estimates no link).
            allreduce_latency_ms: per stage, the fixed part of allreduce_ms (default 0).
            allreduce_bytes: per stage, the gradient bytes the all-reduce sums (default unknown: only the
                decisions' printed GB/s of ring links need it).

        Raises:
            AdaptError: a list of the wrong length or a bad value, naming it.
        """
        p = len(fwd_ms)
        if p < 1:
            raise AdaptError("fwd_ms must hold one value per stage, got none")
        per_stage = {"bwd_ms": bwd_ms, "static_bytes": static_bytes, "activation_bytes": activation_bytes,
                     "memory_limit_bytes": memory_limit_bytes, "allreduce_ms": allreduce_ms or [0.0] * p,
                     "optimizer_ms": optimizer_ms or [0.0] * p, "ring_links": ring_links or [()] * p,
                     "allreduce_latency_ms": allreduce_latency_ms or [0.0] * p,
                     "allreduce_bytes": allreduce_bytes or [0.0] * p}  # fmt: skip
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
                    allreduce_ring=_ring(s, per_stage["ring_links"][s]),  # type: ignore[arg-type]
                    allreduce_latency_ms=float(per_stage["allreduce_latency_ms"][s]),
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
        gradients = tuple(float(x) for x in per_stage["allreduce_bytes"])  # type: ignore[arg-type]
        if not all(math.isfinite(x) and x >= 0 for x in gradients):
            raise AdaptError(f"allreduce_bytes must be finite numbers >= 0, got {list(per_stage['allreduce_bytes'])}")
        return cls(Costs(stages, tuple(forward), tuple(backward)), microbatches, limits, link_bytes, gradients)

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


def _ring(stage: int, links: Sequence[Link]) -> tuple[int, ...]:
    """The devices of a stage's ring, in ring order, from its links (each a valid Link, each starting where the one
    before ends, the last ending where the first starts); AdaptError naming the stage otherwise."""
    pairs = []
    for link in links:
        pair = tuple(link) if isinstance(link, (tuple, list)) else link
        if not is_link(pair):
            raise AdaptError(f"ring_links[{stage}] must hold pairs of two different device ids, got {link!r}")
        pairs.append(pair)
    devices = tuple(int(a) for a, _ in pairs)  # type: ignore[misc]
    if ring_links(devices) != tuple(pairs):
        raise AdaptError(
            f"ring_links[{stage}] must form a ring (each pair starting where the one before ends, the last ending where "
            f"the first starts), got {[list(p) for p in pairs]}"  # type: ignore[arg-type]
        )
    return devices
