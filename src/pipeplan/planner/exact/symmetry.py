"""The cluster's symmetries: device permutations that keep every link and device, so every plan's simulated time.

A permutation g of the devices is an automorphism when every device d and g(d) share node, speed and memory, and
every ordered pair (a, b) and (g(a), g(b)) the same link rate and latency (as the simulator reads them: the
effective rates of link_model.link_arrays and the pair latencies of Cluster.link_latency). Relabelling a plan's
devices by g then changes no cost the simulator computes, so its time is the same. exact walks, per split, the
device sequence (the stages' tuples one after the other) only when no automorphism maps it to a lexicographically
smaller one: the least sequence of each orbit passes (each prefix of it is at most its image), so every plan of
the space has an image walked with the same time. Twins are automorphisms too; exact uses this rule only on
clusters without twins (their group may be huge) of at most MAX_DEVICES devices.
"""

from __future__ import annotations

import numpy as np

from pipeplan.core.hardware.cluster import Cluster
from pipeplan.sim.cost.link_model import link_arrays

MAX_DEVICES = 10
"""Largest cluster whose automorphisms are searched (a backtracking over device images)."""
MAX_GROUP = 5040
"""Most automorphisms kept: a larger group (only with many look-alike devices) is left unused."""


def link_tables(cluster: Cluster) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(effective rate, effective latency, pair latency) as dense n x n arrays, diagonal zero."""
    n = cluster.num_devices
    index = np.arange(n)
    rate_matrix, latency_matrix = link_arrays(cluster)
    rate = np.asarray(rate_matrix[index[:, None], index[None, :]], dtype=float)
    latency = np.asarray(latency_matrix[index[:, None], index[None, :]], dtype=float)
    pair = np.array([[cluster.link_latency(a, b) for b in range(n)] for a in range(n)], dtype=float)
    off = ~np.eye(n, dtype=bool)
    return rate * off, latency * off, pair * off


def automorphisms(cluster: Cluster) -> tuple[tuple[int, ...], ...]:
    """Every automorphism but the identity (module docstring), in lexicographic order; () when not searched."""
    n = cluster.num_devices
    if n < 2 or n > MAX_DEVICES:
        return ()
    tables = link_tables(cluster)
    kinds = [(d.node, d.speed, d.memory_bytes) for d in cluster.devices]
    found: list[tuple[int, ...]] = []
    image: list[int] = []
    used = [False] * n

    def extend() -> bool:
        """Extend `image` in every consistent way; False once the group passes MAX_GROUP."""
        a = len(image)
        if a == n:
            found.append(tuple(image))
            return len(found) <= MAX_GROUP + 1
        for b in range(n):
            if used[b] or kinds[b] != kinds[a]:
                continue
            if all(t[a, a2] == t[b, b2] and t[a2, a] == t[b2, b] for t in tables for a2, b2 in enumerate(image)):
                image.append(b)
                used[b] = True
                going = extend()
                image.pop()
                used[b] = False
                if not going:
                    return False
        return True

    if not extend():
        return ()
    return tuple(g for g in found if any(g[d] != d for d in range(n)))


def least_in_orbit(sequence: tuple[int, ...], group: tuple[tuple[int, ...], ...]) -> bool:
    """Whether no automorphism maps the device sequence to a lexicographically smaller one."""
    for g in group:
        for d in sequence:
            moved = g[d]
            if moved != d:
                if moved < d:
                    return False
                break
    return True
