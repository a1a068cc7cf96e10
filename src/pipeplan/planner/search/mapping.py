"""Device orderings and layouts: where the stages of a pipeline (and its replicas) sit on any bandwidth graph."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from pipeplan.core.hardware.cluster import Cluster
from pipeplan.core.hardware.links import LinkMatrix, NodeLinks


def chain_order(bandwidth: LinkMatrix, start: int, allowed: list[int] | None = None) -> list[int]:
    """Greedy chain: from `start`, repeatedly go to the unvisited device with the fastest link (ties: lowest id).

    On a two-level cluster this walks node by node; on any graph it keeps
    consecutive devices (future consecutive stages) on fast pairs. A link's
    rate here is the slower of its two directions.
    """
    if isinstance(bandwidth, NodeLinks) and not len(bandwidth.keys) and bandwidth.intra >= bandwidth.inter:
        return _node_chain(bandwidth, start, allowed)
    todo = np.array(sorted(allowed) if allowed is not None else range(len(bandwidth)), dtype=np.int64)
    left = np.ones(len(todo), dtype=bool)
    left[np.searchsorted(todo, start)] = False
    order = [start]
    for _ in range(len(todo) - 1):
        last = order[-1]
        candidates = todo[left]
        rates = np.minimum(bandwidth[last, candidates], bandwidth[candidates, last])
        best = int(np.argmax(rates))  # the first maximum: the lowest id among the fastest
        order.append(int(candidates[best]))
        left[np.searchsorted(todo, candidates[best])] = False
    return order


def _node_chain(bandwidth: NodeLinks, start: int, allowed: list[int] | None) -> list[int]:
    """chain_order on a two-level link structure with no overridden pair and intra-node links at least as fast:
    the same walk without looking at n x n pairs (65,536 devices would take minutes).

    From `start` the fastest unvisited devices are the rest of its node (lowest id first); once a node is done
    every unvisited device is equally far, so the walk enters the node of the lowest unvisited id. With equal
    rates every step takes the lowest unvisited id.
    """
    todo = sorted(allowed) if allowed is not None else list(range(len(bandwidth)))
    if bandwidth.intra == bandwidth.inter:
        return [start] + [d for d in todo if d != start]
    members: dict[int, list[int]] = {}
    for d in todo:
        members.setdefault(int(bandwidth.nodes[d]), []).append(d)
    home = int(bandwidth.nodes[start])
    order = [start] + [d for d in members.pop(home) if d != start]
    for node in sorted(members, key=lambda node: members[node][0]):
        order += members[node]
    return order


EXHAUSTIVE_ORDERS = 5
"""Clusters with at most this many devices get every device order (up to twins), not only the heuristic ones."""


def device_orders(cluster: Cluster, bandwidth: LinkMatrix, twins: tuple[int, ...] | None = None) -> list[tuple[int, ...]]:
    """Candidate device orders: the greedy chain from the fastest device, then speed groups chained.

    Returns distinct orders, best-guess first. With devices of several speeds,
    a second order chains the fastest group first, then the next (so a short
    pipeline uses only fast devices); then each of them reversed. Small clusters (EXHAUSTIVE_ORDERS) add
    every other permutation, one per sequence of twin classes (`twins[d]`:
    a representative of the devices interchangeable with d).
    """
    devices = cluster.devices
    fastest = max(range(len(devices)), key=lambda d: (devices[d].speed, -d))
    orders = [tuple(chain_order(bandwidth, fastest))]
    speeds = sorted({d.speed for d in devices}, reverse=True)
    if len(speeds) > 1:
        grouped: list[int] = []
        for speed in speeds:
            group = [d.id for d in devices if d.speed == speed]
            start = group[0] if not grouped else max(group, key=lambda d: (bandwidth[grouped[-1], d], -d))
            grouped += chain_order(bandwidth, start, group)
        orders.append(tuple(grouped))
    orders.append(tuple(sorted(range(len(devices)), key=lambda d: (devices[d].node, d))))
    # the DP puts the last stage first in the order: the reversed orders start the pipeline at the other end
    orders += [order[::-1] for order in orders]
    if len(devices) <= EXHAUSTIVE_ORDERS:
        orders += list(itertools.permutations(range(len(devices))))
    classes = twins if twins is not None else tuple(range(len(devices)))
    unique: dict[tuple[int, ...], tuple[int, ...]] = {}
    for order in orders:
        unique.setdefault(tuple(classes[d] for d in order), order)
    return list(unique.values())


@dataclass(frozen=True, slots=True)
class Layout:
    """How stages and pipeline replicas map onto a device order.

    The per-pipeline positions 0..n-1 are grouped in units of `unit` devices.
    `replica_major`: pipeline replica t owns order[t*n:(t+1)*n] and a stage at
    positions [a, a+r) uses order[t*n+a : t*n+a+r] in replica t (stages of one
    pipeline stay close; the all-reduce spans the blocks). Otherwise
    (stage-major) a stage at [a, a+r) owns order[a*rp : (a+r)*rp], replica t
    taking its t-th slice of r devices (the all-reduce stays close).
    """

    order: tuple[int, ...]
    replicas: int
    per_pipeline: int
    unit: int
    replica_major: bool

    @property
    def units(self) -> int:
        """Number of position units in one pipeline."""
        return self.per_pipeline // self.unit

    def devices(self, first_unit: int, num_units: int) -> tuple[int, ...]:
        """The devices of a stage at units [first_unit, first_unit+num_units), replica-major over pipeline replicas."""
        a, r = first_unit * self.unit, num_units * self.unit
        if self.replica_major:
            n = self.per_pipeline
            if self.replicas == 1:
                return self.order[a : a + r]
            return tuple(itertools.chain.from_iterable(self.order[t * n + a : t * n + a + r] for t in range(self.replicas)))
        return tuple(self.order[a * self.replicas : (a + r) * self.replicas])
