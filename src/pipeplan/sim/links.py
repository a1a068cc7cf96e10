"""Links and all-reduce in the cost model: NIC-capped rates, flows of a stage-boundary transfer, ring all-reduce.

The one place these formulas live (ARCHITECTURE.md, "Cost model (sim)"):
- a pair's effective rate is its bandwidth, capped by the NIC rate between nodes;
- a transfer of n bytes between a stage on r1 and one on r2 devices uses
  q = min(r1, r2) pairs (replica t with replica t, in device order), each
  carrying n / q; a pair takes latency + bytes / rate;
- a ring all-reduce of n bytes over k devices takes 2(k-1)/k * n / (slowest
  link on the ring) + 2(k-1) * (largest latency on the ring), or the same
  with the cluster's measured all-reduce bus bandwidth and latency.
Planners that estimate costs (partition DP, exact's bounds, list scheduling)
take these functions or their array forms from here.
"""

from __future__ import annotations

import numpy as np

from pipeplan.core.cluster import Cluster
from pipeplan.core.plan import Plan
from pipeplan.sim.costs import Flow


def ms(seconds: float) -> float:
    """Seconds to milliseconds."""
    return seconds * 1000.0


_LINKS: dict[int, tuple[Cluster, np.ndarray, np.ndarray]] = {}


def link_arrays(cluster: Cluster) -> tuple[np.ndarray, np.ndarray]:
    """(effective bytes/s with NIC caps, latency s) as arrays, cached for the last few clusters.

    Off the diagonal the latency includes the cluster's message latency (Cluster.link_latency); the diagonal keeps
    the cluster's own values (unused: a device does not send to itself).
    """
    cached = _LINKS.get(id(cluster))
    if cached is not None and cached[0] is cluster:
        return cached[1], cached[2]
    rate = np.array(cluster.bandwidth, dtype=float)
    if cluster.nic_bandwidth is not None:
        nodes = np.array([d.node for d in cluster.devices])
        rate = np.where(nodes[:, None] != nodes[None, :], np.minimum(rate, cluster.nic_bandwidth), rate)
    latency = np.array(cluster.latency, dtype=float)
    if cluster.message_latency > 0:  # off the diagonal only, without an n x n identity beside the matrix
        diagonal = latency.diagonal().copy()
        latency += cluster.message_latency
        np.fill_diagonal(latency, diagonal)
    if len(_LINKS) >= 4:
        _LINKS.pop(next(iter(_LINKS)))
    _LINKS[id(cluster)] = (cluster, rate, latency)  # holds the cluster, so its id cannot be reused while cached
    return rate, latency


def link_matrices(cluster: Cluster) -> tuple[np.ndarray, np.ndarray]:
    """link_arrays with the diagonal's rate set to inf (a device reaches itself at once): planners' copies."""
    rate, latency = link_arrays(cluster)
    rate = rate.copy()
    np.fill_diagonal(rate, np.inf)
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


def pair_ms(cluster: Cluster, src: int, dst: int, nbytes: float) -> float:
    """Unqueued time of nbytes from src to dst: latency + bytes / effective rate (0 on one device).

    Raises:
        ClusterError: the pair has zero bandwidth.
    """
    if src == dst:
        return 0.0
    return cluster.link_latency(src, dst) * 1000.0 + nbytes / cluster.require_link(src, dst) * 1000.0


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
    return Flow(tuple(resources), (src, dst), ms(cluster.link_latency(src, dst)), ms(nbytes / rate))


def pairing(senders: tuple[int, ...], receivers: tuple[int, ...]) -> list[tuple[int, int]]:
    """q = min(len) pairs: replica t of the smaller side with replica t of the larger, in device order."""
    q = min(len(senders), len(receivers))
    return [(senders[t], receivers[t]) for t in range(q)]


def boundary_flows(cluster: Cluster, senders: tuple[int, ...], receivers: tuple[int, ...], nbytes: float) -> tuple[Flow, ...]:
    """Flows of one transfer of `nbytes` split over the q pairs; pairs on one device need no flow."""
    pairs = pairing(senders, receivers)
    share = nbytes / len(pairs)
    return tuple(pair_flow(cluster, a, b, share) for a, b in pairs if a != b)


def transfer_ms(cluster: Cluster, senders: tuple[int, ...], receivers: tuple[int, ...], nbytes: float) -> float:
    """Unqueued time of one transfer of `nbytes` between two stages' devices: its slowest pair."""
    return flows_time(boundary_flows(cluster, senders, receivers, nbytes))


def flows_time(flows: tuple[Flow, ...]) -> float:
    """Unloaded duration of a transfer: its slowest flow."""
    return max((f.latency_ms + f.work_ms for f in flows), default=0.0)


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

    Note:
        Only one pipeline replica is simulated, but the replicas run in
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
    the largest latency on the ring; with a measured all-reduce on the
    cluster, its bus bandwidth and latency instead; 0 for a single device.

    Raises:
        ClusterError: two neighbours on the ring cannot talk.
    """
    n = len(devices)
    if n < 2:
        return 0.0
    bandwidth, latency = _ring_links(cluster, devices)
    return ms(2 * (n - 1) / n * nbytes / bandwidth + 2 * (n - 1) * latency)


def ring_allreduce_terms(cluster: Cluster, devices: tuple[int, ...]) -> tuple[float, float]:
    """ring_allreduce_ms as (ms per byte, fixed ms): the same formula in the linear form the planners' DPs use."""
    n = len(devices)
    if n < 2:
        return 0.0, 0.0
    bandwidth, latency = _ring_links(cluster, devices)
    return 1000.0 * 2 * (n - 1) / n / bandwidth, 1000.0 * 2 * (n - 1) * latency


def _ring_links(cluster: Cluster, devices: tuple[int, ...]) -> tuple[float, float]:
    """(bytes/s, s) of a ring over devices: its slowest link and largest latency, or the measured collective's."""
    rate, latency = link_arrays(cluster)
    src = np.array(devices)
    dst = np.roll(src, -1)
    rates = rate[src, dst]
    if not (rates > 0).all():
        bad = int(np.argmin(rates > 0))
        cluster.require_link(int(src[bad]), int(dst[bad]))  # raises, naming the pair
    if cluster.allreduce_bandwidth is not None:
        return cluster.allreduce_bandwidth, cluster.allreduce_latency
    return float(rates.min()), float(latency[src, dst].max())
