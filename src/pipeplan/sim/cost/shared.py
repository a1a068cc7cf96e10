"""The gradient exchange of shared parameters: which stages hold a copy of each group, and its all-reduce.

When a parameter's layers (core.shared_params) are on several stages of a
plan, each of those stages holds a copy, and every iteration the copies'
gradients are summed: one ring all-reduce of the parameter's bytes over every
device of those stages, all data-parallel replicas and pipeline replicas
included (as Megatron's embedding group, widened to the replicas; its ring's links in that device order). It starts
once every holding stage has run its last backward and delays those stages'
optimizer step until it ends (sim.engine.simulator). A group whose layers are
all on one stage exchanges nothing.
"""

from __future__ import annotations

from collections.abc import Collection

from pipeplan.core.dag import stage_layers
from pipeplan.core.hardware.cluster import Cluster
from pipeplan.core.plan import Plan
from pipeplan.core.profile import ModelProfile
from pipeplan.core.shared_params import SharedGroup, holding_stages
from pipeplan.sim.cost.holding import holding
from pipeplan.sim.cost.layers import static_bytes
from pipeplan.sim.cost.link_model import ring_allreduce_parts
from pipeplan.sim.cost.types import SharedExchange


def exchange_devices(plan: Plan, stages: tuple[int, ...]) -> tuple[int, ...]:
    """Every device of `stages`, in stage order, each once: the ring of the exchange."""
    seen: dict[int, None] = {}
    for s in stages:
        for d in plan.stages[s].devices:
            seen.setdefault(d, None)
    return tuple(seen)


def stage_of_layers(plan: Plan) -> list[int]:
    """The (chunk-)stage of each layer of a chain plan."""
    out = [0] * plan.num_layers
    for s, stage in enumerate(plan.stages):
        for i in range(stage.first_layer, stage.last_layer + 1):
            out[i] = s
    return out


def shared_exchanges(
    plan: Plan, cluster: Cluster, groups: tuple[SharedGroup, ...], grads: float = 1.0
) -> tuple[SharedExchange, ...]:
    """The exchange of every group whose layers are on two or more stages of the chain plan `plan`: its gradients,
    `grads` bytes per parameter byte (sim.cost.holding.Holding.grads).

    Raises:
        ClusterError: two neighbours on the ring cannot talk.
    """
    if not groups:
        return ()
    where = stage_of_layers(plan)
    out = []
    for g in groups:
        stages = holding_stages(g, where)
        if len(stages) > 1:
            devices = exchange_devices(plan, stages)
            total, latency = ring_allreduce_parts(cluster, devices, g.param_bytes * grads)
            out.append(SharedExchange(g.name, g.param_bytes, stages, len(devices), total, devices, latency))
    return tuple(out)


def stage_exchange_ms(exchanges: tuple[SharedExchange, ...], stages: int) -> list[float]:
    """Per stage, its longest exchange (0 for a stage that holds no split group): a floor on its wait after its last
    backward, for lower bounds."""
    out = [0.0] * stages
    for x in exchanges:
        for s in x.stages:
            out[s] = max(out[s], x.exchange_ms)
    return out


def copies_note(plan: Plan, profile: ModelProfile, optimizer_factor: float, stages: Collection[int]) -> str:
    """For a memory refusal naming `stages`: each shared parameter of `profile` one of them holds, with its bytes
    (weights, gradient and optimizer state) and every stage of `plan` holding a copy ("" when they hold none)."""
    if not profile.shared_params:
        return ""
    owner = {u: s for s, layers in enumerate(stage_layers(plan)) for u in layers}
    parts = []
    for g in profile.shared_params:
        holders = sorted({owner[u] for u in g.layers})
        if not any(s in stages for s in holders):
            continue
        held = f"stage {holders[0]}" if len(holders) == 1 else f"stages {', '.join(map(str, holders))}, a copy each"
        need = static_bytes(g.param_bytes, optimizer_factor, holding(profile))
        parts.append(f"{g.name!r} takes {need / 2**30:.2f} GiB on {held}")
    return f" (shared parameters: {'; '.join(parts)})" if parts else ""
