"""A plan priced by the cost model: per-stage compute, memory, all-reduce and optimizer, per-boundary flows."""

from __future__ import annotations

import dataclasses
from operator import attrgetter, itemgetter

from pipeplan.core.dag import check_order
from pipeplan.core.errors import CostError, PlanError
from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace
from pipeplan.core.hardware.cluster import Cluster
from pipeplan.core.partition import splits_evenly
from pipeplan.core.plan import Plan
from pipeplan.sim.cost.chain_view import chain_view
from pipeplan.sim.cost.flow_sets import FlowMemo, plan_flows
from pipeplan.sim.cost.grad_buckets import stage_buckets
from pipeplan.sim.cost.layers import static_bytes
from pipeplan.sim.cost.link_model import ring_allreduce_parts
from pipeplan.sim.cost.model import CostModel
from pipeplan.sim.cost.shared import shared_exchanges
from pipeplan.sim.cost.tensor_parallel import check_tp_widths, group_collectives_ms, split_stage
from pipeplan.sim.cost.types import Costs, GradBucket, StageCost


def layer_span(first: int, last: int) -> str:
    """'layer 7' or 'layers 7-9'."""
    return f"layer {first}" if first == last else f"layers {first}-{last}"


def check_plan_matches(plan: Plan, model: CostModel) -> None:
    """Raise PlanError when layers or devices do not exist, the plan's layer order puts a layer before one of its inputs,
    a microbatch cannot be split evenly over a stage's replicas, or a stage's tp does not divide a split layer's width."""
    profile, cluster = model.profile, model.cluster
    n, m = plan.num_layers, profile.num_layers
    if n < m:
        verb = "is" if n == m - 1 else "are"
        raise PlanError(f"plan covers {n} layers but profile {profile.name!r} has {m}: {layer_span(n, m - 1)} {verb} in no stage")
    if n > m:
        raise PlanError(
            f"plan covers {n} layers but profile {profile.name!r} has {m}: its stages name {layer_span(m, n - 1)}, which "
            "the profile does not have (a plan for another model?)"
        )
    if plan.layer_order is not None:
        check_order(profile, plan.layer_order)
    devices = cluster.num_devices
    for s, stage in enumerate(plan.stages):
        if max(stage.devices) >= devices:
            d = next(d for d in stage.devices if d >= devices)
            raise PlanError(f"stage {s} uses device {d} but cluster {cluster.name!r} has devices 0..{devices - 1}")
    for s in range(len(plan.stages)):
        r = plan.replicas_of(s)
        if not splits_evenly(plan.microbatch_size, r):
            raise PlanError(
                f"stage {s} has {r} replicas but microbatch_size {plan.microbatch_size} is not a multiple of {r} "
                f"(each microbatch is split evenly over a stage's replicas)"
            )
        stage = plan.stages[s]
        if stage.tp > 1:
            positions = range(stage.first_layer, stage.last_layer + 1)
            order = plan.layer_order
            check_tp_widths(profile, s, [p if order is None else order[p] for p in positions], stage.tp)


def device_speeds(cluster: Cluster, devices: tuple[int, ...]) -> list[float]:
    """speed of each of `devices`, in order (whole-tuple lookups: a stage may span thousands of devices)."""
    if len(devices) == 1:
        return [cluster.devices[devices[0]].speed]
    return list(map(_SPEED, itemgetter(*devices)(cluster.devices)))


_SPEED = attrgetter("speed")


def stage_cost(plan: Plan, model: CostModel, s: int) -> StageCost:
    """Compute time, memory, all-reduce and optimizer step of stage s for one microbatch.

    Every device of the stage (all its replicas, in every pipeline replica)
    runs at the slowest one's speed; each holds the stage's whole weights,
    gradients and optimizer state, and its share of the microbatch's saved bytes.
    Its all-reduce is a ring over the stage's devices in their order (link_model: its links, latency and work) of
    its gradients in the dtype they are reduced in (sim.cost.holding: param_bytes x Holding.grads),
    in buckets overlapping the backward when the model asks (CostModel.allreduce_bucket_bytes, sim.cost.grad_buckets).
    A tensor-parallel stage (tp > 1) or a sharded plan (zero > 0) is priced as sim.cost.tensor_parallel says; its
    data-parallel ring is over the first device of every group (each rank of a group has its own, alike).
    """
    stage = plan.stages[s]
    cluster = model.cluster
    r = plan.replicas_of(s)
    speed = min(device_speeds(cluster, stage.devices))
    layers = range(stage.first_layer, stage.last_layer + 1)
    t = stage.tp
    if t > 1:
        work, traffic = split_stage(model.layers, layers, plan.microbatch_size, r, speed, t, stage.sequence_parallel)
    else:
        work = model.layers.stage(layers, plan.microbatch_size, r, speed)
    bwd_input, bwd_weight = work.bwd_input_ms, work.bwd_weight_ms
    if model.bwd_split is not None:
        bwd_input, bwd_weight = work.bwd_ms * model.bwd_split[0], work.bwd_ms * model.bwd_split[1]
    fwd, bwd = work.fwd_ms, work.bwd_ms
    if t > 1:
        fwd_comm, bwd_comm = group_collectives_ms(cluster, stage.devices, t, traffic)
        if bwd_input is None:  # the simulator would halve B: keep the compute's halves, the input gradient's collectives on I
            bwd_input, bwd_weight = bwd / 2, bwd / 2
        fwd, bwd, bwd_input = fwd + fwd_comm, bwd + bwd_comm, bwd_input + bwd_comm
    ring = stage.devices[::t] if t > 1 else stage.devices
    held = model.holding
    grad_bytes = work.param_bytes * held.grads  # the gradients the exchange moves, in the dtype they are reduced in
    allreduce_ms, allreduce_latency_ms = ring_allreduce_parts(cluster, ring, grad_bytes)
    buckets: tuple[GradBucket, ...] = ()
    if model.allreduce_bucket_bytes is not None:
        samples = plan.microbatch_size / r
        buckets = stage_buckets(model.layers, layers, samples, cluster, ring, grad_bytes, model.allreduce_bucket_bytes)
        allreduce_ms = sum((b.allreduce_ms for b in buckets), 0.0)
        allreduce_latency_ms = min(allreduce_ms, sum((b.latency_ms for b in buckets), 0.0))
    static, optimizer = static_bytes(work.param_bytes, model.optimizer_factor, held), work.optimizer_ms
    d = plan.data_parallel_of(s) if plan.zero else 1
    if d > 1:
        static, optimizer = held.sharded(work.param_bytes, model.optimizer_factor, plan.zero, d), optimizer / d
    try:
        return StageCost(
            fwd_ms=fwd,
            bwd_ms=bwd,
            bwd_input_ms=bwd_input,
            bwd_weight_ms=bwd_weight,
            saved_bytes=work.saved_bytes,
            static_bytes=static,
            allreduce_ms=allreduce_ms,
            optimizer_ms=optimizer,
            allreduce_ring=ring if len(ring) > 1 else (),
            allreduce_latency_ms=allreduce_latency_ms,
            allreduce_buckets=buckets,
        )
    except CostError as exc:  # a derived value out of range: name the inputs it was derived from
        raise CostError(
            f"stage {s} of the plan (layers {stage.first_layer}..{stage.last_layer} of profile {model.profile.name!r}, "
            f"microbatch size {plan.microbatch_size} over {r} replica(s), slowest device speed {speed:g} in cluster "
            f"{cluster.name!r}) computes {exc}"
        ) from None


StageKey = tuple[int, int, tuple[int, ...], int, int] | tuple[int, int, tuple[int, ...], int, int, int, bool, int]
"""What stage_cost depends on besides the model: first and last layer, devices, replicas, microbatch size (and
for a 3D plan, the stage's tp and sequence parallelism and the plan's zero)."""


def plan_costs(
    plan: Plan,
    model: CostModel,
    trace: BandwidthTrace | None = None,
    stage_memo: dict[StageKey, StageCost] | None = None,
    flow_memo: FlowMemo | None = None,
) -> Costs:
    """The simulator's costs for one pipeline replica of `plan`.

    Args:
        plan: the plan; for interleaved plans the stage list holds p*v chunk-stages.
        model: the cost model (profile, cluster, scaling, optimizer).
        trace: the bandwidth trace the costs will be simulated under, if any (flows on the links it names are
            kept one by one; sim/cost/flow_sets.py drops only copies that would run exactly alike).
        stage_memo: stage costs already computed with `model` (a planner's Evaluator keeps one): read and filled
            here, as most stages recur from plan to plan in a search (a stage on 8,192 devices costs ~0.3 ms).
        flow_memo: the transfers already built on `model`'s cluster (sim.cost.flow_sets.FlowMemo; an Evaluator
            keeps one): most stage boundaries recur from plan to plan as well.

    Returns:
        Costs with per-stage compute, memory, all-reduce and optimizer step,
        the flows of every boundary in both directions, and the gradient
        exchange of every shared parameter the plan splits over stages.

    Raises:
        PlanError: the plan does not match the profile or cluster.
        ClusterError: two devices that must talk have zero bandwidth.

    Note:
        Pipeline replicas are simulated as one: compute runs at the slowest
        speed among all of a stage's devices, and each boundary uses the flows
        of the pipeline replica whose transfer is slowest (replica 0 when the
        replicas are alike), so a plan cannot hide slow links in replica > 0.
        Copies of a group of flows (a stage replicated over many nodes) are
        dropped: they would start and end when their kept twin does. A plan
        with a layer order is priced as the chain plan of that order
        (sim.cost.chain_view).
    """
    check_plan_matches(plan, model)
    viewed, viewed_model = chain_view(plan, model)
    memo = stage_memo if stage_memo is not None and viewed_model is model else None  # a layer order: another model
    plan, model = viewed, viewed_model
    stages = [stage_cost(plan, model, s) if memo is None else _remembered(plan, model, s, memo) for s in range(len(plan.stages))]
    cuts = [model.layers.cut_bytes(plan.stages[s].last_layer, plan.microbatch_size) for s in range(len(plan.stages) - 1)]
    keep = () if trace is None else {step.link for step in trace.steps if step.link is not None}
    flows = plan_flows(plan, model.cluster, cuts, keep, memo=flow_memo)
    forward, backward = list(flows[0]), list(flows[1])
    overhead = model.cluster.message_overhead_ms
    if overhead > 0:
        charge_messages(stages, forward, backward, overhead)
    shared = shared_exchanges(plan, model.cluster, model.profile.shared_params, model.holding.grads)
    return Costs(tuple(stages), tuple(forward), tuple(backward), shared)


def _remembered(plan: Plan, model: CostModel, s: int, memo: dict[StageKey, StageCost]) -> StageCost:
    """stage_cost of stage s, from `memo` when that stage was priced before (then stored there)."""
    stage = plan.stages[s]
    key: StageKey = (stage.first_layer, stage.last_layer, stage.devices, plan.replicas_of(s), plan.microbatch_size)
    if stage.tp > 1 or plan.zero:
        key = (*key, stage.tp, stage.sequence_parallel, plan.zero)
    cost = memo.get(key)
    if cost is None:
        cost = memo[key] = stage_cost(plan, model, s)
    return cost


def charge_messages(stages: list[StageCost], forward: list[tuple], backward: list[tuple], overhead_ms: float) -> None:
    """Add the cluster's per-message overhead to every action that consumes a message from another device.

    A stage's forward consumes the activation from the stage before it, its
    backward (or I) the gradient from the stage after it; chunk-stages on one
    device exchange nothing and pay nothing.
    """
    for s in range(len(stages) - 1):
        if forward[s]:
            stages[s + 1] = dataclasses.replace(stages[s + 1], fwd_ms=stages[s + 1].fwd_ms + overhead_ms)
        if backward[s]:
            cost = stages[s]
            stages[s] = dataclasses.replace(
                cost,
                bwd_ms=cost.bwd_ms + overhead_ms,
                bwd_input_ms=cost.bwd_input_ms + overhead_ms,  # type: ignore[operator]
            )
