"""Sequence parallelism on a tensor-parallel stage's blocks (Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", section 4.2.2): a SplitBlock (models.tp_block) whose norms, dropouts and
residual adds run on this TP rank's share of the sequence (dimension 1, batch first).

Megatron's g and f become, per column-then-row pair: an all-gather of the sequence before the column-parallel linear
(its backward a reduce-scatter: DTensor's ColwiseParallel with its input Shard(1), `SPLITS`), and a reduce-scatter of
the row-parallel linear's partial sums along the sequence (its backward an all-gather: `_ReduceScatter`, after
RowwiseParallel's Partial output, so a zero-bubble W needs no collective but the ones I ran). A run of consecutive
blocks of a chain stage keeps its activations sequence-sharded between them: the first takes its share of a whole
input (`_Scatter`: backward an all-gather), the last gathers its output whole (`_Gather`: backward its share of the
gradient, whole and the same on every TP rank), so every other layer and every transfer between stages sees whole
tensors, as without sequence parallelism. The norms' weight gradients, each rank's sum over its share of the
sequence, are all-reduced over the group in the backward (`SummedNorm`), so every TP rank holds the whole gradient.

A captured Llama-style block (models.traced.split_graph, split with its sequence hooks) runs the same way
(`sequence_graph`): `_GatherShares` before its column-parallel linears (all-gather; backward a reduce-scatter),
`_ReduceScatter` after its row-parallel ones, `SummedParameter` on each read of its RMSNorm weights (and any other
parameter not sharded), `_Scatter` / `_Gather` where a run of blocks starts / ends.

Note:
    What this adds to Megatron's per-block collectives (two all-gathers and two reduce-scatters of the block's
    activation each way, which a ring moves in the time of the two all-reduces they replace, as
    sim.cost.tensor_parallel prices them): one all-gather of the activation where a run of blocks ends (forward)
    and one where it starts (backward), and one all-reduce of each norm's weight and bias gradients (2 x width
    elements) per block and microbatch; the cost model prices them (sim.cost.tensor_parallel, the norms' latency only).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import fx, nn
from torch.distributed.tensor import Partial, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
from torch.nn import functional

from pipeplan.core.errors import PlanError
from pipeplan.models.tp_block import SplitBlock

SEQUENCE_DIM = 1
"""The sequence's dimension of a block's activation (batch first, as SplitBlock runs)."""

SPLITS = {
    "qkv": ColwiseParallel(input_layouts=Shard(SEQUENCE_DIM)),
    "out": RowwiseParallel(output_layouts=Partial()),
    "up": ColwiseParallel(input_layouts=Shard(SEQUENCE_DIM)),
    "down": RowwiseParallel(output_layouts=Partial()),
}
"""How a sequence-parallel SplitBlock's Linear layers shard: the column-parallel ones gather the sequence shares of
their input (DTensor's all-gather; backward a reduce-scatter), the row-parallel ones leave their partial sums to
`_ReduceScatter` (the block's `reduce`)."""


def sequence_parallel(block: SplitBlock, group: dist.ProcessGroup, enter: bool, leave: bool) -> None:
    """Make `block` (not yet sharded) sequence-parallel over `group`: its norms `SummedNorm`s, its `reduce` the
    reduce-scatter, and, where a run of sequence-parallel blocks starts (`enter`) or ends (`leave`), the input's share
    taken and the output gathered whole. Shard its linears with `SPLITS` after this."""
    block.norm1, block.norm2 = SummedNorm.of(block.norm1, group), SummedNorm.of(block.norm2, group)
    block.reduce = Collective(_ReduceScatter, group)
    if enter:
        block.enter = Collective(_Scatter, group)
    if leave:
        block.leave = Collective(_Gather, group)


def check_sequence(x: torch.Tensor, group: dist.ProcessGroup) -> None:
    """Raise PlanError unless the group's size divides the sequence length of a whole block input `x`."""
    t = dist.get_world_size(group)
    if x.dim() < 2 or x.shape[SEQUENCE_DIM] % t:
        length = x.shape[SEQUENCE_DIM] if x.dim() >= 2 else "no"
        raise PlanError(f"a sequence-parallel stage has tp {t}, which does not divide its blocks' sequence length "
                        f"{length}: give that stage sequence_parallel false, or a tp dividing {length}")  # fmt: skip


def _share(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """This rank's contiguous share of `x` along the sequence (the group's size divides it)."""
    t, rank = dist.get_world_size(group), dist.get_rank(group)
    return x.chunk(t, dim=SEQUENCE_DIM)[rank].contiguous()


def _all_gather(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """The group's sequence shares of one tensor, concatenated along the sequence in rank order."""
    t = dist.get_world_size(group)
    front = x.movedim(SEQUENCE_DIM, 0).contiguous()  # the collective concatenates along dimension 0
    whole = torch.empty((t * front.shape[0], *front.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_single(whole, front, group=group)
    return whole.movedim(0, SEQUENCE_DIM).contiguous()


def _reduce_scatter(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """The group's `x` summed, this rank's share of the sum along the sequence."""
    t = dist.get_world_size(group)
    front = x.movedim(SEQUENCE_DIM, 0).contiguous()
    share = torch.empty((front.shape[0] // t, *front.shape[1:]), dtype=x.dtype, device=x.device)
    dist.reduce_scatter_single(share, front, group=group)
    return share.movedim(0, SEQUENCE_DIM).contiguous()


class _Scatter(torch.autograd.Function):
    """A whole input (the same on every TP rank) to this rank's share; backward: the shares' gradients gathered."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        check_sequence(x, group)
        ctx.group = group
        return _share(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _all_gather(grad, ctx.group), None


class _Gather(torch.autograd.Function):
    """The shares gathered whole; backward: this rank's share of the whole gradient (the same on every TP rank)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return _all_gather(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _share(grad, ctx.group), None


class _ReduceScatter(torch.autograd.Function):
    """The row-parallel partial sums reduce-scattered along the sequence; backward: the shares' gradients gathered."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return _reduce_scatter(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _all_gather(grad, ctx.group), None


class _GatherShares(torch.autograd.Function):
    """The shares gathered whole before a captured block's column-parallel linears; backward: the TP ranks' partial
    gradients reduce-scattered along the sequence (DTensor's Shard(1) input of ColwiseParallel, for a split graph)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return _all_gather(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _reduce_scatter(grad, ctx.group), None


class _SummedGrad(torch.autograd.Function):
    """The identity on a norm's parameters; backward: their gradients all-reduced over the group (one call)."""

    @staticmethod
    def forward(ctx: Any, group: dist.ProcessGroup, *params: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.group = group
        return tuple(p.view_as(p) for p in params)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=ctx.group)
        return (None, *(part.view_as(g) for part, g in zip(flat.split([g.numel() for g in grads]), grads, strict=True)))


class SummedNorm(nn.LayerNorm):
    """A LayerNorm on a share of the sequence whose weight and bias gradients are summed over the TP group."""

    group: dist.ProcessGroup | None = None

    @classmethod
    def of(cls, norm: nn.Module, group: dist.ProcessGroup) -> SummedNorm:
        """A copy of the LayerNorm `norm` (its values, shape and eps) summing its gradients over `group`."""
        if type(norm) is not nn.LayerNorm:
            raise PlanError(f"a sequence-parallel block's norm is a {type(norm).__name__}, not a LayerNorm: give that "
                            "stage sequence_parallel false")  # fmt: skip
        made = cls(norm.normalized_shape, norm.eps, norm.elementwise_affine, norm.bias is not None,
                   device=norm.weight.device if norm.weight is not None else None,
                   dtype=norm.weight.dtype if norm.weight is not None else None)  # fmt: skip
        made.load_state_dict(norm.state_dict())
        made.group = group
        made.train(norm.training)
        return made

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        params = [p for p in (self.weight, self.bias) if p is not None]
        if params and self.group is not None and torch.is_grad_enabled():
            params = list(_SummedGrad.apply(self.group, *params))
        weight = params[0] if self.weight is not None else None
        bias = params[-1] if self.bias is not None else None
        return functional.layer_norm(x, self.normalized_shape, weight, bias, self.eps)


class SummedParameter(nn.Module):
    """A split graph's `sp_summed`: the parameter it reads, its gradient summed over the TP group in the backward."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        super().__init__()
        self.group = group

    def forward(self, param: torch.Tensor) -> torch.Tensor:
        return _SummedGrad.apply(self.group, param)[0] if torch.is_grad_enabled() else param


def sequence_graph(split: fx.GraphModule, group: dist.ProcessGroup, enter: bool, leave: bool) -> None:
    """Make a captured block's split graph (models.traced.split_graph, made with its sequence hooks) run
    sequence-parallel over `group`: the sequence gathered before its column-parallel linears and reduce-scattered
    after its row-parallel ones, its other parameters' gradients summed, and, where a run of sequence-parallel blocks
    starts (`enter`) or ends (`leave`), the input's share taken and the output gathered whole."""
    split.tp_enter, split.tp_leave = Collective(_GatherShares, group), Collective(_ReduceScatter, group)
    split.sp_summed = SummedParameter(group)
    if enter:
        split.sp_scatter = Collective(_Scatter, group)
    if leave:
        split.sp_gather = Collective(_Gather, group)


class Collective(nn.Module):
    """One of the sequence collectives over a TP group, as the module SplitBlock calls."""

    def __init__(self, function: type[torch.autograd.Function], group: dist.ProcessGroup) -> None:
        super().__init__()
        self.function, self.group = function, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.function.apply(x, self.group)
