"""Links and all-reduce in the cost model: NIC-capped rates, flows of a stage-boundary transfer, ring all-reduce.

The one place these formulas live (ARCHITECTURE.md, "Cost model (sim)"):
- a pair's effective rate is its bandwidth, capped by the NIC rate between nodes;
- a transfer of n bytes between a stage on r1 and one on r2 devices uses
  q = min(r1, r2) pairs (replica t with replica t, in device order), each
  carrying n / q; a pair takes latency + bytes / rate (its flows are built
  in sim/cost/flow_sets.py);
- a ring all-reduce of n bytes over k devices takes 2(k-1)/k * n / (slowest
  link on the ring) + 2(k-1) * (largest latency on the ring), or the same
  with the cluster's measured all-reduce bus bandwidth and latency; its
  links are the ring's ordered pairs (each device to the next, the last to
  the first: sim.cost.types.ring_links, read by ring_group_links), the same with a measured rate (the
  cluster's measured all-reduce bus bandwidth, at the ring's share of its nodes' NICs across nodes:
  measured_ring_share). Only the ring all-reduce is modelled: a tree all-reduce would use other links and
  other times.
Planners that estimate costs (partition DP, exact's bounds, list scheduling)
take these functions or their array forms from here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import numpy as np

from pipeplan.core.hardware.cluster import Cluster
from pipeplan.core.hardware.links import LinkMatrix
from pipeplan.core.units import MS_PER_S, wire_ms
from pipeplan.sim.cost.types import Flow

_KEEP = 4
"""Clusters each per-cluster cache below holds (the last ones asked for)."""
T = TypeVar("T")
_LINKS: dict[int, tuple[Cluster, tuple[LinkMatrix, LinkMatrix]]] = {}
_NODES: dict[int, tuple[Cluster, np.ndarray]] = {}
_SIZES: dict[int, tuple[Cluster, np.ndarray]] = {}
_RINGS: dict[int, tuple[Cluster, dict[tuple[int, ...], tuple[float, float]]]] = {}
_RINGS_KEPT = 1 << 16
"""Rings _ring_links keeps per cluster before it starts again (a bound on the memory of a long search)."""


def _per_cluster(store: dict[int, tuple[Cluster, T]], cluster: Cluster, build: Callable[[Cluster], T]) -> T:
    """`build(cluster)`, kept in `store` for the last _KEEP clusters; an entry holds its cluster, so the cluster's id
    cannot be reused by another while it is cached."""
    cached = store.get(id(cluster))
    if cached is not None and cached[0] is cluster:
        return cached[1]
    value = build(cluster)
    if len(store) >= _KEEP:
        store.pop(next(iter(store)))
    store[id(cluster)] = (cluster, value)
    return value


def link_arrays(cluster: Cluster) -> tuple[LinkMatrix, LinkMatrix]:
    """(effective bytes/s with NIC caps, latency ms) as link matrices, cached for the last few clusters.

    Off the diagonal the latency includes the cluster's message latency (Cluster.link_latency); the diagonal keeps
    the cluster's own values (unused: a device does not send to itself). Both index like numpy arrays
    (`rate[src, dst]` with integer arrays) and keep a described cluster's structure (no n x n array).
    """
    return _per_cluster(_LINKS, cluster, _link_arrays)


def _link_arrays(cluster: Cluster) -> tuple[LinkMatrix, LinkMatrix]:
    nodes = device_nodes(cluster)
    rate = cluster.bandwidth_bytes_per_s.transformed(nodes, cluster.nic_bytes_per_s, 0.0, None)
    latency = cluster.latency_ms.transformed(nodes, None, cluster.message_latency_ms, None)
    return rate, latency


def link_matrices(cluster: Cluster) -> tuple[LinkMatrix, LinkMatrix]:
    """link_arrays with the diagonal's rate set to inf (a device reaches itself at once): planners' copies."""
    rate, latency = link_arrays(cluster)
    return rate.transformed(device_nodes(cluster), None, 0.0, np.inf), latency


def device_nodes(cluster: Cluster) -> np.ndarray:
    """Each device's node as an int array, cached for the last few clusters (as link_arrays)."""
    return _per_cluster(_NODES, cluster, lambda c: np.array([d.node for d in c.devices], dtype=np.int64))


def pair_ms(cluster: Cluster, src: int, dst: int, nbytes: float) -> float:
    """Unqueued time of nbytes from src to dst: latency + bytes / effective rate (0 on one device).

    Raises:
        ClusterError: the pair has zero bandwidth.
    """
    if src == dst:
        return 0.0
    return cluster.link_latency(src, dst) + wire_ms(nbytes, cluster.require_link(src, dst))


def flows_time(flows: tuple[Flow, ...]) -> float:
    """Unloaded duration of a transfer: its slowest flow."""
    return max((f.latency_ms + f.work_ms for f in flows), default=0.0)


def ring_allreduce_ms(cluster: Cluster, devices: tuple[int, ...], nbytes: float) -> float:
    """Ring all-reduce of nbytes over devices (ring in the given order).

    2(n-1)/n * nbytes / (min bandwidth on the ring) + 2(n-1) * latency, with
    the largest latency on the ring; with a measured all-reduce on the
    cluster, its bus bandwidth (at the ring's share of its nodes' NICs,
    measured_ring_share) and latency instead; 0 for a single device.

    Raises:
        ClusterError: two neighbours on the ring cannot talk.
    """
    n = len(devices)
    if n < 2:
        return 0.0
    bandwidth, latency = _ring_links(cluster, devices)
    return wire_ms(2 * (n - 1) / n * nbytes, bandwidth) + 2 * (n - 1) * latency


def ring_allreduce_parts(cluster: Cluster, devices: tuple[int, ...], nbytes: float) -> tuple[float, float]:
    """ring_allreduce_ms and its fixed part: (total ms, latency ms), the total the same float as ring_allreduce_ms's.

    The rest (total - latency) moves the bytes at the ring's slowest rate: what a slower ring link stretches.

    Raises:
        ClusterError: two neighbours on the ring cannot talk.
    """
    n = len(devices)
    if n < 2:
        return 0.0, 0.0
    bandwidth, latency = _ring_links(cluster, devices)
    fixed = 2 * (n - 1) * latency
    total = wire_ms(2 * (n - 1) / n * nbytes, bandwidth) + fixed
    return total, min(fixed, total)


def ring_allreduce_terms(cluster: Cluster, devices: tuple[int, ...]) -> tuple[float, float]:
    """ring_allreduce_ms as (ms per byte, fixed ms): the same formula in the linear form the planners' DPs use."""
    n = len(devices)
    if n < 2:
        return 0.0, 0.0
    bandwidth, latency = _ring_links(cluster, devices)
    return MS_PER_S * 2 * (n - 1) / n / bandwidth, 2 * (n - 1) * latency


def _ring_links(cluster: Cluster, devices: tuple[int, ...]) -> tuple[float, float]:
    """(bytes/s, ms) of a ring over devices: its slowest link and largest latency (ring_group_links), or the measured
    collective's at the ring's share of its nodes' NICs (measured_ring_share). Kept per cluster (the last _KEEP) and
    ring, up to _RINGS_KEPT rings each: a search prices the same data-parallel rings under many stages."""
    known = _per_cluster(_RINGS, cluster, lambda c: {})
    found = known.get(devices)
    if found is not None:
        return found
    rates, latencies = ring_group_links(cluster, np.array([devices], dtype=np.int64))
    if cluster.allreduce_bytes_per_s is not None:
        found = cluster.allreduce_bytes_per_s * measured_ring_share(cluster, devices), cluster.allreduce_latency_ms
    else:
        found = float(rates[0]), float(latencies[0])
    if len(known) >= _RINGS_KEPT:
        known.clear()
    known[devices] = found
    return found


def ring_group_links(cluster: Cluster, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per ring (each row of `groups`, a ring in its row's order, the last device back to the first): its slowest
    link's effective rate (bytes/s, NIC-capped: link_arrays) and its largest latency (ms), as two arrays.

    The one place a ring's links are read: the data-parallel ring (ring_allreduce_ms) and a stage's tensor-parallel
    groups (sim.cost.tensor_parallel.group_collectives_ms) both take them from here.

    Raises:
        ClusterError: two neighbours of a ring cannot talk (naming the first such pair, row by row).
    """
    rate, latency = link_arrays(cluster)
    src = np.asarray(groups, dtype=np.int64)
    dst = np.roll(src, -1, axis=1)
    rates = rate.values(src, dst)  # device ids a plan holds: valid, no index checks
    if not (rates > 0).all():
        bad = int(np.argmin(rates.ravel() > 0))
        cluster.require_link(int(src.ravel()[bad]), int(dst.ravel()[bad]))  # raises, naming the pair
    return rates.min(axis=1), latency.values(src, dst).max(axis=1)


def measured_ring_share(cluster: Cluster, devices: tuple[int, ...]) -> float:
    """The share of a cluster's measured all-reduce bus bandwidth a ring over `devices` gets: 1 on one node; across
    nodes, the smallest share of a node's devices the ring holds, min over its nodes of (ring devices on the node /
    devices on the node).

    A measured cross-node all-reduce (Cluster.allreduce_bytes_per_s, presets.calibrated) is a ring over every
    device of each node, which NCCL runs one channel per NIC, so its bus bandwidth is the node's NICs together. A
    ring holding k of a node's g devices uses the k devices' own NICs: k / g of that bandwidth (one GPU per node,
    the data-parallel ring of one tensor-parallel rank: one NIC's rate; the t rings of a group of t run at once,
    each on its own NICs). The node the ring holds least of sets the rate, as its slowest link would.
    """
    ring_nodes, held = np.unique(device_nodes(cluster)[np.asarray(devices, dtype=np.int64)], return_counts=True)
    if ring_nodes.size < 2:
        return 1.0
    return float((held / _node_sizes(cluster)[ring_nodes]).min())


def _node_sizes(cluster: Cluster) -> np.ndarray:
    """Devices per node (indexed by node id), cached for the last few clusters (as device_nodes)."""
    return _per_cluster(_SIZES, cluster, lambda c: np.bincount(device_nodes(c)))
