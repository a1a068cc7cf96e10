"""Tests of io.model_graph: a graph.txt DAG's default order (ties by line), its cuts in any order, orders and cycles
refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from graph_files import node, write
from pipeplan.core.errors import ProfileError
from pipeplan.io.graph_txt import read_graph, read_graph_txt
from pipeplan.presets.resolve import load_profile


def test_ties_are_broken_by_line_order(tmp_path: Path) -> None:
    """Among nodes ready at the same time, the one written first comes first, whatever its id."""
    lines = [
        node("node9", "src"),
        node("node5", "right"),
        node("node2", "left"),
        node("node7", "join"),
        "\tnode9 -- node2",
        "\tnode9 -- node5",
        "\tnode2 -- node7",
        "\tnode5 -- node7",
    ]
    profile = read_graph_txt(write(tmp_path, "t-pbs-1.txt", lines))
    assert [layer.name for layer in profile.layers] == ["node9:src", "node5:right", "node2:left", "node7:join"]


def test_topological_order_overrides_line_order(tmp_path: Path) -> None:
    """A consumer written before its producer still comes after it."""
    lines = [node("node1", "late"), node("node2", "early"), "\tnode2 -- node1"]
    profile = read_graph_txt(write(tmp_path, "o-pbs-1.txt", lines))
    assert [layer.name for layer in profile.layers] == ["node2:early", "node1:late"]


def test_cut_bytes_count_a_skip_connection_over_the_cut(tmp_path: Path) -> None:
    """In a -> b -> c -> d with a skip a -> d, every cut inside the skip carries a's output too."""
    lines = [
        node("n1", "a", act="100"),
        node("n2", "b", act="20"),
        node("n3", "c", act="3"),
        node("n4", "d", act="1"),
        "\tn1 -- n2",
        "\tn2 -- n3",
        "\tn3 -- n4",
        "\tn1 -- n4",
    ]
    profile = read_graph_txt(write(tmp_path, "s-pbs-2.txt", lines))
    # cut after a: a (100); after b: b + skip a (120); after c: c + skip a (103)
    assert profile.cut_bytes == (100.0, 120.0, 103.0)


BRANCHES = [
    node("n1", "in", act="7"),
    node("n2", "left", act="50"),
    node("n3", "right", act="60"),
    node("n4", "merge", act="5"),
    node("n5", "out", act="1"),
    "\tn1 -- n2",
    "\tn1 -- n3",
    "\tn2 -- n4",
    "\tn3 -- n4",
    "\tn4 -- n5",
]


def test_cut_bytes_on_a_branch_and_merge(tmp_path: Path) -> None:
    """Two parallel branches: a cut between them carries the first branch's output and the shared input."""
    profile = read_graph_txt(write(tmp_path, "b-pbs-2.txt", BRANCHES))
    # order in, left, right, merge, out: after in: 7; after left: left 50 + in 7 (read by right);
    # after right: left 50 + right 60; after merge: 5
    assert profile.cut_bytes == (7.0, 57.0, 110.0, 5.0)


def test_a_graph_relinearized_in_another_order_gets_that_orders_cuts(tmp_path: Path) -> None:
    """read_graph gives the DAG; linearize() is read_graph_txt's chain, linearize(order) another valid chain with its
    own cuts: right before left, the cut after right carries in (read by left) and right."""
    path = write(tmp_path, "b-pbs-2.txt", BRANCHES)
    graph = read_graph(path)
    assert graph.linearize() == read_graph_txt(path)
    assert graph.default_order() == ["n1", "n2", "n3", "n4", "n5"]
    other = graph.linearize(["n1", "n3", "n2", "n4", "n5"])
    assert [layer.name for layer in other.layers] == ["n1:in", "n3:right", "n2:left", "n4:merge", "n5:out"]
    assert other.cut_bytes == (7.0, 67.0, 110.0, 5.0)
    assert other.batch_size == 2 and other.name == "b"


@pytest.mark.parametrize(
    ("order", "message"),
    [
        (["n1", "n2", "n3", "n4"], r"the order leaves out 1 node\(s\), first 'n5'"),
        (["n1", "n2", "n2", "n3", "n4", "n5"], r"order\[2\] repeats node 'n2'"),
        (["n1", "n2", "n9", "n3", "n4", "n5"], r"order\[2\] names node 'n9', which the graph does not have"),
        (["n1", "n4", "n2", "n3", "n5"], r"puts 'n4' \(position 1\) before 'n2' \(position 2\), whose output it consumes"),
    ],
)
def test_an_order_that_is_not_topological_is_named(tmp_path: Path, order: list[str], message: str) -> None:
    with pytest.raises(ProfileError, match=message):
        read_graph(write(tmp_path, "b-pbs-2.txt", BRANCHES)).linearize(order)


def test_resnet50_cut_inside_a_residual_block_includes_the_skip() -> None:
    """Inside resnet50's second bottleneck the cut after node20 carries node20's output plus the skip from node17.

    From the file: node17 (ReLU, 411041792 bytes) feeds node18 and node26 (the Add);
    node20 (ReLU, 102760448 bytes) lies on the main path between them.
    """
    profile = load_profile("pipedream/resnet50")
    names = [layer.name for layer in profile.layers]
    i = names.index("node20:ReLU(inplace)")
    assert names.index("node17:ReLU(inplace)") < i < names.index("node26:Add(inplace)")
    assert profile.cut_bytes is not None
    assert profile.cut_bytes[i] == 102760448 + 411041792
    # Past the Add only its own output crosses.
    add = names.index("node26:Add(inplace)")
    assert profile.cut_bytes[add] == 411041792


def test_a_cycle_is_reported_with_a_node_on_it(tmp_path: Path) -> None:
    """n2 -> n3 -> n4 -> n2 is a cycle: the error names the file and the nodes with their lines."""
    lines = [node("n1", "a"), node("n2", "b"), node("n3", "c"), node("n4", "d")]
    lines += ["\tn1 -- n2", "\tn2 -- n3", "\tn3 -- n4", "\tn4 -- n2"]
    path = write(tmp_path, "cyc-pbs-1.txt", lines)
    with pytest.raises(ProfileError, match=r"cyc-pbs-1\.txt: the graph has a cycle through node n2: n2 \(line 2\) -> n3 .*-> n2"):
        read_graph_txt(path)


def test_a_self_loop_is_a_cycle(tmp_path: Path) -> None:
    """An edge from a node to itself is reported as a cycle through that node."""
    path = write(tmp_path, "self-pbs-1.txt", [node("n1", "a"), "\tn1 -- n1"])
    with pytest.raises(ProfileError, match=r"cycle through node n1"):
        read_graph_txt(path)
