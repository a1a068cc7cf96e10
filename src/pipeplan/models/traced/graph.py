"""A branching torch model as layers: one layer per node of its torch.fx graph that computes, and the graph's edges.

`trace_layers` turns a module into layers: layer 0 is the model's input (the
graph's placeholder, an identity), then one `NodeLayer` per call_module,
call_function and call_method node in the graph's (topological) order. A
layer's inputs are the layers whose outputs its node reads, ascending; it is
called with their outputs in that order. A call_module node owns its module;
a parameter or buffer the forward reads outside a module call (a class token,
a position table) belongs to the layer that reads it: that layer holds the
model's own object, so one read by two layers is one parameter held by both
(models.parameter_sharing). A module without parameters may be called more than once
(one ReLU after each residual add): each call is a layer. `LayerGraph` holds the edges
and every layer's per-sample output shape, which is what a pipeline stage
needs to pack the tensors that cross a cut into one (models.traced.graph_stage).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from pipeplan.core.errors import ProfileError


@dataclass(frozen=True, slots=True)
class _Slot:
    """Where a node's argument reads the output of its `index`-th input (in the layer's ascending input order)."""

    index: int


@dataclass(frozen=True, slots=True)
class _Attr:
    """Where a node's argument reads the layer's own attribute `name` (a parameter or buffer of the model)."""

    name: str


_RESERVED = frozenset({"kind", "fn", "target", "template_args", "template_kwargs", "training"})
"""NodeLayer's own attributes: a model attribute of one of these names is held under `attr_<name>`."""


class InputLayer(nn.Module):
    """Layer 0 of a traced model: the model's input, passed on as it is."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The input itself."""
        return x


class NodeLayer(nn.Module):
    """One fx node as a layer: a module call, a function call or a method call on the outputs of its inputs."""

    def __init__(
        self,
        kind: str,
        target: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        attrs: dict[str, object] | None = None,
    ) -> None:
        super().__init__()
        for attr, value in (attrs or {}).items():  # the model's own objects, so tying is kept
            if isinstance(value, nn.Parameter):
                self.register_parameter(attr, value)
            elif isinstance(value, torch.Tensor):
                self.register_buffer(attr, value)
            else:
                setattr(self, attr, value)
        self.kind = kind
        if kind == "call_module":
            self.fn = target  # a child: its parameters belong to this layer
        else:
            self.target = target
        self.template_args = args
        self.template_kwargs = kwargs

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        """The node's value, its arguments filled with `inputs` (the outputs of its input layers, ascending)."""

        def fill(a: Any) -> Any:
            if isinstance(a, _Slot):
                return inputs[a.index]
            return getattr(self, a.name) if isinstance(a, _Attr) else a

        args = fx.node.map_aggregate(self.template_args, fill)
        kwargs = fx.node.map_aggregate(self.template_kwargs, fill)
        if self.kind == "call_module":
            return self.fn(*args, **kwargs)
        if self.kind == "call_function":
            return self.target(*args, **kwargs)
        return getattr(args[0], self.target)(*args[1:], **kwargs)

    def extra_repr(self) -> str:
        return "" if self.kind == "call_module" else f"{self.kind} {getattr(self.target, '__name__', self.target)}"


def trace_layers(module: nn.Module, name: str) -> tuple[tuple[nn.Module, ...], tuple[str, ...], tuple[tuple[int, ...], ...]]:
    """The layers, their names and their inputs of `module` traced with torch.fx (module docstring).

    Raises:
        ProfileError: the module does not trace, takes other than one input, returns other than one tensor node,
            calls a module with parameters twice, or has a node that reads no other node (its value would not depend
            on the model's input).
    """
    try:
        graph = fx.symbolic_trace(module).graph
    except Exception as exc:  # fx raises many kinds (TraceError, TypeError, NotImplementedError) on untraceable code
        raise ProfileError(f"model {name!r} cannot be traced with torch.fx: {type(exc).__name__}: {exc}") from None
    graph.eliminate_dead_code()
    nodes = list(graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    if len(placeholders) != 1:
        raise ProfileError(f"model {name!r} must take exactly one input tensor, its forward takes {len(placeholders)}")
    output = nodes[-1]
    if output.op != "output" or not isinstance(output.args[0], fx.Node):
        raise ProfileError(f"model {name!r} must return one tensor, got {output.args[0]!r}")
    index = {placeholders[0]: 0}
    layers: list[nn.Module] = [InputLayer()]
    names = [placeholders[0].name]
    inputs: list[tuple[int, ...]] = [()]
    called: dict[str, str] = {}
    for node in nodes:
        if node.op in ("placeholder", "output"):
            continue
        if node.op == "get_attr":
            continue  # read by the layers of its users (below)
        read = [n for n in node.all_input_nodes if n.op != "get_attr"]
        sources = sorted({index[n] for n in read})
        if not sources:
            raise ProfileError(f"model {name!r} node {node.name!r} reads no other node: it does not depend on the input")
        slot: dict[fx.Node, Any] = {n: _Slot(sources.index(index[n])) for n in read}
        attrs = {}
        for n in node.all_input_nodes:
            if n.op == "get_attr":
                attr = str(n.target).replace(".", "_")
                attr = attr if attr not in _RESERVED else f"attr_{attr}"
                attrs[attr] = _fetch(module, str(n.target))
                slot[n] = _Attr(attr)
        args = fx.node.map_arg(node.args, slot.__getitem__)
        kwargs = fx.node.map_arg(node.kwargs, slot.__getitem__)
        target: Any = node.target
        if node.op == "call_module":
            target = module.get_submodule(node.target)
            if node.target in called and any(True for _ in target.parameters()):
                raise ProfileError(
                    f"model {name!r} calls module {node.target!r} twice ({called[node.target]}, {node.name}): "
                    "its parameters would belong to two layers; call one module per use"
                )
            called[node.target] = node.name
        index[node] = len(layers)
        layers.append(NodeLayer(node.op, target, tuple(args), dict(kwargs), attrs))
        names.append(node.name)
        inputs.append(tuple(sources))
    if index[output.args[0]] != len(layers) - 1:  # after dead-code elimination every node feeds the output
        raise ProfileError(f"model {name!r} must return the value of its last node")
    return tuple(layers), tuple(names), tuple(inputs)


def _fetch(module: nn.Module, target: str) -> object:
    """The object an fx get_attr node reads: the module's own parameter, buffer or attribute at `target`."""
    owner_path, _, attr = target.rpartition(".")
    return getattr(module.get_submodule(owner_path) if owner_path else module, attr)


def consumers(inputs: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    """Per layer, the layers that read its output (ascending)."""
    out: list[list[int]] = [[] for _ in inputs]
    for layer, sources in enumerate(inputs):
        for source in sources:
            out[source].append(layer)
    return tuple(tuple(c) for c in out)


def live_after(inputs: Sequence[Sequence[int]], order: Sequence[int], position: int) -> tuple[int, ...]:
    """The layers at positions <= `position` of `order` whose output a layer at a later position reads, in position
    order: the tensors that cross the cut after `position` (the contract of core.dag's cut bytes)."""
    where = {layer: p for p, layer in enumerate(order)}
    readers = consumers(inputs)
    return tuple(layer for layer in order[: position + 1] if any(where[c] > position for c in readers[layer]))


def run_layers(layers: Sequence[nn.Module], inputs: Sequence[Sequence[int]] | None, x: torch.Tensor) -> list[torch.Tensor]:
    """Every layer's output on input `x`: a chain (inputs None) composed in order, else the graph in index order."""
    outs: list[torch.Tensor] = []
    for i, layer in enumerate(layers):
        if inputs is None:
            outs.append(layer(outs[-1] if outs else x))
        else:
            outs.append(layer(*(outs[p] for p in inputs[i])) if inputs[i] else layer(x))
    return outs


class GraphNet(nn.Module):
    """The whole model as one module over the layers' own objects (an unpipelined reference, evaluation)."""

    def __init__(self, layers: Sequence[nn.Module], inputs: Sequence[Sequence[int]]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.inputs = tuple(tuple(s) for s in inputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The last layer's output."""
        return run_layers(list(self.layers), self.inputs, x)[-1]


@dataclass(frozen=True)
class LayerGraph:
    """A traced model's edges and each layer's output per sample (shape after the batch dimension, dtype)."""

    inputs: tuple[tuple[int, ...], ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]
    names: tuple[str, ...]

    @classmethod
    def measure(
        cls, layers: Sequence[nn.Module], inputs: tuple[tuple[int, ...], ...], names: Sequence[str], sample: torch.Tensor
    ) -> LayerGraph:
        """Run the layers once on `sample` (no gradients, every layer in eval mode, then restored) for the shapes.

        Raises:
            ProfileError: a layer whose output is not a tensor with the batch as its first dimension.
        """
        modes = [(m, m.training) for layer in layers for m in layer.modules()]
        try:
            for m, _ in modes:
                m.training = False
            with torch.no_grad():
                outs = run_layers(layers, inputs, sample)
        finally:
            for m, mode in modes:
                m.training = mode
        batch = sample.shape[0]
        for name, out in zip(names, outs, strict=True):
            if not isinstance(out, torch.Tensor) or out.dim() == 0 or out.shape[0] != batch:
                what = f"shape {tuple(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
                raise ProfileError(
                    f"layer {name!r} returns {what} on a batch of {batch}: every layer must return one tensor whose "
                    "first dimension is the batch"
                )
        return cls(inputs, tuple(tuple(o.shape[1:]) for o in outs), tuple(o.dtype for o in outs), tuple(names))

    def live_after(self, order: Sequence[int], position: int) -> tuple[int, ...]:
        """The layers whose outputs cross the cut after `position` of `order` (module function `live_after`)."""
        return live_after(self.inputs, order, position)
