"""Tensor-parallel stages: each TP group of a stage with tp > 1 as a DeviceMesh, its transformer blocks sharded with
DTensor (ColwiseParallel / RowwiseParallel) and its other layers run whole on every TP rank.

Every process of the job builds the whole model, then this: one process group per TP group (new_group is collective:
every process creates all of them, in the plan's order), and, on a TP stage's process, a SplitBlock
(models.tp_block) for each of its stages' zoo transformer blocks, sharded over its group's mesh, and a split graph
(models.traced.split_graph) for each captured Llama-style block: its projections DTensor shards on the mesh, read
through their local parts, Megatron's f and g all-reduces over the group (_Enter, _Leave); on a stage with
sequence_parallel true, its blocks run sequence-parallel (runtime.execution.sequence_parallel; a captured block
through its split graph's sequence hooks, `sequence_graph`): a run of consecutive blocks passes its sequence shares
between them, whole tensors at its ends, so a stage sends and receives whole activations (`_passes`). The executor
runs the returned layers. A layer that is no transformer block (an embedding, a head, a norm) runs replicated: its
input and its output's gradient are whole on every TP rank, so its gradients are the same on each (as the cost model
prices layers that do not split). Once a block is sharded, the model's own copy of what the shards hold is freed on
that process: each such parameter is replaced, in the model and its layers, by one of the same shape and dtype on
the meta device (not swapped in place: a captured model's parameters are weakly referenced by the export's
fake-tensor caches, which torch.utils.swap_tensors refuses), so a TP rank holds only its shard.
`TensorParallel.dense_values` gathers the trained shards whole in the model's layout (for state_dict), `read_dense`
shards a state's values again (after load_state_dict).

Note:
    The gradient norm counts each parameter once: a sharded one's local shard on every TP rank of the owning
    replica, a replicated one on its TP rank 0 (`counted`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import fx, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from pipeplan.core.errors import PlanError
from pipeplan.core.plan import Plan
from pipeplan.models.parameter_sharing import shared_parameters
from pipeplan.models.tp_block import SplitBlock, check_split, encoder_of, shard_block
from pipeplan.models.traced.graph import LayerGraph, consumers
from pipeplan.models.traced.split_graph import (
    GraphBlock,
    check_sequence_graph,
    check_split_graph,
    graph_block,
    split_layer,
)
from pipeplan.runtime.execution.sequence_parallel import SEQUENCE_DIM, sequence_graph, sequence_parallel
from pipeplan.runtime.execution.sequence_parallel import SPLITS as SEQUENCE_SPLITS
from pipeplan.runtime.options import check_tensor_parallel_plan
from pipeplan.runtime.placement import Role, Topology


def check_tensor_parallel(
    plan: Plan,
    layers: Sequence[nn.Module],
    names: Sequence[str] | None,
    graph: LayerGraph | None,
    sample: torch.Tensor | None = None,
) -> None:
    """What the runtime runs of a plan's tensor-parallel stages, checked on the model before any process group:
    the plan's own limits (runtime.options.check_tensor_parallel_plan), and each transformer block of a tp > 1
    stage one its tp divides (heads, key/value heads and MLP hidden size; a stage without one runs its layers
    replicated on every TP rank): a zoo encoder layer (models.tp_block) or a captured Llama-style block
    (models.traced.split_graph, run split on a sample of its input, `graph`'s shapes, in this process). A schedule
    with an I/W split runs too: W's gradients of a split layer need no collective but the ones I ran, in the same
    order on every TP rank. `names`: the layers' names for a message (None: their indices). A stage with
    sequence_parallel true runs it on its blocks (runtime.execution.sequence_parallel), whose sequence length
    (read from `sample`, a batch of the model's input, run through a chain's layers up to its last such block; from
    `graph`'s shapes for a graph) its tp must divide; a zoo block's norms must be LayerNorms, and a captured block
    must compute its share of the sequence position by position outside its attention (models.traced.split_graph's
    check_sequence_graph, on the same sample as its split's check).

    Raises:
        PlanError: one line naming the stage, the layer or the setting, and the way out.
    """
    check_tensor_parallel_plan(plan, PlanError)
    tp_stages = [(s, st) for s, st in enumerate(plan.stages) if st.tp > 1]
    if not tp_stages:
        return
    order = plan.layer_order if plan.layer_order is not None else range(len(layers))
    sequenced: dict[int, tuple[str, int]] = {}  # a sequence-parallel block -> (its stage's words, its tp)
    for s, stage in tp_stages:
        where = f"stage {s} (layers {stage.first_layer}..{stage.last_layer})"
        blocks = [i for i in order[stage.first_layer : stage.last_layer + 1] if splits(layers[i])]
        for i in blocks:  # a stage with none runs every layer whole on each TP rank, as the cost model prices it
            name = str(i) if names is None else names[i]
            taken = None
            if encoder_of(layers[i]) is not None:
                check_split(layers[i], name, stage.tp, where)
            else:
                taken = _sample(layers[i], i, name, graph, where)
                check_split_graph(layers[i], name, stage.tp, where, taken)
            if stage.sequence_parallel:
                _check_sequenced(layers[i], name, where, stage.tp, taken)
                sequenced[i] = (where, stage.tp)
    if sequenced:
        _check_sequence_lengths(layers, names, graph, sample, sequenced)
    _check_no_tied_weight(plan, layers, names, order)


def _check_sequenced(layer: nn.Module, name: str, where: str, tp: int, sample: torch.Tensor | None) -> None:
    """A block a sequence-parallel stage splits: a zoo encoder layer with LayerNorms, or a captured Llama-style
    block whose graph runs on a share of the sequence (models.traced.split_graph.check_sequence_graph, on `sample`,
    a batch of its input)."""
    found = encoder_of(layer)
    if found is None:
        assert isinstance(layer, fx.GraphModule) and sample is not None
        check_sequence_graph(layer, name, tp, where, sample)
        return
    if type(found[0].norm1) is not nn.LayerNorm or type(found[0].norm2) is not nn.LayerNorm:
        raise PlanError(f"{where} has sequence_parallel true and layer {name}'s norms are no LayerNorms: give that "
                        "stage sequence_parallel false")  # fmt: skip


@torch.no_grad()
def _check_sequence_lengths(
    layers: Sequence[nn.Module],
    names: Sequence[str] | None,
    graph: LayerGraph | None,
    sample: torch.Tensor | None,
    sequenced: dict[int, tuple[str, int]],
) -> None:
    """Each sequence-parallel block's tp divides its input's sequence length (dimension 1, batch first): the
    graph's per-sample shape of its input, or a chain's `sample` run through the layers before it (None: unchecked
    here; the block's first forward checks it)."""
    lengths: dict[int, int] = {}
    if graph is not None:
        for i in sequenced:
            shape = graph.shapes[graph.inputs[i][0]] if len(graph.inputs[i]) == 1 else ()
            if shape:
                lengths[i] = int(shape[0])
    elif sample is not None:
        x = sample
        for i in range(max(sequenced) + 1):
            if i in sequenced and x.dim() >= 2:
                lengths[i] = int(x.shape[SEQUENCE_DIM])
            x = layers[i](x)
    for i, length in sorted(lengths.items()):
        where, tp = sequenced[i]
        if length % tp:
            name = str(i) if names is None else names[i]
            raise PlanError(f"{where} has sequence_parallel true and tp {tp}, which does not divide layer {name}'s "
                            f"sequence length {length}: give that stage sequence_parallel false, or a tp dividing "
                            f"{length}")  # fmt: skip


def splits(layer: nn.Module) -> bool:
    """Whether the runtime splits `layer` on a tensor-parallel stage (a zoo encoder layer, or a captured
    Llama-style block); every other layer runs replicated."""
    return encoder_of(layer) is not None or graph_block(layer) is not None


def _sample(layer: nn.Module, i: int, name: str, graph: LayerGraph | None, where: str) -> torch.Tensor:
    """A batch of 2 of captured block i's one input (its source's per-sample shape and dtype), seeded."""
    sources = graph.inputs[i] if graph is not None else ()
    if len(sources) != 1:
        raise PlanError(f"{where} has tp > 1 and layer {name} reads {len(sources)} layers' outputs: the runtime splits "
                        "a captured block of one input; give the stage tp 1")  # fmt: skip
    assert graph is not None
    source = sources[0]
    device = next((p.device for p in layer.parameters() if not p.is_meta), torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    return torch.randn((2, *graph.shapes[source]), generator=generator, dtype=graph.dtypes[source]).to(device)


def _check_no_tied_weight(plan: Plan, layers: Sequence[nn.Module], names: Sequence[str] | None, order: Sequence[int]) -> None:
    """A parameter held by several layers (a tied embedding and head) must not touch a tp > 1 stage: its gradient
    sum over the holders does not yet follow TP ranks, so it is refused rather than run wrong."""
    labels = [str(i) for i in range(len(layers))] if names is None else list(names)
    stage_of = {layer: s for s, st in enumerate(plan.stages) for layer in order[st.first_layer : st.last_layer + 1]}
    for shared in shared_parameters(layers, labels):
        on_tp = [stage_of[i] for i in shared.layers if plan.stages[stage_of[i]].tp > 1]
        if on_tp:
            held = ", ".join(labels[i] for i in shared.layers)
            raise PlanError(f"stage {on_tp[0]} has tp {plan.stages[on_tp[0]].tp} and holds {shared.name!r}, a "
                            f"parameter tied over layers {held}: the runtime does not run a tied weight on a "
                            "tensor-parallel stage yet; untie it, or give that stage tp 1")  # fmt: skip


@dataclass
class TensorParallel:
    """This process's tensor-parallel blocks: layer index -> (the model's dense block, its SplitBlock), and its
    TP rank (0 when it runs no TP stage)."""

    blocks: dict[int, tuple[nn.Module, nn.Module]] = field(default_factory=dict)
    """layer index -> (the model's layer, freed; the module run in its place: a SplitBlock, or a split graph)"""
    graphs: dict[int, GraphBlock] = field(default_factory=dict)
    """The captured blocks among `blocks`: their projections (models.traced.split_graph)."""
    tp_rank: int = 0
    mesh: DeviceMesh | None = None

    def counted(self, params: Sequence[nn.Parameter]) -> list[nn.Parameter]:
        """Of `params` (this process's, of the owning replica), those whose gradient this process adds to the
        global norm: a sharded one's local shard everywhere, a replicated one on TP rank 0 only."""
        return [p for p in params if _sharded(p) or (self.tp_rank == 0 and not _sharded(p))]

    def dense_values(self) -> dict[int, torch.Tensor]:
        """id of each freed parameter of the model's blocks -> its trained value, gathered whole from the shards
        (collective over each TP group: every TP rank calls it)."""
        return {id(dense): full for i in self.blocks for dense, full in self.dense_pairs(i, _whole)}

    def dense_pairs(self, i: int, whole: Callable[[torch.Tensor], torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(the model's parameter, the split module's value of it, `whole(mine)` in the model's layout) for each
        parameter of layer i that the split module holds in its own tensors (a collective for a sharded one)."""
        dense, block = self.blocks[i]
        if i not in self.graphs:
            assert isinstance(block, SplitBlock)
            return block.dense_values(dense, whole)
        paths = [path for path, _ in self.graphs[i].split_tensors()]
        return [(dense.get_parameter(path), whole(block.get_parameter(path))) for path in paths]

    def dense_params(self, i: int) -> list[torch.Tensor]:
        """The parameters of the model's layer i whose values the split module holds in its own tensors (all of a
        SplitBlock's, a split graph's projections; its norms are the layer's own objects)."""
        dense, _ = self.blocks[i]
        if i not in self.graphs:
            return list(dense.parameters())
        return [dense.get_parameter(path) for path, _ in self.graphs[i].split_tensors()]

    @torch.no_grad()
    def read_dense(self, value: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Shard whole values into the split blocks (each TP rank takes its part); `value(param)`: the whole value
        of one of the model's (freed) block parameters."""
        for i, (dense, block) in self.blocks.items():
            if i not in self.graphs:
                assert isinstance(block, SplitBlock)
                block.read_dense(dense, _place, value)
            for path, _ in self.graphs[i].split_tensors() if i in self.graphs else ():
                _place(block.get_parameter(path), value(dense.get_parameter(path)))

    def free_dense(self, roots: Sequence[nn.Module]) -> None:
        """Free the model's parameters that the split modules hold (`dense_params`): in every module under `roots`
        (the model, its layers) each is replaced by a parameter of the same shape, dtype and requires_grad on the
        meta device, holding no storage; the originals go with their last reference."""
        meta = {id(p): p for i in self.blocks for p in self.dense_params(i) if not p.is_meta}
        made = {key: nn.Parameter(torch.empty_like(p, device="meta"), p.requires_grad) for key, p in meta.items()}
        for module in {id(m): m for root in roots for m in root.modules()}.values():
            for name, param in module._parameters.items():
                if param is not None and id(param) in made:
                    module._parameters[name] = made[id(param)]


def _sharded(param: torch.Tensor) -> bool:
    """Whether `param` is a DTensor sharded over its mesh (not replicated)."""
    return isinstance(param, DTensor) and any(p.is_shard() for p in param.placements)


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor gathered whole (a DTensor: over its mesh, a collective)."""
    return tensor.full_tensor().detach() if isinstance(tensor, DTensor) else tensor.detach()


def _place(mine: torch.Tensor, whole: torch.Tensor) -> None:
    """Put the whole tensor `whole` into `mine`: a DTensor's local shard takes its part (no communication)."""
    if isinstance(mine, DTensor):
        part = distribute_tensor(whole, mine.device_mesh, mine.placements, src_data_rank=None).to_local()
        mine.to_local().copy_(part)
    else:
        mine.copy_(whole)


def tensor_parallel_layers(
    layers: Sequence[nn.Module],
    topology: Topology,
    role: Role,
    device: torch.device,
    timeout_s: float,
    graph: LayerGraph | None = None,
) -> tuple[list[nn.Module], TensorParallel]:
    """The layers this process runs (its TP stages' blocks split and sharded, sequence-parallel on a stage with
    sequence_parallel true; every other layer the model's own) and what it holds of them. A collective: every
    process of the job calls it (it creates the TP groups). The caller frees the dense copies
    (`TensorParallel.free_dense`), in the model and its layers. `graph`: the model's layer graph (None: a chain,
    each layer on the one before's output); consecutive sequence-parallel blocks pass their shares (`_passes`).

    The caller has checked the plan against the model (`check_tensor_parallel`)."""
    plan = topology.plan
    out = list(layers)
    held = TensorParallel(tp_rank=role.tp_rank)
    timeout = timedelta(seconds=timeout_s)
    mine: dist.ProcessGroup | None = None
    for r in range(plan.num_ranks):
        if plan.stages[r].tp == 1:
            continue
        for group in topology.tp_groups(r):
            made = dist.new_group(list(group), timeout=timeout)
            if role.process in group:
                mine = made
                held.mesh = DeviceMesh.from_group(made, device.type, mesh=list(group))
    if mine is None or held.mesh is None:
        return out, held
    order = plan.layer_order if plan.layer_order is not None else range(len(layers))
    for s in role.stages:
        stage = plan.stages[s]
        mine_layers = list(order[stage.first_layer : stage.last_layer + 1])
        for j, i in enumerate(mine_layers):
            ends: tuple[bool, bool] | None = None  # a sequence-parallel block: (takes its share, gathers its output)
            if stage.sequence_parallel:
                before, after = mine_layers[j - 1] if j else None, mine_layers[j + 1] if j + 1 < len(mine_layers) else None
                ends = not _passes(layers, graph, before, i), not _passes(layers, graph, i, after)
            found = encoder_of(layers[i])
            if found is not None:
                dense, causal = found
                prepare = partial(sequence_parallel, group=mine, enter=ends[0], leave=ends[1]) if ends else None
                splits = SEQUENCE_SPLITS if stage.sequence_parallel else None
                out[i] = shard_block(dense, causal, stage.tp, held.mesh, device, layers[i].training, prepare, splits)
                held.blocks[i] = (dense, out[i])
            elif (captured := graph_block(layers[i])) is not None:
                out[i] = _split_graph(layers[i], captured, stage.tp, held.mesh, mine, device, ends)
                held.blocks[i], held.graphs[i] = (layers[i], out[i]), captured
    return out, held


def _passes(layers: Sequence[nn.Module], graph: LayerGraph | None, before: int | None, after: int | None) -> bool:
    """Whether block `before` hands its output to block `after` (the next on the same stage) as sequence shares:
    both split, and `after` the only reader of `before`'s output and `before` its only input (a chain: always)."""
    if before is None or after is None or not splits(layers[before]) or not splits(layers[after]):
        return False
    return graph is None or (tuple(graph.inputs[after]) == (before,) and list(consumers(graph.inputs)[before]) == [after])


def _split_graph(
    layer: nn.Module,
    captured: GraphBlock,
    tp: int,
    mesh: DeviceMesh,
    group: dist.ProcessGroup,
    device: torch.device,
    ends: tuple[bool, bool] | None,
) -> nn.Module:
    """A captured block split over its TP group: its projections sharded as DTensors on `mesh`, Megatron's f and g
    as all-reduces over `group` (models.traced.split_graph); `ends` (sequence parallelism: whether it takes its
    input's share, whether it gathers its output): the sequence's gathers and reduce-scatters in their place
    (runtime.execution.sequence_parallel.sequence_graph)."""

    def shard(dense: torch.Tensor, dim: int) -> nn.Parameter:
        part = distribute_tensor(dense.detach().to(device), mesh, [Shard(dim)], src_data_rank=None)
        return nn.Parameter(part, requires_grad=dense.requires_grad)

    assert isinstance(layer, fx.GraphModule)
    split = split_layer(layer, captured, tp, shard, sequence=ends is not None)
    if ends is None:
        split.tp_enter, split.tp_leave = _Collective(_Enter, group), _Collective(_Leave, group)
    else:
        sequence_graph(split, group, *ends)
    return split


class _Enter(torch.autograd.Function):
    """Megatron's f: the identity forward, the input's gradient all-reduced over the TP group."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        summed = grad.contiguous().clone()
        dist.all_reduce(summed, group=ctx.group)
        return summed, None


class _Leave(torch.autograd.Function):
    """Megatron's g: the TP ranks' partial outputs all-reduced, the gradient passed as it is."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        summed = x.contiguous().clone()
        dist.all_reduce(summed, group=group)
        return summed

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _Collective(nn.Module):
    """One of a split graph's collectives (_Enter or _Leave) over its TP group, as the module the graph calls."""

    def __init__(self, function: type[torch.autograd.Function], group: dist.ProcessGroup) -> None:
        super().__init__()
        self.function, self.group = function, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.function.apply(x, self.group)
