"""Tests of the replicated seeds' analytical pieces: all-reduce estimate, placement policies."""

from __future__ import annotations

import numpy as np
import pytest

from pipeplan.planner.search.replicated.placing import (
    APPEND_FIRST,
    FRESH_FIRST,
    SCATTER_FIRST,
    allocate,
    allocate_replicas,
    ring_allreduce_ms,
)


def test_allreduce_estimate_formula() -> None:
    """2 W (r-1) / (r B): 1 GB over 4 replicas at 1e6 bytes/ms takes 1500 ms; one replica needs none."""
    assert ring_allreduce_ms(1e9, 4, 1e6) == pytest.approx(1500.0)
    assert ring_allreduce_ms(1e9, 1, 1e6) == 0.0


def test_placement_policies_on_two_machines() -> None:
    """Machine 0 half used: Fresh First opens machine 1, Append First fills machine 0, Scatter First alternates."""
    nodes = [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert allocate(nodes, (2, 0), 2, FRESH_FIRST) == ((4, 5), (2, 2))
    assert allocate(nodes, (2, 0), 2, APPEND_FIRST) == ((2, 3), (4, 0))
    assert allocate(nodes, (0, 0), 3, SCATTER_FIRST) == ((0, 1, 4), (2, 1))
    assert allocate(nodes, (4, 3), 2, FRESH_FIRST) is None
    assert allocate_replicas(nodes, (0, 0), 2, 2, FRESH_FIRST) == ((0, 1, 4, 5), (2, 2))


def _reference_allocation(nodes: list[list[int]], used: tuple[int, ...], need: int, replicas: int, policy: str):  # type: ignore[no-untyped-def]
    """The policies read literally: every step scans the machines again."""
    count = list(used)
    if sum(len(n) - c for n, c in zip(nodes, count, strict=True)) < need * replicas:
        return None
    devices: list[int] = []
    for _ in range(replicas):
        taken: list[int] = []
        while len(taken) < need:
            free = [i for i, n in enumerate(nodes) if count[i] < len(n)]
            fresh = [i for i in free if count[i] == 0]
            partly = [i for i in free if count[i] > 0]
            if policy == SCATTER_FIRST:
                picks = [(i, 1) for i in free[: need - len(taken)]]
            elif policy == FRESH_FIRST and fresh:
                picks = [(fresh[0], need - len(taken))]
            elif policy == APPEND_FIRST and partly:
                picks = [(partly[0], need - len(taken))]
            else:
                picks = [(free[0], need - len(taken))]
            for i, want in picks:
                k = min(len(nodes[i]) - count[i], want)
                taken += nodes[i][count[i] : count[i] + k]
                count[i] += k
        devices += sorted(taken)
    return tuple(devices), tuple(count)


def test_replica_allocation_equals_the_policies_read_literally() -> None:
    """The pointer-and-heap allocation, and the numpy one on machines of one size, give what rescanning the machines
    at every step gives (random clusters)."""
    rng = np.random.default_rng(11)
    for trial in range(6000):
        even = trial % 2 == 1  # machines of one size: the numpy paths
        count = int(rng.integers(1, 9))
        one_size = [int(rng.choice([1, 2, 4, 8]))] * count
        sizes = one_size if even else [int(rng.choice([0, 1, 2, 3, 4, 8])) for _ in range(count)]
        starts = np.cumsum([0, *sizes])
        nodes = [list(range(int(a), int(a) + s)) for a, s in zip(starts, sizes, strict=False)]
        used = tuple(int(rng.integers(0, s + 1)) for s in sizes)
        if even and trial % 4 == 1:  # a few machines in use, the rest equally so (as a pipeline fills them)
            cut, level = int(rng.integers(0, count + 1)), int(rng.integers(0, sizes[0] + 1))
            used = used[:cut] + (level,) * (count - cut)
        need, replicas = int(rng.integers(1, 7)), int(rng.integers(1, 12))
        policy = str(rng.choice([FRESH_FIRST, APPEND_FIRST, SCATTER_FIRST]))
        grid = np.asarray(nodes) if even else None
        ints = list(range(int(starts[-1]))) if even else None
        got = allocate_replicas(nodes, used, need, replicas, policy, grid=grid, ints=ints)
        assert got == _reference_allocation(nodes, used, need, replicas, policy), (sizes, used, need, replicas, policy)
