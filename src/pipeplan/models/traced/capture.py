"""A stock model captured with torch.export: its graph grouped into layers along its own module hierarchy.

Used when a module is neither a chain of blocks nor traceable by torch.fx
(Hugging Face transformers, models with data-independent control flow).
`export_layers` exports the module in training mode with a dynamic batch
dimension (so any microbatch size runs) and groups the graph's computing
nodes into layers by their `nn_module_stack`:

  - the layer roots are the model's modules that hold no container
    (ModuleList, Sequential, ModuleDict) below them, found from the top: each
    child of a container (a transformer block, a ResNet block) is a root, and
    so is each other top-level leaf (embeddings, final norm, head); a layer is
    named by its root's module path (`transformer.h.0`, `lm_head`);
  - a node outside every root joins the layer that reads it (a node read by
    several layers is a layer of its own, named after the node);
  - a value that does not depend on the input's data (a causal mask, position
    ids or rotary tables made from shapes and buffers) is recomputed inside
    every layer that reads it rather than crossing stages; the batch size such
    a value needs is read from the layer's own input.

Layer 0 is the layer that reads the model's input (the forward's first
argument: token ids, pixels), so the input never crosses a cut; where several
layers read it, layer 0 is the input itself (models.traced.graph.InputLayer). Each
layer is an `fx.GraphModule` that holds the ORIGINAL model's Parameter and buffer
objects under their module paths, so a tied weight (GPT-2's `lm_head.weight`
is `transformer.wte.weight`) is one object held by two layers
(models.parameter_sharing.shared_parameters finds it). Dropout, batch norm and
attention dropout follow each layer's `training` flag, as the model's own
modules do.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import fx, nn

from pipeplan.core.errors import ProfileError
from pipeplan.models.traced.capture_nodes import BatchExpression, add_while_training, follow_mode, is_size, mutates, quiet
from pipeplan.models.traced.graph import InputLayer

_CONTAINERS = (nn.ModuleList, nn.Sequential, nn.ModuleDict)
_WRAPPED = "model"
"""The attribute that holds the user's module inside the exported wrapper (stripped from every layer name)."""
MODEL_INPUT = -1
"""The source of the one layer that reads the model's input itself (it has no input layers: layer 0)."""
LayerParts = tuple[tuple[nn.Module, ...], tuple[str, ...], tuple[tuple[int, ...], ...]]


def export_layers(module: nn.Module, name: str, sample: torch.Tensor, call: Callable[..., torch.Tensor]) -> LayerParts:
    """The layers, names and inputs of `module` exported with torch.export (module docstring).

    Args:
        module: the user's model (left as it is; its mode is restored).
        name: the model's name, for errors.
        sample: one batch of the model's input (at least 2 samples; the batch dimension is made dynamic).
        call: `call(module, x)` runs the model on input x and returns one tensor (the logits).

    Raises:
        ProfileError: the export fails, or the graph has no layer split whose layers each return one tensor.
    """
    wrapper = _Wrapper(module, call)
    mode = module.training
    module.train()
    try:
        batch = torch.export.Dim("batch", min=1)
        with quiet():
            program = torch.export.export(wrapper, (sample,), dynamic_shapes=({0: batch},), strict=False)
    except Exception as exc:  # export raises many kinds (UserError, GuardOnDataDependentSymNode, TypeError, ...)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ProfileError(
            f"model {name!r} ({type(module).__name__}) cannot be captured with torch.export: {type(exc).__name__}: "
            f"{first[:300]}; return an nn.Sequential or give the model a pipeline_layers() method"
        ) from None
    finally:
        module.train(mode)
    return _Grouping(program, wrapper, name).layers()


class _Wrapper(nn.Module):
    """The user's module as one tensor in, one tensor out (what is exported)."""

    def __init__(self, module: nn.Module, call: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.model = module
        self.call = call

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The model's output tensor for x."""
        return self.call(self.model, x)


def layer_roots(module: nn.Module, prefix: str = "", in_container: bool = False) -> set[str]:
    """The module paths that become layers (module docstring): above the first container, every module that holds
    a container is split into its children; a container's child is a layer unless all its children are containers
    (a stage that only groups blocks), which are then split in turn."""
    children = list(module.named_children())
    if isinstance(module, _CONTAINERS):
        split = True
    elif in_container:
        split = bool(children) and all(isinstance(child, _CONTAINERS) for _, child in children)
    else:
        split = any(isinstance(m, _CONTAINERS) for m in module.modules())
    if not split:
        return {prefix}
    roots: set[str] = set()
    inside = in_container or isinstance(module, _CONTAINERS)
    for child_name, child in children:
        roots |= layer_roots(child, f"{prefix}.{child_name}" if prefix else child_name, inside)
    return roots


class _Grouping:
    """The exported graph's nodes sorted into layers, then each layer built as a GraphModule."""

    def __init__(self, program: torch.export.ExportedProgram, wrapper: nn.Module, name: str) -> None:
        self.name = name
        self.graph = program.graph_module.graph
        self.program_module = program.graph_module
        self.wrapper = wrapper
        self.attrs = self._lifted(program)
        users = [n for n in self.graph.nodes if n.op == "placeholder" and n.name not in self.attrs]
        if len(users) != 1:
            raise ProfileError(f"model {name!r} must take exactly one input tensor, its export takes {len(users)}")
        self.input = users[0]
        self.symbol = _batch_symbol(self.input)
        self.output = next(n for n in self.graph.nodes if n.op == "output").args[0]
        if isinstance(self.output, (tuple, list)):
            self.output = self.output[0]
        self.roots = layer_roots(wrapper)
        self.order = {n: i for i, n in enumerate(self.graph.nodes)}
        self.dependent = self._dependent()

    def _lifted(self, program: torch.export.ExportedProgram) -> dict[str, tuple[str, object]]:
        """Placeholder name -> (attribute path without the wrapper, the ORIGINAL object) for parameters, buffers and
        constants; a tied parameter is named after its first name in the model."""
        signature = program.graph_signature
        canonical = {id(p): path for path, p in self.wrapper.named_parameters(remove_duplicate=True)}
        out: dict[str, tuple[str, object]] = {}
        for placeholder, target in signature.inputs_to_parameters.items():
            param = self.wrapper.get_parameter(target)
            out[placeholder] = (_strip(canonical.get(id(param), target)), param)
        for placeholder, target in signature.inputs_to_buffers.items():
            out[placeholder] = (_strip(target), self.wrapper.get_buffer(target))
        for placeholder, target in signature.inputs_to_lifted_tensor_constants.items():
            out[placeholder] = (f"constants.{target.replace('.', '_')}", program.constants[target])
        return out

    def _dependent(self) -> set[fx.Node]:
        """The nodes whose value reads the input's data (sizes are not data: they are re-read in each layer)."""
        dependent: set[fx.Node] = set()
        for node in self.graph.nodes:
            if node is self.input or (
                node.op == "call_function" and not is_size(node) and any(a in dependent for a in node.all_input_nodes)
            ):
                dependent.add(node)
        return dependent

    def _root(self, node: fx.Node) -> str | None:
        """The layer root whose call made `node`, or None for a node outside every root."""
        stack = node.meta.get("nn_module_stack") or {}
        for path, _ in stack.values():
            path = _clean_path(path)
            if path in self.roots and path:
                return path
        return None

    def layers(self) -> LayerParts:
        """Group, check each layer has one output, and build the layers."""
        group = self._assign()
        order = self._order(group)
        members: dict[str, list[fx.Node]] = {g: [] for g in order}
        for node in self.graph.nodes:
            if node in group:
                members[group[node]].append(node)
        readers = {group[u] for u in self.input.users if u in group and u in self.dependent}
        layers: list[nn.Module] = []
        names: list[str] = []
        inputs: list[tuple[int, ...]] = []
        produced: dict[fx.Node, int] = {self.input: MODEL_INPUT}
        if len(readers) != 1:  # several layers read the input: an input layer passes it on (models.traced.graph)
            value = self.input.meta.get("val")
            if isinstance(value, torch.Tensor) and not value.is_floating_point():
                raise ProfileError(
                    f"model {self.name!r} reads its {value.dtype} input in {len(readers)} layers "
                    f"({', '.join(sorted(_strip(r) for r in readers))}): only floating-point tensors cross stages; "
                    "return an nn.Sequential or give the model a pipeline_layers() method"
                )
            layers, names, inputs = [InputLayer()], [_input_name(self.wrapper)], [()]
            produced[self.input] = 0
        for g in order:
            out = self._single_output(g, members[g], group)
            read = {
                produced[a]
                for n in members[g]
                for a in n.all_input_nodes
                if a in self.dependent and group.get(a) != g and not is_size(a)
            }
            if MODEL_INPUT in read and len(read) > 1:
                raise ProfileError(f"model {self.name!r}: layer {_strip(g)!r} reads the model's input and another layer")
            sources = sorted(read - {MODEL_INPUT})
            layers.append(self._build(g, members[g], out, sorted(read), produced))
            names.append(_strip(g))
            inputs.append(tuple(sources))
            produced[out] = len(layers) - 1
        if produced.get(self.output) != len(layers) - 1:
            raise ProfileError(f"model {self.name!r}: the exported output is not made by the last layer")
        return tuple(layers), tuple(names), tuple(inputs)

    def _assign(self) -> dict[fx.Node, str]:
        """Each data-dependent node's layer (and each mutating node's): its root, else the one layer reading it."""
        group: dict[fx.Node, str] = {}
        nodes = [n for n in self.graph.nodes if n.op == "call_function"]
        for node in reversed(nodes):
            if node not in self.dependent:
                root = self._root(node) if mutates(node) else None
                if root is not None:
                    group[node] = root
                continue
            root = self._root(node)
            if root is None:
                readers = {group.get(u, "") for u in node.users if u in self.dependent}
                root = readers.pop() if len(readers) == 1 and "" not in readers and node is not self.output else node.name
            group[node] = root
        dependent_groups = {group[n] for n in nodes if n in self.dependent}
        return {n: g for n, g in group.items() if g in dependent_groups}

    def _order(self, group: dict[fx.Node, str]) -> list[str]:
        """The layers in an order where each reads only earlier ones (by their last node), or a ProfileError."""
        last: dict[str, int] = {}
        for node, g in group.items():
            last[g] = max(last.get(g, -1), self.order[node])
        order = sorted(last, key=last.__getitem__)
        where = {g: i for i, g in enumerate(order)}
        for node, g in group.items():
            for a in node.all_input_nodes:
                if a in group and group[a] != g and a in self.dependent and where[group[a]] > where[g]:
                    raise ProfileError(
                        f"model {self.name!r}: layers {_strip(group[a])!r} and {_strip(g)!r} read each other's values; "
                        "return an nn.Sequential or give the model a pipeline_layers() method"
                    )
        return order

    def _single_output(self, g: str, members: list[fx.Node], group: dict[fx.Node, str]) -> fx.Node:
        """The one node of layer g that another layer (or the model's output) reads, or a ProfileError."""
        outs = [
            n
            for n in members
            if n in self.dependent and (n is self.output or any(group.get(u) != g and u in self.dependent for u in n.users))
        ]
        if len(outs) != 1:
            raise ProfileError(
                f"model {self.name!r}: layer {_strip(g)!r} passes {len(outs)} values ({', '.join(n.name for n in outs)}) to "
                "other layers, not one tensor; return an nn.Sequential or give the model a pipeline_layers() method"
            )
        return outs[0]

    def _build(self, g: str, members: list[fx.Node], out: fx.Node, sources: list[int], produced: dict[fx.Node, int]) -> nn.Module:
        """Layer g as a GraphModule: its nodes, the data-free values they read recomputed, its sources as inputs."""
        graph = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        attrs: dict[str, object] = {"training": True}
        by_layer = {layer: n for n, layer in produced.items()}
        placeholders = []
        for layer in sources:
            original = by_layer[layer]
            env[original] = graph.placeholder(original.name)
            placeholders.append(env[original])
        batch_first = next(
            (p for p, layer in zip(placeholders, sources, strict=True) if self._batch_first(by_layer[layer])), placeholders[0]
        )
        training = graph.get_attr("training")
        member_set = set(members)

        def value(node: fx.Node) -> fx.Node:
            if node in env:
                return env[node]
            if node.op == "placeholder":
                path, obj = self.attrs[node.name]
                inner = _relative(path, _strip(g))
                path = inner if attrs.get(inner, obj) is obj else path
                attrs[path] = obj
                env[node] = graph.get_attr(path)
            elif node.op == "get_attr":
                attrs[node.target] = getattr(self.program_module, node.target)
                env[node] = graph.get_attr(node.target)
            elif is_size(node):
                env[node] = self._size(graph, node, batch_first, attrs)
            elif node in self.dependent and node not in member_set:
                raise ProfileError(
                    f"model {self.name!r}: layer {_strip(g)!r} reads {node.name!r} from a layer that does not pass it"
                )
            else:
                env[node] = copy(node)
            return env[node]

        def copy(node: fx.Node) -> fx.Node:
            args = fx.node.map_arg(node.args, value)
            kwargs = fx.node.map_arg(node.kwargs, value)
            args, kwargs = follow_mode(node.target, args, dict(kwargs), training)
            if node.target is torch.ops.aten.add_.Tensor and node not in self.dependent and not kwargs:
                made = graph.call_function(add_while_training, (training, *args))  # a step counter
            else:
                made = graph.call_function(node.target, tuple(args), kwargs)
            made.meta.update(node.meta)
            return made

        for node in members:
            value(node)
        graph.output(env[out])
        graph.eliminate_dead_code(
            is_impure_node=lambda n: n.op in ("placeholder", "output") or mutates(n) or n.target is add_while_training
        )
        return fx.GraphModule(attrs, graph, class_name="CapturedLayer")

    def _batch_first(self, node: fx.Node) -> bool:
        """Whether node's value has the batch as its first dimension."""
        value = node.meta.get("val")
        return isinstance(value, torch.Tensor) and value.dim() > 0 and _batch_symbol(node) == self.symbol

    def _size(self, graph: fx.Graph, node: fx.Node, batch_first: fx.Node, attrs: dict[str, object]) -> fx.Node:
        """A size the export derived from the batch, read from this layer's first (batch-first) input."""
        value = node.meta.get("val")
        expression = value.node.expr if isinstance(value, torch.SymInt) else None
        if expression is not None and expression == self.symbol:
            return graph.call_function(torch.ops.aten.sym_size.int, (batch_first, 0))
        if expression is None or not expression.free_symbols <= {self.symbol}:
            raise ProfileError(f"model {self.name!r}: size {node.name!r} depends on more than the batch size ({value})")
        target = f"size_{node.name}"
        attrs[target] = BatchExpression(expression, self.symbol)
        return graph.call_module(target, (batch_first,))


def _batch_symbol(node: fx.Node) -> Any:
    """The symbol of the exported input's batch dimension."""
    value = node.meta.get("val")
    size = value.shape[0] if isinstance(value, torch.Tensor) and value.dim() else None
    return size.node.expr if isinstance(size, torch.SymInt) else None


def _clean_path(path: str) -> str:
    """A module path from nn_module_stack without the wrapper's `model.` and with `[i]` as `.i`."""
    path = path.replace("L['self'].", "").replace("[", ".").replace("]", "").replace("'", "")
    return path


def _strip(path: str) -> str:
    """A wrapper-relative attribute path without the leading `model.`."""
    return path[len(_WRAPPED) + 1 :] if path.startswith(_WRAPPED + ".") else path


def _relative(path: str, root: str) -> str:
    """An attribute path inside the layer rooted at `root` (`ln_1.weight`), else the model's full path."""
    return path[len(root) + 1 :] if path.startswith(root + ".") else path


def _input_name(wrapper: nn.Module) -> str:
    """Layer 0's name: the model's forward's first argument (input_ids, pixel_values), else `input`."""
    try:
        params = [p for p in inspect.signature(wrapper.model.forward).parameters.values() if p.name != "self"]
    except (TypeError, ValueError):
        params = []
    return params[0].name if params else "input"
