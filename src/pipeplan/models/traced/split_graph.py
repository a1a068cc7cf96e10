"""A captured Llama-style block (models.traced.capture) split Megatron-style over a tensor-parallel group.

A captured layer is a graph of aten ops over the stock model's own Parameters. It is a block this module splits
when its graph calls `aten.linear` on the weights named `self_attn.{q,k,v,o}_proj` and `mlp.{gate,up,down}_proj`
(Hugging Face's Llama, Mistral, Qwen2 decoder layers), once each, and each of q, k and v is viewed as
(batch, seq, -1, head_dim). `split_layer` copies the graph with:

  - q, k, v, gate and up column-parallel (each TP rank holds rows of its heads and hidden units), o and down
    row-parallel (each TP rank holds the matching columns; a bias is added once, after the sum);
  - an `enter` module on the input of each column-parallel linear (Megatron's f: identity forward, all-reduce of the
    gradient) and a `leave` module on the output of each row-parallel one (Megatron's g: all-reduce forward,
    identity backward); both are identities here, the runtime puts its collectives in
    (runtime.execution.tp_layers);
  - the head counts the export fixed as numbers divided by t: where a size list between q/k/v and o (with no -1 in
    it) holds the heads or key/value heads at dimension 1, or their width at its last dimension (the copies of
    each key/value head, `repeat_kv`). Recent transformers view heads as -1, so the rest follows the weights;
  - with `sequence` (sequence parallelism), SEQUENCE_HOOKS: `sp_scatter` on the block's input (where a TP rank takes
    its share of the sequence), `sp_gather` on its output (where it gathers the shares whole), `sp_summed` on each
    read of a parameter that is not sharded (a norm's weight: its gradient summed over the group); the runtime puts
    the sequence's gathers and reduce-scatters in `enter` and `leave`. The attention's sizes and positions stay the
    whole sequence's: rotary tables and the causal mask act on the gathered q, k and v.

Note:
    The rewrite of fixed head counts is a rule, not a proof: `check_split_graph` runs the split on a sample in one
    process (every TP rank's shards, each `leave` given the dense value so the rest of the block runs as the dense
    one) and requires the TP ranks' partial outputs of o and down to sum to the dense ones. A block whose graph
    fixes its heads elsewhere fails that check and is refused, never run wrong. Likewise `check_sequence_graph` runs
    each TP rank's share of the sequence against the dense block before sequence parallelism is run.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import fx, nn

from pipeplan.core.errors import PlanError

COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW = ("o_proj", "down_proj")
ATTENTION = ("q_proj", "k_proj", "v_proj")
_SIZED = (torch.ops.aten.view.default, torch.ops.aten.reshape.default, torch.ops.aten.expand.default,
          torch.ops.aten._unsafe_view.default)  # fmt: skip


@dataclass(frozen=True)
class GraphBlock:
    """A captured block's projections (name -> the attribute path of its weight, of its bias or None) and sizes."""

    weights: dict[str, str]
    biases: dict[str, str | None]
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int

    def dim(self, name: str) -> int:
        """The weight dimension a projection splits along: 0 (rows) column-parallel, 1 (columns) row-parallel."""
        return 0 if name in COLUMN else 1

    def split_tensors(self) -> list[tuple[str, int]]:
        """(attribute path, dimension split) of every tensor that is sharded: weights, and column-parallel biases."""
        out = [(self.weights[name], self.dim(name)) for name in (*COLUMN, *ROW)]
        return out + [(self.biases[name], 0) for name in COLUMN if self.biases[name] is not None]  # type: ignore[misc]


def _linears(graph: fx.Graph) -> dict[str, list[fx.Node]]:
    """Projection name -> the aten.linear nodes of `graph` whose weight is that projection's."""
    found: dict[str, list[fx.Node]] = {}
    for node in graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.linear.default:
            weight = node.args[1]
            if isinstance(weight, fx.Node) and weight.op == "get_attr" and str(weight.target).endswith(".weight"):
                parts = str(weight.target).split(".")
                if len(parts) >= 3 and f"{parts[-3]}.{parts[-2]}" in _NAMES:
                    found.setdefault(parts[-2], []).append(node)
    return found


_NAMES = {f"self_attn.{n}" for n in (*ATTENTION, "o_proj")} | {f"mlp.{n}" for n in ("gate_proj", "up_proj", "down_proj")}


def graph_block(layer: nn.Module) -> GraphBlock | None:
    """The projections and sizes of a captured Llama-style block (module docstring); None for any other layer."""
    if not isinstance(layer, fx.GraphModule):
        return None
    found = _linears(layer.graph)
    if sorted(found) != sorted((*COLUMN, *ROW)) or any(len(nodes) != 1 for nodes in found.values()):
        return None
    nodes = {name: found[name][0] for name in found}
    head_dim = _head_dim(nodes["q_proj"])
    if head_dim is None or any(_head_dim(nodes[n]) != head_dim for n in ATTENTION):
        return None
    weights = {name: str(node.args[1].target) for name, node in nodes.items()}  # type: ignore[union-attr]
    biases = {name: _bias(node) for name, node in nodes.items()}
    rows = {name: layer.get_parameter(path).shape[0] for name, path in weights.items()}
    if rows["q_proj"] % head_dim or rows["k_proj"] % head_dim or rows["k_proj"] != rows["v_proj"]:
        return None
    return GraphBlock(weights, biases, rows["q_proj"] // head_dim, rows["k_proj"] // head_dim, head_dim, rows["gate_proj"])


def _head_dim(linear: fx.Node) -> int | None:
    """head_dim when the linear's one user views it as (batch, seq, -1, head_dim)."""
    users = list(linear.users)
    if len(users) != 1 or users[0].target not in _SIZED[:2]:
        return None
    sizes = users[0].args[1]
    if not isinstance(sizes, (list, tuple)) or len(sizes) != 4 or sizes[2] != -1 or not isinstance(sizes[3], int):
        return None
    return sizes[3]


def _bias(linear: fx.Node) -> str | None:
    """The attribute path of a linear node's bias (None: no bias)."""
    bias = linear.args[2] if len(linear.args) > 2 else linear.kwargs.get("bias")
    return str(bias.target) if isinstance(bias, fx.Node) and bias.op == "get_attr" else None


class Identity(nn.Module):
    """Where a split block's collectives go (module docstring): the identity until the runtime replaces it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def local(tensor: torch.Tensor) -> torch.Tensor:
    """A sharded parameter's local part (a DTensor's `to_local`, differentiable), else the tensor."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if to_local is not None else tensor


def split_layer(
    layer: fx.GraphModule,
    block: GraphBlock,
    tp: int,
    shard: Callable[[torch.Tensor, int], nn.Parameter],
    sequence: bool = False,
) -> fx.GraphModule:
    """`layer`'s graph split over `tp` ranks (module docstring): its sharded tensors are `shard(dense, dim)` (this
    TP rank's part of the dense parameter along dim), every other parameter and buffer the layer's own object.
    `sequence`: with the sequence-parallel hooks too (module docstring), identities until the runtime fills them."""
    graph = copy.deepcopy(layer.graph)
    found = {name: nodes[0] for name, nodes in _linears(graph).items()}
    region = _between(graph, [found[n] for n in ATTENTION], found["o_proj"])
    for node in graph.nodes:  # the heads the export fixed as numbers, in the attention between q/k/v and o
        if node in region and node.op == "call_function" and node.target in _SIZED:
            node.args = (node.args[0], _local_sizes(node.args[1], block, tp), *node.args[2:])
    entered: dict[fx.Node, fx.Node] = {}
    for name in COLUMN:
        linear = found[name]
        source = linear.args[0]
        assert isinstance(source, fx.Node)
        if source not in entered:
            with graph.inserting_after(source):
                entered[source] = graph.call_module("tp_enter", (source,))
        linear.args = (entered[source], *linear.args[1:])
    for name in ROW:
        linear = found[name]
        with graph.inserting_after(linear):
            left = graph.call_module("tp_leave", (linear,))
        linear.replace_all_uses_with(left, delete_user_cb=lambda user, left=left: user is not left)
        if _bias(linear) is not None:  # a row-parallel bias is added once, to the sum
            bias = linear.args[2]
            linear.args = linear.args[:2]
            with graph.inserting_after(left):
                added = graph.call_function(torch.ops.aten.add.Tensor, (left, bias))
            left.replace_all_uses_with(added, delete_user_cb=lambda user, added=added: user is not added)
    for node in list(graph.nodes):  # a sharded tensor is read through its local part
        if node.op == "get_attr" and any(node.target == path for path, _ in block.split_tensors()):
            with graph.inserting_after(node):
                part = graph.call_function(local, (node,))
            node.replace_all_uses_with(part, delete_user_cb=lambda user, part=part: user is not part)
    attrs: dict[str, object] = {"tp_enter": Identity(), "tp_leave": Identity()}
    if sequence:
        _sequence_hooks(layer, graph, block)
        attrs.update({hook: Identity() for hook in SEQUENCE_HOOKS})
    for node in graph.nodes:
        if node.op in ("get_attr", "call_module") and node.target not in attrs:
            attrs[node.target] = _attribute(layer, str(node.target))
    for path, dim in block.split_tensors():
        attrs[path] = shard(layer.get_parameter(path), dim)
    out = fx.GraphModule(attrs, graph, class_name="SplitLayer")
    out.recompile()
    out.train(layer.training)
    return out


SEQUENCE_HOOKS = ("sp_scatter", "sp_gather", "sp_summed")
"""A sequence-parallel split's extra modules (module docstring): on the block's input, on its output, and on each
read of a parameter that is not sharded."""


def _sequence_hooks(layer: fx.GraphModule, graph: fx.Graph, block: GraphBlock) -> None:
    """Put SEQUENCE_HOOKS into a split graph: `sp_scatter` on its one input, `sp_gather` on its output, `sp_summed`
    on each read of a trainable parameter that is not sharded (a norm's weight, a row-parallel bias)."""
    (source,) = [node for node in graph.nodes if node.op == "placeholder"]
    with graph.inserting_after(source):
        share = graph.call_module("sp_scatter", (source,))
    source.replace_all_uses_with(share, delete_user_cb=lambda user: user is not share)
    output = next(node for node in graph.nodes if node.op == "output")
    result = output.args[0]
    assert isinstance(result, fx.Node)
    with graph.inserting_before(output):
        output.args = (graph.call_module("sp_gather", (result,)),)
    sharded = {path for path, _ in block.split_tensors()}
    for node in list(graph.nodes):
        if node.op != "get_attr" or node.target in sharded:
            continue
        param = _attribute(layer, str(node.target))
        if isinstance(param, nn.Parameter) and param.requires_grad:
            with graph.inserting_after(node):
                summed = graph.call_module("sp_summed", (node,))
            node.replace_all_uses_with(summed, delete_user_cb=lambda user, summed=summed: user is not summed)


def _attribute(module: nn.Module, path: str) -> object:
    """The object at a dotted attribute path of `module`."""
    for part in path.split("."):
        module = getattr(module, part)
    return module


def _between(graph: fx.Graph, starts: list[fx.Node], end: fx.Node) -> set[fx.Node]:
    """The nodes on a path from any of `starts` to `end` (their descendants that `end` depends on)."""
    below = _reached(starts, lambda node: node.users)
    above = _reached([end], lambda node: node.all_input_nodes)
    return below & above


def _reached(starts: Iterable[fx.Node], step: Callable[[fx.Node], Iterable[fx.Node]]) -> set[fx.Node]:
    """The nodes reached from `starts` by one or more `step`s (users: descendants; inputs: ancestors)."""
    reached: set[fx.Node] = set()
    todo = list(starts)
    while todo:
        for nxt in step(todo.pop()):
            if nxt not in reached:
                reached.add(nxt)
                todo.append(nxt)
    return reached


def _local_sizes(sizes: object, block: GraphBlock, tp: int) -> object:
    """A size list of the attention with its fixed head counts divided by tp (module docstring)."""
    if not isinstance(sizes, (list, tuple)) or -1 in sizes or len(sizes) < 3:
        return sizes
    out = list(sizes)
    if isinstance(out[1], int) and out[1] in (block.heads, block.kv_heads):
        out[1] //= tp
    elif isinstance(out[-1], int) and out[-1] in (block.heads * block.head_dim, block.kv_heads * block.head_dim):
        out[-1] //= tp
    return type(sizes)(out)


def check_split_graph(layer: fx.GraphModule, name: str, tp: int, where: str, sample: torch.Tensor) -> None:
    """That the captured block `layer` splits over `tp` ranks: tp divides its heads, key/value heads and MLP
    hidden size, and on `sample` (a batch of the block's input) its TP ranks' partial outputs of o and down sum to
    the dense block's (module docstring's Note).

    Raises:
        PlanError: one line naming the layer, the count or the check that fails, and the tp.
    """
    block = graph_block(layer)
    assert block is not None
    counts = (("attention heads", block.heads), ("key/value heads", block.kv_heads), ("MLP hidden size", block.hidden))
    for what, count in counts:
        if count % tp:
            raise PlanError(f"{where} has tp {tp}, which does not divide layer {name}'s {count} {what}: give the stage "
                            f"a tp that divides {block.heads} heads, {block.kv_heads} key/value heads and "
                            f"{block.hidden} hidden units")  # fmt: skip
    mode = layer.training
    layer.eval()
    try:
        with torch.no_grad():
            dense = split_layer(layer, block, 1, lambda t, _: nn.Parameter(t.detach().clone()))
            dense.tp_leave = _Record([])
            dense(sample)
            partials = [_Replay(dense.tp_leave.values) for _ in range(tp)]
            for rank, replay in enumerate(partials):
                part = split_layer(layer, block, tp, lambda t, d, r=rank: nn.Parameter(t.detach().chunk(tp, d)[r].clone()))
                part.tp_leave = replay
                part(sample)
    except RuntimeError as exc:
        raise PlanError(f"{where} has tp {tp} but layer {name}'s captured graph does not run split ({str(exc)[:120]}): "
                        "train it with tp 1") from None  # fmt: skip
    finally:
        layer.train(mode)
    for j, want in enumerate(dense.tp_leave.values):
        got = sum(replay.seen[j] for replay in partials)
        scale = (float(want.abs().max()) or 1.0) * 1e4 * torch.finfo(want.dtype).eps  # sums in another order
        if not isinstance(got, torch.Tensor) or float((got - want).abs().max()) > scale:
            raise PlanError(f"{where} has tp {tp} but layer {name}'s captured graph fixes its heads where the split "
                            "cannot follow (its TP ranks' parts do not sum to the block): train it with tp 1")  # fmt: skip


def check_sequence_graph(layer: fx.GraphModule, name: str, tp: int, where: str, sample: torch.Tensor) -> None:
    """That the captured block `layer` runs sequence-parallel over `tp` ranks: on `sample` (a batch of its input),
    each TP rank given its share of the sequence, the dense values where the gathers bring them (before q/k/v and
    gate/up) and its share of the dense values where the reduce-scatters do (after o and down) computes its share of
    the dense block's output and of each gathered input: what runs on the share (the norms, residual adds) works
    position by position. The heads' split is `check_split_graph`'s; a graph that passes both runs as the dense one.
    A tp that does not divide the sample's sequence length is the caller's to refuse (nothing is checked here).

    Raises:
        PlanError: one line naming the stage, the layer and the way out.
    """
    block = graph_block(layer)
    assert block is not None
    if sample.dim() < 2 or sample.shape[1] % tp:
        return
    whole = lambda t, _: nn.Parameter(t.detach().clone())  # noqa: E731
    mode = layer.training
    layer.eval()
    try:
        with torch.no_grad():
            dense = split_layer(layer, block, 1, whole, sequence=True)
            dense.tp_enter, dense.tp_leave = _Record([]), _Record([])
            want = dense(sample)
            pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
            for rank in range(tp):
                part = split_layer(layer, block, 1, whole, sequence=True)
                part.sp_scatter = _Share(tp, rank)
                part.tp_enter = _Replay(dense.tp_enter.values)
                part.tp_leave = _Replay([_share(v, tp, rank) for v in dense.tp_leave.values])
                pairs.append((part(sample), _share(want, tp, rank)))
                pairs += [(got, _share(v, tp, rank)) for got, v in zip(part.tp_enter.seen, dense.tp_enter.values, strict=True)]
    except RuntimeError as exc:
        raise PlanError(f"{where} has sequence_parallel true but layer {name}'s captured graph does not run on a share "
                        f"of the sequence ({str(exc)[:120]}): give that stage sequence_parallel false") from None  # fmt: skip
    finally:
        layer.train(mode)
    for got, want_share in pairs:
        scale = (float(want_share.abs().max()) or 1.0) * 1e4 * torch.finfo(want_share.dtype).eps
        if got.shape != want_share.shape or float((got - want_share).abs().max()) > scale:
            raise PlanError(f"{where} has sequence_parallel true but layer {name}'s captured graph mixes positions "
                            "outside its attention (its TP ranks' sequence shares do not compute the block's): give "
                            "that stage sequence_parallel false")  # fmt: skip


def _share(x: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    """TP rank `rank`'s contiguous share of `x` along the sequence (dimension 1, batch first), as the runtime takes it."""
    return x.chunk(tp, dim=1)[rank]


class _Share(nn.Module):
    """A TP rank's `sp_scatter` in the check: its share of the block's input."""

    def __init__(self, tp: int, rank: int) -> None:
        super().__init__()
        self.tp, self.rank = tp, rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _share(x, self.tp, self.rank)


class _Record(nn.Module):
    """The dense block's `leave`: keeps each value passing (the o and down outputs, in order)."""

    def __init__(self, values: list[torch.Tensor]) -> None:
        super().__init__()
        self.values = values

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.values.append(x)
        return x


class _Replay(nn.Module):
    """A TP rank's `leave` in the check: keeps its partial value, passes the dense one on."""

    def __init__(self, values: list[torch.Tensor]) -> None:
        super().__init__()
        self.values = values
        self.seen: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(x)
        return self.values[len(self.seen) - 1]
