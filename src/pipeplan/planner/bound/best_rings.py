"""The best ring all-reduce a cluster allows on k devices: a bound on every stage's all-reduce, whatever its devices.

sim's ring all-reduce of n bytes over k devices (link_model.ring_allreduce_ms) takes
2 (k - 1) / k * n / (slowest link on the ring) + 2 (k - 1) * (largest latency on the ring). Over every ring of k
distinct devices, the slowest link is at most the best bottleneck (the largest rate R_k such that some directed
cycle of k devices uses only links of rate >= R_k) and the largest latency at least the least one (L_k likewise),
so 2 (k - 1) / k * n / R_k + 2 (k - 1) * L_k bounds it from below. Both come from a search over device subsets
(a directed Hamiltonian-cycle DP per threshold), done for clusters of at most MAX_DEVICES devices; larger ones,
and clusters with a measured all-reduce, keep planner.bound.shape_bounds's cluster-wide values.
"""

from __future__ import annotations

import numpy as np

from pipeplan.core.units import wire_ms
from pipeplan.planner.bound.shape_bounds import ShapeBounds
from pipeplan.sim.cost.link_model import link_arrays

MAX_DEVICES = 10
"""Largest cluster whose rings are searched (2^n subsets times n^2 per threshold)."""


def cycle_sizes(allowed: np.ndarray) -> set[int]:
    """The sizes k >= 2 of directed cycles of distinct devices that use only allowed links (allowed[a, b])."""
    n = len(allowed)
    sizes: set[int] = set()
    for start in range(n):  # cycles whose smallest device is `start`
        reach: dict[tuple[int, int], bool] = {(1 << start, start): True}
        frontier = [(1 << start, start)]
        while frontier:
            grown = []
            for mask, last in frontier:
                for nxt in range(start + 1, n):
                    if not mask >> nxt & 1 and allowed[last, nxt]:
                        key = (mask | 1 << nxt, nxt)
                        if key not in reach:
                            reach[key] = True
                            grown.append(key)
                        if allowed[nxt, start]:
                            sizes.add(bin(mask).count("1") + 1)
            frontier = grown
    return sizes


class Rings:
    """Per device count k, the best bottleneck rate R_k (bytes/s) and least largest latency L_k (ms) of a ring."""

    def __init__(self, bounds: ShapeBounds, devices: tuple[int, ...] | None = None) -> None:
        """Rings over the cluster's devices, or only over `devices` (a bound for stages that may use no others)."""
        cluster = bounds.request.cluster
        n = cluster.num_devices
        self.bounds = bounds
        self.rate: dict[int, float] = {}
        self.latency: dict[int, float] = {}
        if n < 2 or n > MAX_DEVICES or cluster.allreduce_bytes_per_s is not None:
            return
        rate_matrix, latency_matrix = link_arrays(cluster)
        index = np.arange(n) if devices is None else np.array(devices, dtype=np.int64)
        n = len(index)
        rate = np.asarray(rate_matrix[index[:, None], index[None, :]], dtype=float)
        latency = np.asarray(latency_matrix[index[:, None], index[None, :]], dtype=float)
        off = ~np.eye(n, dtype=bool)
        for value in sorted({float(v) for v in rate[off]}):  # ascending: the last threshold a size meets is its best
            for k in cycle_sizes((rate >= value) & off):
                self.rate[k] = value
        for value in sorted({float(v) for v in latency[off]}, reverse=True):
            for k in cycle_sizes((latency <= value) & off):
                self.latency[k] = value

    def signature(self) -> tuple[tuple[int, float, float], ...]:
        """(k, R_k, L_k) per ring size: two Rings with equal signatures give equal bounds."""
        return tuple((k, self.rate[k], self.latency.get(k, -1.0)) for k in sorted(self.rate))

    def allreduce_ms(self, nbytes: np.ndarray, devices: int) -> np.ndarray:
        """A bound on the ring all-reduce of the gradients of `nbytes` parameter bytes (an array; x ShapeBounds.grads)
        over any `devices` devices of the cluster (ms)."""
        if devices not in self.rate or devices not in self.latency:
            return self.bounds.allreduce_ms(nbytes, devices)
        k = devices
        return wire_ms(2 * (k - 1) / k * (nbytes * self.bounds.grads), self.rate[k]) + 2 * (k - 1) * self.latency[k]
