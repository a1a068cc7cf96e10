"""A graph.txt profile as the DAG it is: its nodes and edges, the default topological order (Kahn's algorithm, ties
broken by the node's line), a cycle named when there is one, and the chain profile of an order."""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from pipeplan.core.dag import live_cuts
from pipeplan.core.errors import ProfileError
from pipeplan.core.profile import LayerProfile, ModelProfile


@dataclass(frozen=True, slots=True)
class GraphNode:
    """One node line of the file: its id, description, line number, and its costs for the file's batch."""

    node_id: str
    description: str
    line: int
    fwd_ms: float
    bwd_ms: float
    activation_bytes: float
    param_bytes: float


@dataclass(frozen=True, slots=True)
class ModelGraph:
    """A graph.txt profile as the DAG it is: nodes by id (in line order) and each node's consumers."""

    source: str
    nodes: dict[str, GraphNode]
    consumers: dict[str, list[str]]
    batch_size: int
    name: str
    reference_device: str = "unknown"

    def default_order(self) -> list[str]:
        """The topological order `read_graph_txt` uses: Kahn's algorithm, ties broken by line.

        Raises:
            ProfileError: the graph has a cycle (naming it).
        """
        return topological_order(self.nodes, self.consumers, self.source)

    def linearize(self, order: list[str] | None = None) -> ModelProfile:
        """The chain profile of the nodes in `order` (default: default_order()); cut i carries every output made at
        or before position i and consumed after it.

        Raises:
            ProfileError: `order` misses, repeats or invents a node, or puts a consumer before its producer.
        """
        order = self.default_order() if order is None else list(order)
        self._check_order(order)
        position = {node_id: i for i, node_id in enumerate(order)}
        inputs: list[list[int]] = [[] for _ in order]
        for src, dsts in self.consumers.items():
            for dst in dsts:
                inputs[position[dst]].append(position[src])
        layer_inputs = tuple(tuple(sorted(sources)) for sources in inputs)
        return ModelProfile(
            name=self.name,
            batch_size=self.batch_size,
            layers=tuple(node_layer(self.nodes[node_id]) for node_id in order),
            reference_device=self.reference_device,
            cut_bytes=live_cuts([self.nodes[node_id].activation_bytes for node_id in order], layer_inputs),
            measured=True,
            layer_inputs=layer_inputs,
        )

    def _check_order(self, order: list[str]) -> None:
        """Raise ProfileError unless `order` holds every node once and every producer before its consumers."""
        seen: set[str] = set()
        for i, node_id in enumerate(order):
            if node_id not in self.nodes:
                raise ProfileError(f"{self.source}: order[{i}] names node {node_id!r}, which the graph does not have")
            if node_id in seen:
                raise ProfileError(f"{self.source}: order[{i}] repeats node {node_id!r}")
            seen.add(node_id)
        missing = [n for n in self.nodes if n not in seen]
        if missing:
            raise ProfileError(f"{self.source}: the order leaves out {len(missing)} node(s), first {missing[0]!r}")
        position = {node_id: i for i, node_id in enumerate(order)}
        for src, dsts in self.consumers.items():
            for dst in dsts:
                if position[dst] < position[src]:
                    raise ProfileError(
                        f"{self.source}: the order puts {dst!r} (position {position[dst]}) before {src!r} "
                        f"(position {position[src]}), whose output it consumes (edge {src} -- {dst})"
                    )


def topological_order(nodes: dict[str, GraphNode], consumers: dict[str, list[str]], source: str) -> list[str]:
    """Kahn's algorithm; among ready nodes the one with the smallest line comes first."""
    indegree = dict.fromkeys(nodes, 0)
    for dsts in consumers.values():
        for dst in dsts:
            indegree[dst] += 1
    ready = [(node.line, node_id) for node_id, node in nodes.items() if indegree[node_id] == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        _, node_id = heapq.heappop(ready)
        order.append(node_id)
        for dst in consumers[node_id]:
            indegree[dst] -= 1
            if indegree[dst] == 0:
                heapq.heappush(ready, (nodes[dst].line, dst))
    if len(order) < len(nodes):
        cycle = _find_cycle({n for n, d in indegree.items() if d > 0}, nodes, consumers)
        path = " -> ".join(f"{n} (line {nodes[n].line})" for n in [*cycle, cycle[0]])
        raise ProfileError(f"{source}: the graph has a cycle through node {cycle[0]}: {path}")
    return order


def _find_cycle(stuck: set[str], nodes: dict[str, GraphNode], consumers: dict[str, list[str]]) -> list[str]:
    """A cycle among the nodes Kahn's algorithm could not order, starting at its earliest line.

    Every stuck node has a stuck producer, so walking producers backwards from
    any stuck node must revisit a node; the revisited stretch is a cycle.
    """
    producers: dict[str, list[str]] = {n: [] for n in stuck}
    for src in sorted(stuck, key=lambda n: nodes[n].line):
        for dst in consumers[src]:
            if dst in stuck:
                producers[dst].append(src)
    walk: list[str] = []
    seen: dict[str, int] = {}
    node_id = min(stuck, key=lambda n: nodes[n].line)
    while node_id not in seen:
        seen[node_id] = len(walk)
        walk.append(node_id)
        node_id = producers[node_id][0]
    cycle = list(reversed(walk[seen[node_id] :]))
    first = cycle.index(min(cycle, key=lambda n: nodes[n].line))
    return cycle[first:] + cycle[:first]


def node_layer(node: GraphNode) -> LayerProfile:
    """The node as a layer, named by its description made unique with its id."""
    return LayerProfile(
        name=f"{node.node_id}:{node.description}",
        fwd_ms=node.fwd_ms,
        bwd_ms=node.bwd_ms,
        activation_bytes=node.activation_bytes,
        param_bytes=node.param_bytes,
    )
