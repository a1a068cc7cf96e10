"""Tests of core/hardware/links.py: a described cluster's structured matrix answers exactly what its dense matrix does."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeplan.core.errors import ClusterError
from pipeplan.core.hardware.cluster import Cluster, Device
from pipeplan.core.hardware.links import DenseLinks, LinkMatrix, NodeLinks
from pipeplan.io.cluster_json import cluster_from_json


def random_node_links(rng: random.Random, n: int, nodes: int) -> tuple[NodeLinks, np.ndarray]:
    """A NodeLinks with a few overrides and the dense matrix it stands for, built entry by entry."""
    node_of = np.array(sorted(rng.randrange(nodes) for _ in range(n)))
    intra, inter, diagonal = rng.choice((0.0, 5.0, 50.0)), rng.choice((0.0, 5.0, 10.0)), rng.choice((0.0, np.inf))
    overrides = {}
    for _ in range(rng.randrange(4) if n > 1 else 0):
        a, b = rng.sample(range(n), 2)
        overrides[(a, b)] = rng.choice((1.0, 5.0, 25.0))
    dense = np.array(
        [
            [diagonal if a == b else overrides.get((a, b), intra if node_of[a] == node_of[b] else inter) for b in range(n)]
            for a in range(n)
        ]
    )
    return NodeLinks(node_of, intra, inter, diagonal, overrides), dense


@given(st.integers(1, 9), st.integers(1, 4), st.randoms(use_true_random=False))
@settings(max_examples=150, deadline=None)
def test_node_links_index_like_their_dense_matrix(n: int, nodes: int, rng: random.Random) -> None:
    """Every indexing form the planners use gives numpy's answer on the dense matrix."""
    links, dense = random_node_links(rng, n, nodes)
    rows = np.array([rng.randrange(n) for _ in range(5)])
    cols = np.array([rng.randrange(n) for _ in range(5)])
    a, b = rng.randrange(n), rng.randrange(n)
    assert np.array_equal(links.dense(), dense)
    assert links[a, b] == dense[a, b] and links.at(a, b) == dense[a, b] and links[a][b] == dense[a][b]
    assert np.array_equal(links[rows, cols], dense[rows, cols])
    assert np.array_equal(links[rows], dense[rows])
    assert np.array_equal(links[np.ix_(rows, cols)], dense[np.ix_(rows, cols)])
    assert np.array_equal(links[:, a], dense[:, a]) and np.array_equal(links[a, :], dense[a, :])
    assert np.array_equal(links[rows[:, None], cols[None, :]], dense[rows[:, None], cols[None, :]])
    assert links == DenseLinks(dense) and DenseLinks(dense) == links


@given(st.integers(1, 9), st.integers(1, 4), st.randoms(use_true_random=False))
@settings(max_examples=150, deadline=None)
def test_structured_answers_equal_the_dense_ones(n: int, nodes: int, rng: random.Random) -> None:
    """transformed, extremes, off-diagonal min/max and twins: NodeLinks by structure, DenseLinks by arrays, equal."""
    links, dense = random_node_links(rng, n, nodes)
    reference = DenseLinks(dense)
    node_of = links.nodes
    cap, add, diagonal = rng.choice((None, 3.0)), rng.choice((0.0, 2.0)), rng.choice((None, np.inf))
    assert np.array_equal(
        links.transformed(node_of, cap, add, diagonal).dense(), reference.transformed(node_of, cap, add, diagonal).dense()
    )
    assert links.extremes(node_of) == reference.extremes(node_of)
    assert links.off_diagonal_min() == reference.off_diagonal_min()
    assert links.off_diagonal_max() == reference.off_diagonal_max()
    off = ~np.eye(n, dtype=bool)
    assert links.off_diagonal_min() == (dense[off].min() if n > 1 else np.inf)
    for a in range(n):
        for b in range(n):
            if a != b:
                others = [z for z in range(n) if z not in (a, b)]
                expected = (
                    all(dense[a, z] == dense[b, z] and dense[z, a] == dense[z, b] for z in others) and dense[a, b] == dense[b, a]
                )
                assert links.twins(a, b) == expected == reference.twins(a, b)


def test_a_described_cluster_of_16384_gpus_holds_kilobytes() -> None:
    """2048 nodes x 8: the links are two values per matrix (no n x n array), read as the dense matrix would be."""
    description = {"name": "big", "nodes": 2048, "gpus_per_node": 8, "device": {"kind": "H100"}, "intra_node_gb_per_s": 450,
                   "inter_node_gb_per_s": 50, "latency_us": {"intra": 3, "inter": 10},
                   "overrides": [{"pair": [0, 16383], "gb_per_s": 1}]}  # fmt: skip
    cluster = cluster_from_json(description)
    assert isinstance(cluster.bandwidth_bytes_per_s, NodeLinks) and cluster.bandwidth_bytes_per_s.nodes.nbytes == 16384 * 8
    assert (
        cluster.link_bandwidth(0, 7) == 450e9 and cluster.link_bandwidth(0, 8) == 50e9 and cluster.link_bandwidth(0, 16383) == 1e9
    )
    assert cluster.latency_ms[np.array([0, 0]), np.array([1, 9])].tolist() == pytest.approx([3e-3, 10e-3])
    assert cluster.bandwidth_bytes_per_s.extremes(cluster.bandwidth_bytes_per_s.nodes) == (450e9, 1e9)


def test_cluster_names_a_bad_entry_of_any_form() -> None:
    """A negative, NaN or non-numeric entry is named with its position, dense or structured."""
    devices = (Device(0, "gpu", 2**30), Device(1, "gpu", 2**30))
    with pytest.raises(ClusterError, match=r"bandwidth\[0\]\[1\]"):
        Cluster("c", devices, ((0.0, -1.0), (1.0, 0.0)), ((0.0, 0.0), (0.0, 0.0)))
    with pytest.raises(ClusterError, match=r"latency\[1\]\[0\]"):
        Cluster("c", devices, ((0.0, 1e9), (1e9, 0.0)), ((0.0, 0.0), ("x", 0.0)))
    with pytest.raises(ClusterError, match=r"bandwidth\[1\]\[0\]"):
        Cluster("c", devices, DenseLinks(np.array([[0.0, 1.0], [np.nan, 0.0]])), ((0.0, 0.0), (0.0, 0.0)))
    with pytest.raises(ClusterError, match="bandwidth inter"):
        Cluster("c", devices, NodeLinks(np.array([0, 1]), 1.0, -2.0), ((0.0, 0.0), (0.0, 0.0)))
    with pytest.raises(ClusterError, match=r"bandwidth\[0\]\[1\]"):
        Cluster("c", devices, NodeLinks(np.array([0, 1]), 1.0, 2.0, 0.0, {(0, 1): np.nan}), ((0.0, 0.0), (0.0, 0.0)))
    with pytest.raises(ClusterError, match="2x2 matrix, got 3x3"):
        Cluster("c", devices, NodeLinks(np.array([0, 0, 1]), 1.0, 2.0), ((0.0, 0.0), (0.0, 0.0)))


def test_indices_are_checked() -> None:
    """Out-of-range and non-integer indices raise IndexError, as numpy's would."""
    links: LinkMatrix = NodeLinks(np.array([0, 0, 1]), 1.0, 2.0)
    with pytest.raises(IndexError):
        links[3, 0]
    with pytest.raises(IndexError):
        links[np.array([0.5]), np.array([1])]
    assert links[-1, 0] == 2.0
