"""The cost model of ARCHITECTURE.md: from a Plan, a profile and a cluster to simulator Costs and memory."""

from __future__ import annotations

import numpy as np

from pipeplan.core.cluster import Cluster
from pipeplan.core.errors import PlanError
from pipeplan.core.plan import Plan
from pipeplan.core.profile import ModelProfile
from pipeplan.core.schedule import Schedule
from pipeplan.schedules import make_schedule
from pipeplan.sim.costs import Costs, Flow, StageCost
from pipeplan.sim.result import SimResult

GIB = float(1 << 30)


def check_plan_matches(plan: Plan, profile: ModelProfile, cluster: Cluster) -> None:
    """Raise PlanError when layers or devices do not exist, or a microbatch cannot be split evenly over a stage's replicas."""
    if plan.num_layers != profile.num_layers:
        raise PlanError(f"plan covers {plan.num_layers} layers but profile {profile.name!r} has {profile.num_layers}")
    for s, stage in enumerate(plan.stages):
        for d in stage.devices:
            if d >= cluster.num_devices:
                raise PlanError(
                    f"stage {s} uses device {d} but cluster {cluster.name!r} has devices 0..{cluster.num_devices - 1}"
                )
    for s in range(len(plan.stages)):
        r = plan.replicas_of(s)
        if plan.microbatch_size % r:
            raise PlanError(
                f"stage {s} has {r} replicas but microbatch_size {plan.microbatch_size} is not a multiple of {r} "
                f"(each microbatch is split evenly over a stage's replicas)"
            )


def scale_of(plan: Plan, profile: ModelProfile) -> float:
    """b / P: the microbatch size over the profile's batch size."""
    return plan.microbatch_size / profile.batch_size


def ms(seconds: float) -> float:
    """Seconds to milliseconds."""
    return seconds * 1000.0


def pair_flow(cluster: Cluster, src: int, dst: int, nbytes: float) -> Flow:
    """One flow of `nbytes` from src to dst, holding the ordered pair and, across nodes, both NICs.

    Raises:
        ClusterError: the pair has zero bandwidth.
    """
    rate = cluster.require_link(src, dst)
    resources = [f"pair:{src}->{dst}"]
    src_node, dst_node = cluster.devices[src].node, cluster.devices[dst].node
    if cluster.nic_bandwidth is not None and src_node != dst_node:
        resources += [f"nic_out:{src_node}", f"nic_in:{dst_node}"]
    return Flow(tuple(resources), (src, dst), ms(cluster.latency[src][dst]), ms(nbytes / rate))


def pairing(senders: tuple[int, ...], receivers: tuple[int, ...]) -> list[tuple[int, int]]:
    """q = min(len) pairs: replica t of the smaller side with replica t of the larger, in device order."""
    q = min(len(senders), len(receivers))
    return [(senders[t], receivers[t]) for t in range(q)]


def boundary_flows(cluster: Cluster, senders: tuple[int, ...], receivers: tuple[int, ...], nbytes: float) -> tuple[Flow, ...]:
    """Flows of one transfer of `nbytes` split over the q pairs; pairs on one device need no flow."""
    pairs = pairing(senders, receivers)
    share = nbytes / len(pairs)
    return tuple(pair_flow(cluster, a, b, share) for a, b in pairs if a != b)


def flows_time(flows: tuple[Flow, ...]) -> float:
    """Unloaded duration of a transfer: its slowest flow."""
    return max((f.latency_ms + f.work_ms for f in flows), default=0.0)


_LINKS: dict[int, tuple[Cluster, np.ndarray, np.ndarray]] = {}


def link_arrays(cluster: Cluster) -> tuple[np.ndarray, np.ndarray]:
    """(effective bytes/s with NIC caps, latency s) as arrays, cached for the last few clusters."""
    cached = _LINKS.get(id(cluster))
    if cached is not None and cached[0] is cluster:
        return cached[1], cached[2]
    rate = np.array(cluster.bandwidth, dtype=float)
    if cluster.nic_bandwidth is not None:
        nodes = np.array([d.node for d in cluster.devices])
        rate = np.where(nodes[:, None] != nodes[None, :], np.minimum(rate, cluster.nic_bandwidth), rate)
    latency = np.array(cluster.latency, dtype=float)
    if len(_LINKS) >= 4:
        _LINKS.pop(next(iter(_LINKS)))
    _LINKS[id(cluster)] = (cluster, rate, latency)  # holds the cluster, so its id cannot be reused while cached
    return rate, latency


_NODES: dict[int, tuple[Cluster, np.ndarray]] = {}


def device_nodes(cluster: Cluster) -> np.ndarray:
    """Each device's node as an int array, cached for the last few clusters (as link_arrays)."""
    cached = _NODES.get(id(cluster))
    if cached is not None and cached[0] is cluster:
        return cached[1]
    if len(_NODES) >= 4:
        _NODES.pop(next(iter(_NODES)))
    nodes = np.array([d.node for d in cluster.devices], dtype=np.int64)
    _NODES[id(cluster)] = (cluster, nodes)
    return nodes


def slowest_replica_flows(plan: Plan, cluster: Cluster, src_stage: int, dst_stage: int, nbytes: float) -> tuple[Flow, ...]:
    """The flows of the pipeline replica whose src->dst transfer is slowest (ties: the lowest replica)."""
    best_replica = 0
    rp = plan.pipeline_replicas
    if rp > 1:
        rate, latency = link_arrays(cluster)
        src = np.array(plan.stages[src_stage].devices).reshape(rp, -1)
        dst = np.array(plan.stages[dst_stage].devices).reshape(rp, -1)
        q = min(src.shape[1], dst.shape[1])
        src, dst = src[:, :q], dst[:, :q]
        with np.errstate(divide="ignore"):
            times = np.where(src == dst, 0.0, latency[src, dst] + (nbytes / q) / rate[src, dst])
        best_replica = int(np.argmax(times.max(axis=1)))
    senders = plan.replica_devices(src_stage, best_replica)
    flows = boundary_flows(cluster, senders, plan.replica_devices(dst_stage, best_replica), nbytes)
    if rp > 1 and cluster.nic_bandwidth is not None:
        flows = share_nics_with_other_replicas(plan, cluster, src_stage, dst_stage, flows)
    return flows


def share_nics_with_other_replicas(
    plan: Plan, cluster: Cluster, src_stage: int, dst_stage: int, flows: tuple[Flow, ...]
) -> tuple[Flow, ...]:
    """Slow the simulated replica's cross-node flows by the NIC share the other pipeline replicas take.

    Note: only one pipeline replica is simulated, but the replicas run in
    lock-step, so the same boundary's transfers of every replica cross the
    nodes' NICs at the same time. A NIC carrying k times as many of this
    boundary's flows as the simulated replica puts on it gives each flow at
    most nic_bandwidth / k (flows of one replica already queue on the NIC
    resource). Without this, rp pipelines crossing one NIC would each be
    predicted to get the whole NIC.
    """
    src = np.array(plan.stages[src_stage].devices).reshape(plan.pipeline_replicas, -1)
    dst = np.array(plan.stages[dst_stage].devices).reshape(plan.pipeline_replicas, -1)
    q = min(src.shape[1], dst.shape[1])  # pairing(): replica t of the smaller side with replica t of the larger
    nodes = device_nodes(cluster)
    src_nodes, dst_nodes = nodes[src[:, :q]], nodes[dst[:, :q]]
    crossing = (src[:, :q] != dst[:, :q]) & (src_nodes != dst_nodes)
    size = int(nodes.max()) + 1
    out_load = np.bincount(src_nodes[crossing], minlength=size).tolist()
    in_load = np.bincount(dst_nodes[crossing], minlength=size).tolist()
    # this replica's own crossing flows per NIC (they already queue on it)
    own_out, own_in = [0] * size, [0] * size
    nodes_of = [(flow, cluster.devices[flow.link[0]].node, cluster.devices[flow.link[1]].node) for flow in flows]
    for flow, a_node, b_node in nodes_of:
        if len(flow.resources) > 1:
            own_out[a_node] += 1
            own_in[b_node] += 1
    shared = []
    for flow, a_node, b_node in nodes_of:
        share = max(out_load[a_node] / own_out[a_node], in_load[b_node] / own_in[b_node]) if len(flow.resources) > 1 else 1.0
        if share > 1.0:
            a, b = flow.link
            rate = min(cluster.bandwidth[a][b], cluster.nic_bandwidth / share)  # type: ignore[operator]
            nbytes = flow.work_ms / 1000.0 * cluster.link_bandwidth(a, b)
            flow = Flow(flow.resources, flow.link, flow.latency_ms, ms(nbytes / rate))
        shared.append(flow)
    return tuple(shared)


def ring_allreduce_ms(cluster: Cluster, devices: tuple[int, ...], nbytes: float) -> float:
    """Ring all-reduce of nbytes over devices (ring in the given order).

    2(n-1)/n * nbytes / (min bandwidth on the ring) + 2(n-1) * latency, with
    the largest latency on the ring; 0 for a single device.
    """
    n = len(devices)
    if n < 2:
        return 0.0
    rate, latency = link_arrays(cluster)
    src = np.array(devices)
    dst = np.roll(src, -1)
    rates = rate[src, dst]
    if not (rates > 0).all():
        bad = int(np.argmin(rates > 0))
        cluster.require_link(int(src[bad]), int(dst[bad]))  # raises, naming the pair
    bandwidth = float(rates.min())
    return ms(2 * (n - 1) / n * nbytes / bandwidth + 2 * (n - 1) * float(latency[src, dst].max()))


def stage_layer_sums(profile: ModelProfile, first: int, last: int) -> tuple[float, float, float, float]:
    """Sums of fwd_ms, bwd_ms, saved_bytes and param_bytes over layers first..last."""
    layers = profile.layers[first : last + 1]
    return (
        sum(layer.fwd_ms for layer in layers),
        sum(layer.bwd_ms for layer in layers),
        sum(layer.saved_bytes for layer in layers),
        sum(layer.param_bytes for layer in layers),
    )


def stage_cost(
    plan: Plan,
    profile: ModelProfile,
    cluster: Cluster,
    s: int,
    optimizer_factor: float,
    bwd_split: tuple[float, float] | None,
) -> StageCost:
    """Compute time, memory and all-reduce of stage s for one microbatch."""
    stage = plan.stages[s]
    r = plan.replicas_of(s)
    speed = min(cluster.devices[d].speed for d in stage.devices)
    fwd, bwd, saved, params = stage_layer_sums(profile, stage.first_layer, stage.last_layer)
    scale = scale_of(plan, profile)
    fwd_ms = fwd * scale / (r * speed)
    bwd_ms = bwd * scale / (r * speed)
    bwd_input = bwd_weight = None
    if bwd_split is not None:
        bwd_input, bwd_weight = bwd_ms * bwd_split[0], bwd_ms * bwd_split[1]
    return StageCost(
        fwd_ms=fwd_ms,
        bwd_ms=bwd_ms,
        bwd_input_ms=bwd_input,
        bwd_weight_ms=bwd_weight,
        saved_bytes=saved * scale / r,
        static_bytes=params * (2 + optimizer_factor),
        allreduce_ms=ring_allreduce_ms(cluster, stage.devices, params),
    )


def plan_costs(
    plan: Plan,
    profile: ModelProfile,
    cluster: Cluster,
    optimizer_factor: float = 2.0,
    bwd_split: tuple[float, float] | None = None,
) -> Costs:
    """The simulator's costs for one pipeline replica of `plan`.

    Args:
        plan: the plan; for interleaved plans the stage list holds p*v chunk-stages.
        profile: per-layer costs for `profile.batch_size` samples; scaled by b/P.
        cluster: devices and links.
        optimizer_factor: optimizer state per parameter byte (2 = Adam).
        bwd_split: fractions (input, weight) of the backward for zero-bubble
            schedules; None: half each.

    Returns:
        Costs with per-stage compute, memory and all-reduce, and the flows of
        every boundary in both directions.

    Raises:
        PlanError: the plan does not match the profile or cluster.
        ClusterError: two devices that must talk have zero bandwidth.

    Note:
        Pipeline replicas are simulated as one: compute runs at the slowest
        speed among all of a stage's devices, and each boundary uses the flows
        of the pipeline replica whose transfer is slowest (replica 0 when the
        replicas are alike), so a plan cannot hide slow links in replica > 0.
    """
    check_plan_matches(plan, profile, cluster)
    if bwd_split is not None and (len(bwd_split) != 2 or min(bwd_split) < 0):
        raise PlanError(f"bwd_split must be two fractions >= 0 (input, weight), got {bwd_split!r}")
    stages = tuple(stage_cost(plan, profile, cluster, s, optimizer_factor, bwd_split) for s in range(len(plan.stages)))
    scale = scale_of(plan, profile)
    forward, backward = [], []
    for s in range(len(plan.stages) - 1):
        nbytes = profile.cut_bytes[plan.stages[s].last_layer] * scale
        forward.append(slowest_replica_flows(plan, cluster, s, s + 1, nbytes))
        backward.append(slowest_replica_flows(plan, cluster, s + 1, s, nbytes))
    return Costs(stages, tuple(forward), tuple(backward))


def plan_schedule(plan: Plan) -> Schedule:
    """The plan's schedule: generated from its fields, or its stored order for `list`.

    Raises:
        PlanError: a `list` plan without an order.
        ScheduleError: the generator rejects the plan's sizes.
    """
    if plan.schedule == "list":
        if plan.order is None:
            raise PlanError("plan schedule 'list' needs an explicit order, got none")
        stage_to_rank = tuple(s % plan.num_ranks for s in range(len(plan.stages)))
        return Schedule(plan.order, stage_to_rank, "list")
    if plan.order is not None:
        raise PlanError(f"plan schedule {plan.schedule!r} is generated; only 'list' plans carry an order")
    return make_schedule(plan.schedule, plan.num_ranks, plan.microbatches, k=plan.k, chunks=plan.chunks)


def simulate_plan(
    plan: Plan,
    profile: ModelProfile,
    cluster: Cluster,
    trace: object = None,
    record: bool = True,
    optimizer_factor: float = 2.0,
    bwd_split: tuple[float, float] | None = None,
) -> SimResult:
    """Simulate one iteration of `plan` (see plan_costs and plan_schedule)."""
    from pipeplan.sim import simulate

    costs = plan_costs(plan, profile, cluster, optimizer_factor, bwd_split)
    return simulate(plan_schedule(plan), costs, trace=trace, record=record)


def order_peak_activation(schedule: Schedule, saved_bytes: tuple[float, ...]) -> tuple[float, ...]:
    """Peak activation bytes per rank, from each rank's order.

    A rank runs one action at a time, so the set of in-flight microbatches
    (from the start of F to the end of B, or of W when split) at any moment is
    fixed by the order alone: the peak does not depend on timing.
    """
    peaks = []
    for actions in schedule.ranks:
        held = peak = 0.0
        for a in actions:
            if a.op == "F":
                held += saved_bytes[a.stage]
                peak = max(peak, held)
            elif a.op in "BW":
                held -= saved_bytes[a.stage]
        peaks.append(peak)
    return tuple(peaks)


def memory_per_device(
    plan: Plan,
    profile: ModelProfile,
    cluster: Cluster,
    result: SimResult | None = None,
    optimizer_factor: float = 2.0,
) -> tuple[float, ...]:
    """Peak bytes on every cluster device (0 for devices the plan leaves unused).

    param_bytes_s * (2 + optimizer_factor) for every (chunk-)stage on the device,
    plus peak in-flight * saved bytes per microbatch / r_s.

    Args:
        result: a simulation of this plan with its full microbatch count; when
            given, its per-rank peak memory is used. When None, the peak is
            taken from the schedule's order (the same value: a rank runs its
            actions one at a time, so in-flight counts do not depend on timing).
    """
    p = plan.num_ranks
    if result is not None:
        if len(result.per_rank) != p:
            raise PlanError(f"simulation result has {len(result.per_rank)} ranks but the plan has {p}")
        per_rank = tuple(r.peak_memory_bytes for r in result.per_rank)
    else:
        costs = plan_costs(plan, profile, cluster, optimizer_factor)
        static = [0.0] * p
        for s, cost in enumerate(costs.stages):
            static[s % p] += cost.static_bytes
        activation = order_peak_activation(plan_schedule(plan), tuple(c.saved_bytes for c in costs.stages))
        per_rank = tuple(static[r] + activation[r] for r in range(p))
    memory = [0.0] * cluster.num_devices
    for rank in range(p):
        for d in plan.stages[rank].devices:
            memory[d] = per_rank[rank]
    return tuple(memory)


def check_fits(
    plan: Plan,
    profile: ModelProfile,
    cluster: Cluster,
    result: SimResult | None = None,
    optimizer_factor: float = 2.0,
) -> tuple[float, ...]:
    """Return memory_per_device, or raise PlanError for the device that overflows the most.

    Raises:
        PlanError: naming the stage, device, need and capacity in GiB and the excess.
    """
    memory = memory_per_device(plan, profile, cluster, result, optimizer_factor)
    worst: tuple[float, int, int] | None = None
    for rank in range(plan.num_ranks):
        for d in plan.stages[rank].devices:
            excess = memory[d] - cluster.devices[d].memory_bytes
            if excess > 0 and (worst is None or excess > worst[0]):
                worst = (excess, rank, d)
    if worst is not None:
        excess, rank, d = worst
        raise PlanError(
            f"stage {rank} needs {memory[d] / GIB:.2f} GiB on device {d} ({cluster.devices[d].kind}, "
            f"{cluster.devices[d].memory_bytes / GIB:.2f} GiB): {excess / GIB:.2f} GiB too much "
            f"({profile.name}, microbatch size {plan.microbatch_size}, schedule {plan.schedule})"
        )
    return memory
