"""Tensor-parallel stages: each TP group of a stage with tp > 1 as a DeviceMesh, its transformer blocks sharded with
DTensor (ColwiseParallel / RowwiseParallel) and its other layers run whole on every TP rank.

Every process of the job builds the whole model, then this: one process group per TP group (new_group is
collective: every process creates all of them, in the plan's order), and, on a TP stage's process, a SplitBlock
(models.tp_block) for each of its stages' transformer blocks, sharded over its group's mesh. The executor runs the
returned layers. A layer that is no transformer block (an embedding, a head, a norm) runs replicated: its input and
its output's gradient are whole on every TP rank, so its gradients are the same on each (as the cost model prices
layers that do not split). Once a block is sharded, the model's own block on that process is freed: each of its
parameters keeps its identity, shape and dtype but moves to the meta device (torch.utils.swap_tensors), so a TP
rank holds only its shard. `TensorParallel.dense_values` gathers the trained shards whole in the model's layout
(for state_dict), `read_dense` shards a state's values again (after load_state_dict).

Note:
    The gradient norm counts each parameter once: a sharded one's local shard on every TP rank of the owning
    replica, a replicated one on its TP rank 0 (`counted`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from pipeplan.core.errors import PlanError
from pipeplan.core.plan import Plan
from pipeplan.models.parameter_sharing import shared_parameters
from pipeplan.models.tp_block import SplitBlock, check_split, encoder_of
from pipeplan.runtime.options import check_tensor_parallel_plan
from pipeplan.runtime.placement import Role, Topology

SPLITS = {"qkv": ColwiseParallel(), "out": RowwiseParallel(), "up": ColwiseParallel(), "down": RowwiseParallel()}
"""How SplitBlock's Linear layers shard: Megatron's column-then-row pairs (one all-reduce each in the forward)."""


def check_tensor_parallel(plan: Plan, layers: Sequence[nn.Module], names: Sequence[str] | None, graph: bool, split: bool) -> None:
    """What the runtime runs of a plan's tensor-parallel stages, checked on the model before any process group:
    the plan's own limits (runtime.options.check_tensor_parallel_plan), a chain (no graph) walked with whole
    backwards (`split` false), each tp > 1 stage holding at least one transformer block that its tp divides (heads
    and MLP hidden size). `names`: the layers' names for a message (None: their indices).

    Raises:
        PlanError: one line naming the stage, the layer or the setting, and the way out.
    """
    check_tensor_parallel_plan(plan, PlanError)
    tp_stages = [(s, st) for s, st in enumerate(plan.stages) if st.tp > 1]
    if not tp_stages:
        return
    s, first = tp_stages[0]
    if graph:
        raise PlanError(f"stage {s} has tp {first.tp} but the model is a graph: the runtime splits the blocks of a chain")
    if split:
        raise PlanError(f"stage {s} has tp {first.tp}: the runtime runs tensor-parallel stages with whole backwards; "
                        f"give the plan a schedule without an I/W split (schedule {plan.schedule!r})")  # fmt: skip
    order = plan.layer_order if plan.layer_order is not None else range(len(layers))
    for s, stage in tp_stages:
        where = f"stage {s} (layers {stage.first_layer}..{stage.last_layer})"
        blocks = [i for i in order[stage.first_layer : stage.last_layer + 1] if encoder_of(layers[i]) is not None]
        if not blocks:
            raise PlanError(f"{where} has tp {stage.tp} but none of its layers is a transformer block the runtime "
                            "splits (nn.TransformerEncoderLayer): give it tp 1")  # fmt: skip
        for i in blocks:
            check_split(layers[i], str(i) if names is None else names[i], stage.tp, where)
    _check_no_tied_weight(plan, layers, names, order)


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

    blocks: dict[int, tuple[nn.TransformerEncoderLayer, SplitBlock]] = field(default_factory=dict)
    tp_rank: int = 0
    mesh: DeviceMesh | None = None

    def counted(self, params: Sequence[nn.Parameter]) -> list[nn.Parameter]:
        """Of `params` (this process's, of the owning replica), those whose gradient this process adds to the
        global norm: a sharded one's local shard everywhere, a replicated one on TP rank 0 only."""
        return [p for p in params if _sharded(p) or (self.tp_rank == 0 and not _sharded(p))]

    def dense_values(self) -> dict[int, torch.Tensor]:
        """id of each freed parameter of the model's blocks -> its trained value, gathered whole from the shards
        (collective over each TP group: every TP rank calls it)."""
        return {id(dense): full for layer, block in self.blocks.values() for dense, full in block.dense_values(layer, _whole)}

    def read_dense(self, value: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Shard whole values into the split blocks (each TP rank takes its part); `value(param)`: the whole value
        of one of the model's (freed) block parameters."""
        for dense, block in self.blocks.values():
            block.read_dense(dense, _place, value)


def free_dense(module: nn.Module) -> None:
    """Free `module`'s parameters in place: each keeps its identity, shape, dtype and requires_grad (the model's
    modules and state_dict keys still name it) but now lives on the meta device, holding no storage."""
    for param in list(module.parameters()):
        if not param.is_meta:
            torch.utils.swap_tensors(param, nn.Parameter(torch.empty_like(param, device="meta"), param.requires_grad))


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
    layers: Sequence[nn.Module], topology: Topology, role: Role, device: torch.device, timeout_s: float
) -> tuple[list[nn.Module], TensorParallel]:
    """The layers this process runs (its TP stages' blocks split and sharded; every other layer the model's own)
    and what it holds of them. A collective: every process of the job calls it (it creates the TP groups).

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
        for i in order[stage.first_layer : stage.last_layer + 1]:
            found = encoder_of(layers[i])
            if found is None:
                continue
            dense, causal = found
            dense.to(device)
            block = SplitBlock(dense, causal, stage.tp).to(device)
            block.train(layers[i].training)
            out[i] = parallelize_module(block, held.mesh, dict(SPLITS))
            held.blocks[i] = (dense, block)
            free_dense(dense)  # the block's shards hold its weights now: the dense copy goes
    return out, held
