"""The graph PipeDream and DAPPLE plan over: a profile's layers and edges, Input sources and `__getitem__` sinks out.

PipeDream's optimizer (msr-fiddle/pipedream, `optimizer_graph_hierarchical.py`,
and the copy DAPPLE's planner embeds) zeroes and removes every source whose
description starts with `Input` (its data is loaded, not computed; the node
goes back into stage 0 after planning) and removes every sink whose
description starts with `__getitem__` (a tuple selection nobody consumes; the
original places it nowhere, pipeplan puts it in the stage of its producer so
that a plan covers every layer). Planning states start from the first source
left, in layer order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeplan.core.profile import ModelProfile
from pipeplan.io.graph_txt import ModelGraph


@dataclass(frozen=True, slots=True)
class PipeDreamGraph:
    """Layers in a topological order with their costs for one profile batch and, per layer, its producers.

    `descriptions[i]` is what the original matches `Input` / `__getitem__`
    against (a graph.txt node's description; a layer name's part after its
    first ':').
    """

    name: str
    batch_size: int
    names: tuple[str, ...]
    descriptions: tuple[str, ...]
    work_ms: np.ndarray
    fwd_ms: np.ndarray
    bwd_ms: np.ndarray
    activation_bytes: np.ndarray
    param_bytes: np.ndarray
    producers: tuple[tuple[int, ...], ...]
    file_rank: tuple[int, ...] | None = None

    @property
    def num_nodes(self) -> int:
        """Number of layers."""
        return len(self.names)

    def consumers(self) -> tuple[tuple[int, ...], ...]:
        """Per layer, the layers that consume its output (ascending)."""
        out: list[list[int]] = [[] for _ in self.names]
        for v, ps in enumerate(self.producers):
            for u in ps:
                out[u].append(v)
        return tuple(tuple(c) for c in out)

    def subgraph(self, keep: tuple[int, ...]) -> PipeDreamGraph:
        """The graph of layers `keep` (ascending) with the edges among them, reindexed."""
        new = {old: k for k, old in enumerate(keep)}
        index = np.asarray(keep, dtype=np.int64)
        return PipeDreamGraph(
            self.name,
            self.batch_size,
            tuple(self.names[i] for i in keep),
            tuple(self.descriptions[i] for i in keep),
            self.work_ms[index],
            self.fwd_ms[index],
            self.bwd_ms[index],
            self.activation_bytes[index],
            self.param_bytes[index],
            tuple(tuple(new[u] for u in self.producers[i] if u in new) for i in keep),
            None if self.file_rank is None else tuple(self.file_rank[i] for i in keep),
        )


def _graph(
    name: str,
    batch: int,
    names: list[str],
    descriptions: list[str],
    costs: list[tuple[float, float, float, float]],
    producers: list[tuple[int, ...]],
    file_rank: tuple[int, ...] | None = None,
) -> PipeDreamGraph:
    """A PipeDreamGraph from per-layer lists (costs: fwd ms, bwd ms, activation bytes, parameter bytes)."""
    a = np.asarray(costs, dtype=float).reshape(len(names), 4)
    work = a[:, 0] + a[:, 1]
    return PipeDreamGraph(
        name, batch, tuple(names), tuple(descriptions), work, a[:, 0], a[:, 1], a[:, 2], a[:, 3], tuple(producers), file_rank
    )


def graph_of_profile(profile: ModelProfile) -> PipeDreamGraph:
    """The DAG of a profile: its `layer_inputs` when it has them, else the chain."""
    inputs = getattr(profile, "layer_inputs", None)
    n = profile.num_layers
    producers = [tuple(p) for p in inputs] if inputs is not None else [() if i == 0 else (i - 1,) for i in range(n)]
    layers = profile.layers
    return _graph(
        profile.name,
        profile.batch_size,
        [layer.name for layer in layers],
        [layer.name.split(":", 1)[1] if ":" in layer.name else layer.name for layer in layers],
        [(layer.fwd_ms, layer.bwd_ms, layer.activation_bytes, layer.param_bytes) for layer in layers],
        producers,
    )


def graph_of_model_graph(graph: ModelGraph) -> PipeDreamGraph:
    """The DAG of a parsed graph.txt, layers in its default order, named by node id, with their file lines."""
    order = graph.default_order()
    position = {node_id: i for i, node_id in enumerate(order)}
    producers: list[list[int]] = [[] for _ in order]
    for src, dsts in graph.consumers.items():
        for dst in dsts:
            producers[position[dst]].append(position[src])
    nodes = [graph.nodes[node_id] for node_id in order]
    return _graph(
        graph.name,
        graph.batch_size,
        order,
        [n.description for n in nodes],
        [(n.fwd_ms, n.bwd_ms, n.activation_bytes, n.param_bytes) for n in nodes],
        [tuple(sorted(set(p))) for p in producers],
        tuple(n.line for n in nodes),
    )


@dataclass(frozen=True, slots=True)
class PlanningGraph:
    """The graph the planner works on and how it maps back: `kept[i]` is planning node i's layer, `inputs` the
    removed Input sources, `sinks` the removed `__getitem__` sinks, `first` the planning node states start from."""

    full: PipeDreamGraph
    graph: PipeDreamGraph
    kept: tuple[int, ...]
    inputs: tuple[int, ...]
    sinks: tuple[int, ...]
    first: int


def planning_graph(full: PipeDreamGraph) -> PlanningGraph:
    """Remove Input sources, then `__getitem__` sinks, as PipeDream does (module docstring)."""
    consumers = full.consumers()
    inputs = {i for i in range(full.num_nodes) if not full.producers[i] and full.descriptions[i].startswith("Input")}
    sinks = {
        i
        for i in range(full.num_nodes)
        if i not in inputs and not consumers[i] and full.descriptions[i].startswith("__getitem__")
    }
    keep = tuple(i for i in range(full.num_nodes) if i not in inputs and i not in sinks)
    if not keep:
        keep = tuple(i for i in range(full.num_nodes) if i not in inputs) or tuple(range(full.num_nodes))
        sinks = set()
        inputs = {i for i in inputs if i not in keep}
    graph = full.subgraph(keep)
    sources = [i for i in range(graph.num_nodes) if not graph.producers[i]]
    first = sources[0] if graph.file_rank is None else min(sources, key=lambda i: graph.file_rank[i])  # type: ignore[index]
    return PlanningGraph(full, graph, keep, tuple(sorted(inputs)), tuple(sorted(sinks)), first)
