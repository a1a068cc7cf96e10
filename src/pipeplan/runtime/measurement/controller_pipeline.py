"""The pipeline the runtime's adaptive controller reasons about: each stage as the plan prices it (or as the warm-up
measured its slowest replica), and each boundary's transfer as the runtime moves it, one flow per process pair
(torch-free).

Note:
    The simulator's plan costs (sim.cost.plan_costs) send a boundary over min(r1, r2) replica pairs of one
    pipeline copy. The runtime sends every replica of stage b the rows it shares with every replica of stage b+1
    (runtime.placement), in every pipeline copy, each pair on its own emulated link. The controller reads measured
    transfers on those device pairs and must predict what the runtime runs, so its flows are the runtime's pieces:
    one per (sender device, receiver device) of every pipeline copy, carrying the piece's share of the microbatch.
    The copies run the same schedule side by side and all-reduce at the end, so simulating one pipeline whose every
    transfer waits for its slowest piece in any copy bounds the slowest copy (equal when one copy is uniformly
    slowest, as under a trace on every link).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pipeplan.adapt import PipelineModel
from pipeplan.adapt.observation import Link
from pipeplan.core.plan import Plan
from pipeplan.core.schedule import Action
from pipeplan.core.units import wire_ms
from pipeplan.runtime.placement import Topology
from pipeplan.sim.cost.model import CostModel
from pipeplan.sim.cost.types import Costs, Flow, StageCost

Pieces = list[list[tuple[Link, float]]]
"""Per boundary, (link, share of one microbatch's rows) of every piece the transfer is sent in."""

RingTime = Callable[[tuple[int, ...], float], tuple[float, float]]
"""A ring all-reduce's nominal (total ms, latency ms) over its devices for its bytes (the emulated wire's
EmulatedLinks.ring_parts)."""


def pieces(topology: Topology) -> tuple[Pieces, Pieces]:
    """The activation pieces and the gradient pieces of every boundary, over every pipeline copy (microbatch 0's:
    every microbatch is split alike)."""
    last = topology.num_stages - 1
    rows = topology.plan.microbatch_size
    devices = topology.devices
    forward: Pieces = [[] for _ in range(last)]
    backward: Pieces = [[] for _ in range(last)]
    for role in topology.roles:
        stage = role.stages[0]
        for op, out, boundary in (("F", forward, stage), ("B", backward, stage - 1)):
            if 0 <= boundary < last:
                for m in topology.sends(role, Action(stage, op, 0)):
                    out[boundary].append(((devices[m.src], devices[m.dst]), (m.src_hi - m.src_lo) / rows))
    return forward, backward


def runtime_pipeline(
    topology: Topology,
    stages: Sequence[StageCost],
    memory_limit_bytes: Sequence[float],
    link_bytes: Mapping[Link, float],
    rates: Mapping[Link, tuple[float, float]],
    allreduce_bytes: Sequence[float] = (),
) -> PipelineModel:
    """The controller's pipeline of `topology`: `stages` per stage, each boundary's pieces as flows.

    Args:
        stages: per stage, its compute, memory, all-reduce (its ring and nominal time) and optimizer step (the
            slowest replica's).
        memory_limit_bytes: per stage, what its devices may hold.
        link_bytes: bytes of one microbatch's piece on each link a piece uses.
        rates: per link, (nominal bytes/s, latency ms).
        allreduce_bytes: per stage, the gradient bytes its all-reduce sums (empty: not known).
    """
    forward, backward = pieces(topology)

    def flows(boundary: list[tuple[Link, float]]) -> tuple[Flow, ...]:
        out = []
        for link, _ in boundary:
            per_s, latency_ms = rates[link]
            work_ms = wire_ms(link_bytes[link], per_s)
            out.append(Flow((f"pair:{link[0]}->{link[1]}",), link, float(latency_ms), float(work_ms)))
        return tuple(out)

    costs = Costs(tuple(stages), tuple(map(flows, forward)), tuple(map(flows, backward)))
    used = {link for boundary in forward + backward for link, _ in boundary}
    return PipelineModel(costs, topology.plan.microbatches, tuple(map(float, memory_limit_bytes)),
                         {link: float(link_bytes[link]) for link in used}, tuple(map(float, allreduce_bytes)))  # fmt: skip


def with_ring(stage: StageCost, ring: tuple[int, ...], nbytes: float, ring_time: RingTime) -> StageCost:
    """`stage` whose all-reduce is a ring over `ring`'s devices (the runtime's: the plan's stage devices, in order)
    moving `nbytes` at the nominal time `ring_time` gives; no all-reduce for one device or no bytes."""
    if len(ring) < 2 or nbytes <= 0:
        return dataclasses.replace(stage, allreduce_ms=0.0, allreduce_ring=(), allreduce_latency_ms=0.0)
    total, latency = ring_time(ring, nbytes)
    return dataclasses.replace(stage, allreduce_ms=total, allreduce_ring=ring, allreduce_latency_ms=latency)


def plan_pipeline(
    plan: Plan,
    topology: Topology,
    model: CostModel,
    rates: Mapping[Link, tuple[float, float]],
    memory_limit_bytes: float | None,
    ring_time: RingTime | None = None,
) -> PipelineModel:
    """The pipeline of a plan before it runs: its stages as `model` prices them (adapt.PipelineModel.from_plan, as
    `pipeplan adapt` builds it; the controller calibrates their compute from the measured stage times), each
    boundary's cut bytes split into the runtime's pieces at the network's `rates`; every stage may hold
    `memory_limit_bytes` (None: its devices' memory in the plan's cluster). A replicated stage's all-reduce is
    the plan's ring over its devices (sim.cost.plan_costs), its bytes the stage's parameters; on an emulated
    network (`ring_time`) priced as the wire runs it, else at the plan's cluster.

    Raises:
        AdaptError, PlanError: the plan does not match the profile or cluster, or is not one the controller regroups.
    """
    from pipeplan.sim.cost.chain_view import chain_view

    priced = PipelineModel.from_plan(plan, model)
    chain, chain_model = chain_view(plan, model)  # a DAG plan's cut bytes are those of its order's chain
    cuts = [chain_model.layers.cut_bytes(chain.stages[b].last_layer, chain.microbatch_size) for b in range(len(chain.stages) - 1)]
    forward, backward = pieces(topology)
    link_bytes = {link: cuts[b] * share for side in (forward, backward) for b, group in enumerate(side)
                  for link, share in group}  # fmt: skip
    limits = priced.memory_limit_bytes if memory_limit_bytes is None else (memory_limit_bytes,) * len(plan.stages)
    stages = priced.costs.stages
    if ring_time is not None:
        stages = tuple(with_ring(c, tuple(st.devices), b, ring_time)
                       for c, st, b in zip(stages, plan.stages, priced.allreduce_bytes, strict=True))  # fmt: skip
    return runtime_pipeline(topology, stages, limits, link_bytes, rates, priced.allreduce_bytes)


def measured_pipeline(
    topology: Topology,
    by_stage: Mapping[int, Sequence[dict[str, Any]]],
    link_bytes: Mapping[Link, float],
    rates: Mapping[Link, tuple[float, float]],
    memory_limit_bytes: float | None,
    ring_time: RingTime | None = None,
) -> PipelineModel:
    """The pipeline as the warm-up iteration measured it: per stage the slowest of its processes' forward, backward,
    optimizer step and memory (`by_stage`: each stage's processes' slots, runtime.measurement.observations.unpack),
    each stage limited to `memory_limit_bytes` (None: the least its processes reported).

    A replicated stage's all-reduce is a ring over the plan's stage devices moving the gradient bytes its processes
    measured (their slots' `allreduce_bytes`), at the nominal time `ring_time` gives (the emulated wire's). On the
    real network (`ring_time` None) the stages keep no all-reduce: the runtime records no span for a real
    all-reduce (runtime.execution.replicas.finish_all times only emulated ones; a gloo all-reduce launched after a
    stage's last backward overlaps the other stages' work, and only its exposed tail, in the wait before the
    optimizer step, is in the measured iteration), so there is no measured duration to take as its nominal and no
    Collective for the controller to estimate a ring from; that tail is a prediction error the controller does
    not learn (small beside a stage's compute over loopback).
    """
    stages = []
    limits = []
    gradients = []
    for s in sorted(by_stage):
        parts = by_stage[s]

        def most(name: str, parts: Sequence[dict[str, Any]] = parts) -> float:
            return float(max(p[name] for p in parts))

        stages.append(StageCost(fwd_ms=most("fwd_ms"), bwd_ms=most("bwd_ms"), saved_bytes=most("activation_bytes"),
                                static_bytes=most("static_bytes"), optimizer_ms=most("optimizer_ms")))  # fmt: skip
        limits.append(memory_limit_bytes if memory_limit_bytes is not None else min(p["memory_limit_bytes"] for p in parts))
        gradients.append(float(max(p.get("allreduce_bytes", {}).get(s, 0.0) for p in parts)))
        if ring_time is not None:
            stages[-1] = with_ring(stages[-1], tuple(topology.plan.stages[s].devices), gradients[-1], ring_time)
    return runtime_pipeline(topology, stages, limits, link_bytes, rates, gradients)
