"""PipeDream's levels (`-n n1 n2 ... -b B1 B2 ...`, bottom-up) read off a cluster's link hierarchy.

A user of the original describes the cluster as nested groups of equal size
with one bandwidth per level. pipeplan derives them the same way from the
cluster:

1. Level 1: the GPUs of a machine (Device.node) at the slowest link between
   two GPUs of one machine (DGX-1: the host path, not NVLink).
2. Above: machines grouped by the link rates between them. For every rate v
   between machines, fastest first, the machines joined by links of at least
   v form groups; a grouping whose groups all have the same size, coarser
   than the last one, is a level (racks, pods), its bandwidth the slowest
   link between two of its sub-groups in one group. The top level holds the
   last groups at the slowest link between them. Links are the effective
   rates (NIC caps applied, sim.cost.link_model).
3. A level of one unit is dropped (a8x1: eight 1-GPU machines are one level
   of 8 units, `-n 8`). Machines of unequal size cannot be described to the
   original: one flat level of every GPU at the slowest link of the cluster.

`grid` lists the device ids so that grid.reshape(n_L, ..., n_1)[g_L, ..., g_1]
is unit g_1 of unit g_2 ... of top unit g_L.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeplan.core.hardware.cluster import Cluster
from pipeplan.core.hardware.links import DenseLinks
from pipeplan.sim.cost.link_model import device_nodes, link_arrays


@dataclass(frozen=True, slots=True)
class Levels:
    """Units and bandwidth (bytes/s) per level, bottom-up, and the devices in hierarchy order (module docstring)."""

    units: tuple[int, ...]
    bandwidths_bytes_per_s: tuple[float, ...]
    grid: np.ndarray

    def describe(self) -> str:
        """The original's flags for these levels: `-n ... -b ...`."""
        return f"-n {' '.join(map(str, self.units))} -b {' '.join(f'{b:.6g}' for b in self.bandwidths_bytes_per_s)}"


def levels_of(cluster: Cluster) -> Levels:
    """The levels of `cluster` (module docstring)."""
    rate, _ = link_arrays(cluster)
    n = cluster.num_devices
    nodes = device_nodes(cluster)
    order = np.argsort(nodes, kind="stable")
    _, sizes = np.unique(nodes, return_counts=True)
    slowest = rate.off_diagonal_min() if n > 1 else 1e9
    if len(sizes) == 1 or len(set(sizes.tolist())) > 1:
        return Levels((n,), (float(slowest),), np.arange(n))
    per = int(sizes[0])
    inside, between = rate.extremes(nodes)
    units: list[int] = [per] if per > 1 else []
    bandwidths: list[float] = [float(inside)] if per > 1 else []
    groups = np.arange(len(sizes))  # current group of each machine
    keys = [np.arange(len(sizes))]
    if isinstance(rate, DenseLinks) and len(sizes) > 2:
        machine = _machine_rates(rate.dense(), order, per)
        for size, bandwidth, grouping in _node_levels(machine):
            units.append(size // (int(np.bincount(groups).max())))
            bandwidths.append(bandwidth)
            groups = grouping
            keys.append(grouping)
    top = int(groups.max()) + 1
    units.append(top)
    bandwidths.append(float(_slowest_between(rate, nodes, groups) if top > 1 else between))
    units_kept = [(u, b) for u, b in zip(units, bandwidths, strict=True) if u > 1] or [(1, float(slowest))]
    machine_order = np.lexsort(tuple(keys))
    grid = order.reshape(len(sizes), per)[machine_order].reshape(-1)
    return Levels(tuple(u for u, _ in units_kept), tuple(b for _, b in units_kept), grid)


def _machine_rates(dense: np.ndarray, order: np.ndarray, per: int) -> np.ndarray:
    """The slowest link between every two machines (devices grouped `per` at a time in `order`)."""
    m = len(order) // per
    block = dense[np.ix_(order, order)].reshape(m, per, m, per)
    return block.min(axis=(1, 3))


def _node_levels(machine: np.ndarray) -> list[tuple[int, float, np.ndarray]]:
    """(group size in machines, bandwidth inside a group between sub-groups, group of each machine) per level of
    machines grouped by link rate (module docstring), finest first; the top (all machines) excluded."""
    m = machine.shape[0]
    out: list[tuple[int, float, np.ndarray]] = []
    last = np.arange(m)
    off = machine[~np.eye(m, dtype=bool)]
    for v in sorted(set(off.tolist()), reverse=True):
        group = _components(machine >= v)
        counts = np.bincount(group)
        size = int(counts[0])
        if size == m or len(set(counts.tolist())) > 1 or size <= int(np.bincount(last).max()):
            continue
        same = group[:, None] == group[None, :]
        sub = last[:, None] != last[None, :]
        out.append((size, float(machine[same & sub].min()), group))
        last = group
    return out


def _components(adjacent: np.ndarray) -> np.ndarray:
    """Connected components of a symmetric boolean matrix, numbered by their smallest member."""
    m = adjacent.shape[0]
    label = np.full(m, -1)
    count = 0
    for start in range(m):
        if label[start] >= 0:
            continue
        stack = [start]
        label[start] = count
        while stack:
            v = stack.pop()
            for w in np.flatnonzero((adjacent[v] | adjacent[:, v]) & (label < 0)):
                label[w] = count
                stack.append(int(w))
        count += 1
    return label


def _slowest_between(rate: object, nodes: np.ndarray, groups: np.ndarray) -> float:
    """The slowest link between two devices of different top groups."""
    dense = rate.dense() if isinstance(rate, DenseLinks) else None  # type: ignore[attr-defined]
    if dense is None:
        _, between = rate.extremes(nodes)  # type: ignore[attr-defined]
        return float(between)
    top = groups[np.searchsorted(np.unique(nodes), nodes)]
    return float(dense[top[:, None] != top[None, :]].min())
