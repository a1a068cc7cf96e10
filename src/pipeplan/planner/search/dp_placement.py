"""Where a partition-DP stage sits: per first unit of a stage of rho units in a Layout, its slowest device's speed, its
smallest memory, its ring all-reduce terms and its outgoing link (partition_dp's placement arrays)."""

from __future__ import annotations

import numpy as np

from pipeplan.core.hardware.cluster import Cluster
from pipeplan.core.units import MS_PER_S
from pipeplan.planner.search.mapping import Layout
from pipeplan.sim.cost.link_model import link_arrays, ring_allreduce_terms

INF = np.inf

CHUNK_ENTRIES = 1 << 20
"""Placement arrays are built this many (position, device) entries at a time, which bounds their memory."""


def placement_arrays(
    cluster: Cluster, bandwidth: np.ndarray, latency: np.ndarray, layout: Layout, rho: int
) -> dict[str, np.ndarray]:
    """Per first unit a of a stage of `rho` units: min speed, min memory, ring all-reduce terms, outgoing link.

    The stage at unit a runs on layout.devices(a, rho); its outgoing transfer goes to a stage assumed to have as
    many replicas, just below it in the order (device i of the one paired with device i of the other). All
    positions at once, as index arrays, a chunk of CHUNK_ENTRIES at a time.
    """
    positions = layout.units - rho + 1
    r = rho * layout.unit
    order = np.asarray(layout.order, dtype=np.int64)
    devices_all = cluster.devices
    device_speed = np.array([d.speed for d in devices_all], dtype=float)
    device_memory = np.array([d.memory_bytes for d in devices_all], dtype=float)
    speed = np.empty(positions)
    memory = np.empty(positions)
    ring_factor = np.zeros(positions)  # all-reduce ms per param byte
    ring_fixed = np.zeros(positions)
    out_rate = np.full(positions, INF)
    out_latency = np.zeros(positions)
    width = r * layout.replicas
    step = max(1, CHUNK_ENTRIES // width)
    for lo in range(0, positions, step):
        first = np.arange(lo, min(positions, lo + step))
        devs = order[_stage_indices(layout, first, r)]  # [a, i] = layout.devices(a, rho)[i]
        speed[first] = device_speed[devs].min(axis=1)
        memory[first] = device_memory[devs].min(axis=1)
        if width > 1:
            ring_factor[first], ring_fixed[first] = _ring_terms(cluster, devs)
        below = first > 0
        if below.any():
            src = devs[below]
            dst = order[_below_indices(layout, first[below], r)]
            rate = np.minimum(bandwidth[src, dst], bandwidth[dst, src]).min(axis=1)
            out_rate[first[below]] = np.where(rate > 0, rate * r, 0.0)
            latency = np.maximum(latency[src, dst].max(axis=1), latency[dst, src].max(axis=1))
            out_latency[first[below]] = latency
    return {
        "speed": speed,
        "memory": memory,
        "ring_factor": ring_factor,
        "ring_fixed": ring_fixed,
        "out_rate": out_rate,
        "out_latency": out_latency,
    }


def _stage_indices(layout: Layout, first_units: np.ndarray, r: int) -> np.ndarray:
    """Indices into layout.order of the devices of a stage of r positions at each unit of `first_units`, in
    Layout.devices's order (one row per stage)."""
    start = first_units * layout.unit
    if layout.replica_major:
        within = (np.arange(layout.replicas)[:, None] * layout.per_pipeline + np.arange(r)[None, :]).ravel()
        return start[:, None] + within[None, :]
    return start[:, None] * layout.replicas + np.arange(r * layout.replicas)[None, :]


def _below_indices(layout: Layout, first_units: np.ndarray, r: int) -> np.ndarray:
    """Indices into layout.order of the stage just below each stage of `first_units` (r positions per pipeline
    replica, clipped at the stage's first position), replica-major: the destinations of its outgoing transfer."""
    top = first_units * layout.unit
    low = np.maximum(0, top - r)
    position = np.minimum(low[:, None] + np.arange(r)[None, :], top[:, None] - 1)[:, None, :]  # [a, 1, i]
    replica = np.arange(layout.replicas)[None, :, None]
    if layout.replica_major:
        index = replica * layout.per_pipeline + position
    else:
        unit_first = (position // layout.unit) * layout.unit
        index = unit_first * layout.replicas + replica * layout.unit + (position - unit_first)
    return index.reshape(len(first_units), -1)


def _ring_terms(cluster: Cluster, devs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ring_allreduce_terms of every row of `devs` (each a ring in the given order), as arrays."""
    rate, latency = link_arrays(cluster)
    nxt = np.roll(devs, -1, axis=1)
    rates = rate[devs, nxt]
    if not (rates > 0).all():
        for row in devs:  # raises, naming the first pair that cannot talk
            ring_allreduce_terms(cluster, tuple(int(d) for d in row))
    n = devs.shape[1]
    if cluster.allreduce_bytes_per_s is not None:
        bandwidth = np.full(len(devs), cluster.allreduce_bytes_per_s)
        slowest_latency = np.full(len(devs), cluster.allreduce_latency_ms)
    else:
        bandwidth = rates.min(axis=1)
        slowest_latency = latency[devs, nxt].max(axis=1)
    return MS_PER_S * 2 * (n - 1) / n / bandwidth, 2 * (n - 1) * slowest_latency
