"""sim.components: connected components against a breadth-first search over adjacency lists."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from pipeplan.sim.components import component_labels


def reference_labels(count: int, a: list[int], b: list[int]) -> list[int]:
    """Each node's smallest node of its component, by breadth-first search from every node in increasing order."""
    near: list[list[int]] = [[] for _ in range(count)]
    for x, y in zip(a, b, strict=True):
        near[x].append(y)
        near[y].append(x)
    label = [-1] * count
    for start in range(count):
        if label[start] >= 0:
            continue
        label[start] = start
        queue = deque([start])
        while queue:
            x = queue.popleft()
            for y in near[x]:
                if label[y] < 0:
                    label[y] = start
                    queue.append(y)
    return label


def test_no_edges_every_node_alone() -> None:
    empty = np.zeros(0, dtype=np.int64)
    assert component_labels(4, empty, empty).tolist() == [0, 1, 2, 3]


def test_a_path_given_backwards_joins_to_its_smallest_node() -> None:
    # edges from the far end inwards: min-label propagation alone would need one round per edge
    n = 50
    a = np.arange(n - 1, 0, -1)
    assert component_labels(n, a, a - 1).tolist() == [0] * n


def test_self_loops_and_repeated_edges() -> None:
    a, b = [2, 2, 3, 5, 5], [2, 3, 2, 5, 1]
    assert component_labels(6, np.array(a), np.array(b)).tolist() == reference_labels(6, a, b) == [0, 1, 2, 2, 4, 1]


@pytest.mark.parametrize("seed", range(40))
def test_random_graphs_match_breadth_first_search(seed: int) -> None:
    rng = np.random.default_rng(seed)
    count = int(rng.integers(1, 120))
    edges = int(rng.integers(0, 2 * count))
    a = rng.integers(0, count, edges)
    b = rng.integers(0, count, edges)
    assert component_labels(count, a, b).tolist() == reference_labels(count, a.tolist(), b.tolist())


def test_bipartite_flows_and_resources_as_flow_sets_builds_them() -> None:
    # flows 0..5 each on one pair resource and, crossing nodes, two NIC resources (node ids after the flows)
    flows = 6
    occ_flow = np.array([0, 1, 1, 1, 2, 3, 3, 3, 4, 5])
    occ_res = np.array([0, 1, 6, 7, 2, 3, 6, 8, 4, 5])
    label = component_labels(flows + 9, occ_flow, flows + occ_res)
    assert label[:flows].tolist() == [0, 1, 2, 1, 4, 5]  # flows 1 and 3 share NIC resource 6
