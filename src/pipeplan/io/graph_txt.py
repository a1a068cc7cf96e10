"""Reader of PipeDream/DAPPLE `graph.txt` profiles: a DAG of layers, linearized into a chain.

The format has one node per line, `node5 -- layer_0 -- forward_compute_time=2.69,
backward_compute_time=4.47, activation_size=4325376, parameter_size=50384896`,
then one edge per line, `node1 -- node2` (node2 consumes node1's output), with
any leading whitespace.

A user who wants another chain than the default reads the DAG itself
(`read_graph` / `parse_graph` give an io.model_graph.ModelGraph) and linearizes it in an
order of their own (`ModelGraph.linearize(order)`), which is checked to be a
topological order of every node.

Note:
    The DAG becomes a chain in topological order, ties broken by the node's
    line in the file (Kahn's algorithm over a heap of line indices), so the
    order is deterministic and follows the file where the file is already a
    valid order. `cut_bytes[i]` sums the outputs of every node at position
    <= i that a node after i consumes: a skip connection over a cut counts.
    The edges stay in the profile (`ModelProfile.layer_inputs`, positions in
    that order), so a plan may place the layers in another topological order
    (core.dag).
"""

from __future__ import annotations

import math
import os
import re

from pipeplan.core.errors import ProfileError
from pipeplan.core.limits import LAYERS, MAX_BYTES, MAX_MS
from pipeplan.core.profile import ModelProfile
from pipeplan.io.files import read_input_text
from pipeplan.io.model_graph import GraphNode, ModelGraph

_FIELDS = ("forward_compute_time", "backward_compute_time", "activation_size", "parameter_size")
_INPUT_NODE = re.compile(r"Input\d*")
_PBS = re.compile(r"-pbs-(\d+)")
_EDGE = re.compile(r"(\S+)\s+--\s+(\S+)")


def batch_size_from_name(file_name: str) -> int | None:
    """Return N from a `-pbs-N` in a file name, or None when absent."""
    match = _PBS.search(os.path.basename(file_name))
    return int(match.group(1)) if match else None


def profile_name_from_file(file_name: str) -> str:
    """Default profile name: the file name without directories, `.txt` and `-pbs-N` (suffixes after it kept)."""
    stem = os.path.basename(file_name)
    if stem.endswith(".txt"):
        stem = stem[: -len(".txt")]
    return _PBS.sub("", stem) or stem


def read_graph_txt(
    path: str | os.PathLike[str],
    profile_batch_size: int | None = None,
    name: str | None = None,
    reference_device: str = "unknown",
) -> ModelProfile:
    """Read a graph.txt file into a chain ModelProfile.

    Args:
        path: the file.
        profile_batch_size: batch size the file was measured with, used when its
            name has no `-pbs-N`; must agree with it when both are given.
        name: profile name (default: the file name without `-pbs-N.txt`).
        reference_device: the GPU the file was measured on.

    Raises:
        ProfileError: naming the file, line, field and value.
    """
    source = os.fspath(path)
    return parse_graph_txt(_read_text(source), source, profile_batch_size, name, reference_device)


def _read_text(source: str) -> str:
    """The file's text (io.files: a regular file within the size limit), or a ProfileError naming it."""
    return read_input_text(source, "profile", ProfileError)


def parse_graph_txt(
    text: str,
    source: str,
    profile_batch_size: int | None = None,
    name: str | None = None,
    reference_device: str = "unknown",
) -> ModelProfile:
    """Parse graph.txt text into the default chain; `source` is the file name used in messages and for `-pbs-N`.

    Raises:
        ProfileError: naming the source, line, field and value.
    """
    return parse_graph(text, source, profile_batch_size, name, reference_device).linearize()


def read_graph(
    path: str | os.PathLike[str],
    profile_batch_size: int | None = None,
    name: str | None = None,
    reference_device: str = "unknown",
) -> ModelGraph:
    """Read a graph.txt file as its DAG (arguments as read_graph_txt).

    Raises:
        ProfileError: naming the file, line, field and value.
    """
    source = os.fspath(path)
    return parse_graph(_read_text(source), source, profile_batch_size, name, reference_device)


def parse_graph(
    text: str, source: str, profile_batch_size: int | None = None, name: str | None = None, reference_device: str = "unknown"
) -> ModelGraph:
    """graph.txt text as its DAG; `source` names it in messages and gives `-pbs-N`.

    Raises:
        ProfileError: naming the source, line, field and value.
    """
    batch_size = _batch_size(source, profile_batch_size)
    nodes, consumers = _parse(text, source)
    return ModelGraph(source, nodes, consumers, batch_size, name or profile_name_from_file(source), reference_device)


def _batch_size(source: str, profile_batch_size: int | None) -> int:
    """The file name's `-pbs-N`, else profile_batch_size, else an error."""
    from_name = batch_size_from_name(source)
    if profile_batch_size is not None and (
        isinstance(profile_batch_size, bool) or not isinstance(profile_batch_size, int) or profile_batch_size < 1
    ):
        raise ProfileError(f"{source}: profile batch size must be an integer >= 1, got {profile_batch_size!r}")
    if from_name is not None:
        if from_name < 1:
            raise ProfileError(f"{source}: batch size in the file name must be >= 1, got -pbs-{from_name}")
        if profile_batch_size is not None and profile_batch_size != from_name:
            raise ProfileError(
                f"{source}: the file name says batch size {from_name} (-pbs-{from_name}) "
                f"but the profile batch size given is {profile_batch_size}"
            )
        return from_name
    if profile_batch_size is None:
        raise ProfileError(
            f"{source}: batch size unknown: the file name has no -pbs-N; give --profile-batch-size "
            "(the batch the file was measured with)"
        )
    return profile_batch_size


def _parse(text: str, source: str) -> tuple[dict[str, GraphNode], dict[str, list[str]]]:
    """Nodes by id (in line order) and, per node, the ids of its consumers (in edge order, no duplicates)."""
    nodes: dict[str, GraphNode] = {}
    edges: list[tuple[str, str, int]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        parts = line.split(" -- ")
        if len(parts) >= 3:
            LAYERS.check(ProfileError, f"{source}:{number}: the graph", len(nodes) + 1)
            node = _parse_node(parts, number, source)
            if node.node_id in nodes:
                first = nodes[node.node_id].line
                raise ProfileError(f"{source}:{number}: node id {node.node_id!r} already defined on line {first}")
            nodes[node.node_id] = node
            continue
        match = _EDGE.fullmatch(line)
        if match is None:
            raise ProfileError(
                f"{source}:{number}: expected a node line 'id -- description -- fields' or an edge line 'a -- b', got {line!r}"
            )
        edges.append((match.group(1), match.group(2), number))
    if not nodes:
        raise ProfileError(f"{source}: no node lines found")
    consumers: dict[str, list[str]] = {node_id: [] for node_id in nodes}
    seen: set[tuple[str, str]] = set()  # a set, not `in` on the lists: a node with many consumers stays linear
    for src, dst, number in edges:
        for end in (src, dst):
            if end not in nodes:
                raise ProfileError(f"{source}:{number}: edge {src} -- {dst} names node {end!r}, which has no node line")
        if (src, dst) not in seen:
            seen.add((src, dst))
            consumers[src].append(dst)
    return nodes, consumers


def _parse_node(parts: list[str], number: int, source: str) -> GraphNode:
    """One node line split on ' -- ': id, description (may itself contain ' -- '), fields."""
    node_id = parts[0].strip()
    description = " -- ".join(parts[1:-1]).strip()
    if not description:
        raise ProfileError(f"{source}:{number}: node {node_id!r} has an empty description")
    values: dict[str, float] = {}
    for item in parts[-1].split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep:
            raise ProfileError(f"{source}:{number}: node {node_id} field {item!r} is not key=value")
        if key in values:
            raise ProfileError(f"{source}:{number}: node {node_id} field {key} given twice")
        if key in _FIELDS:
            values[key] = _number(value.strip(), key, node_id, number, source)
    for key in _FIELDS:
        if key not in values:
            raise ProfileError(f"{source}:{number}: node {node_id} is missing field {key}")
    is_input = _INPUT_NODE.fullmatch(description) is not None
    return GraphNode(
        node_id=node_id,
        description=description,
        line=number,
        # An Input node's time is data loading, not model compute (PipeDream's planner counts it as zero).
        fwd_ms=0.0 if is_input else values["forward_compute_time"],
        bwd_ms=0.0 if is_input else values["backward_compute_time"],
        activation_bytes=values["activation_size"],
        param_bytes=values["parameter_size"],
    )


def _number(text: str, key: str, node_id: str, number: int, source: str) -> float:
    """A finite number >= 0; `[a; b]` (several outputs) is their sum."""
    items = [text]
    if text.startswith("[") and text.endswith("]"):
        items = [part.strip() for part in text[1:-1].split(";")]
    total = 0.0
    for item in items:
        try:
            value = float(item)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0:
            raise ProfileError(f"{source}:{number}: node {node_id} {key} must be a finite number >= 0, got {text!r}")
        total += value
    (MAX_MS if key.endswith("_time") else MAX_BYTES).check(ProfileError, f"{source}:{number}: node {node_id} {key}", total)
    return total
