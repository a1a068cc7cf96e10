"""A transformer block split Megatron-style over a tensor-parallel group: the zoo's nn.TransformerEncoderLayer
(`transformer`, and charlm's causal blocks) as plain Linear layers the runtime shards with DTensor.

`SplitBlock` computes what the encoder layer computes (pre- or post-norm; self-attention, then the MLP), from four
Linear layers: `qkv` (column-parallel: each TP rank holds its heads' query, key and value rows), `out` (row-parallel:
its output all-reduced), `up` (column-parallel) and `down` (row-parallel). Its forward works on whatever the sharding
leaves it: `heads // tp` heads and `ffn // tp` hidden units (Shoeybi et al. 2019, Megatron-LM, Figure 3). The norms,
and the biases of `out` and `down`, are replicated.

With sequence parallelism (Korthikanti et al. 2022) the runtime sets three hooks, each the identity here: `enter`
(a whole input to this rank's share of the sequence), `reduce` (the row-parallel outputs' partial sums reduce-scattered
along the sequence) and `leave` (the sequence gathered whole again); the norms, dropouts and residual adds then run
on the sequence share, and the forward reads the sequence length from qkv's output (gathered whole by the sharding).

Note:
    The encoder layer's fused in-projection lists all query rows, then all key rows, then all value rows; a
    column-parallel split of that would hand TP rank 0 only queries. `qkv_rows` reorders the rows so that rank i's
    contiguous slice is its heads' [q_i; k_i; v_i] (Megatron's layout): one column-parallel linear, one all-reduce
    of its input's gradient in the backward. `read_dense` takes the encoder layer's weights in its own layout,
    `dense_values` gives them back in it (the runtime frees the encoder layer's own storage once it is split:
    runtime.execution.tp_layers).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, parallelize_module
from torch.nn import functional

from pipeplan.core.errors import PlanError

SPLITS = {"qkv": ColwiseParallel(), "out": RowwiseParallel(), "up": ColwiseParallel(), "down": RowwiseParallel()}
"""How SplitBlock's Linear layers shard: Megatron's column-then-row pairs (one all-reduce each in the forward)."""


def encoder_of(layer: nn.Module) -> tuple[nn.TransformerEncoderLayer, bool] | None:
    """The encoder layer a model layer is (the `transformer` spec's blocks) or wraps alone (charlm's CausalBlock:
    causal), with whether it attends causally; None for any other layer (it runs replicated on a TP stage)."""
    from pipeplan.models.zoo.charlm import CausalBlock

    if type(layer) is nn.TransformerEncoderLayer:
        return layer, False
    if type(layer) is CausalBlock and type(layer.layer) is nn.TransformerEncoderLayer:
        return layer.layer, True
    return None


def check_split(layer: nn.Module, name: str, tp: int, where: str) -> None:
    """That encoder layer `layer` splits over `tp` ranks: tp divides its heads and its MLP's hidden size, and its
    attention is a plain self-attention (query, key and value of the model's width, with biases).

    Raises:
        PlanError: one line naming the layer, its heads or hidden size and the tp.
    """
    found = encoder_of(layer)
    assert found is not None
    attention = found[0].self_attn
    if not attention._qkv_same_embed_dim or attention.in_proj_bias is None or attention.bias_k is not None:
        raise PlanError(f"{where} has tp {tp} but layer {name}'s attention has other key/value widths or no biases: "
                        "train it with tp 1")  # fmt: skip
    heads, hidden = attention.num_heads, found[0].linear1.out_features
    for what, count in (("attention heads", heads), ("MLP hidden size", hidden)):
        if count % tp:
            raise PlanError(
                f"{where} has tp {tp}, which does not divide layer {name}'s {count} {what}: give the stage a tp "
                f"that divides both {heads} heads and {hidden} hidden units"
            )


def qkv_rows(width: int, tp: int) -> torch.Tensor:
    """The rows of the encoder layer's in-projection (q, then k, then v, `width` rows each) in SplitBlock's order:
    TP rank i's contiguous slice holds its q, k and v rows (module docstring)."""
    part = width // tp
    return torch.cat([torch.arange(i * part, (i + 1) * part) + j * width for i in range(tp) for j in range(3)])


class SplitBlock(nn.Module):
    """An encoder layer's computation from column- and row-parallel Linear layers (module docstring); before the
    runtime shards it (tp ranks given), it computes the layer whole."""

    def __init__(self, layer: nn.TransformerEncoderLayer, causal: bool, tp: int) -> None:
        super().__init__()
        attention = layer.self_attn
        width = attention.embed_dim
        self.tp, self.causal, self.heads, self.norm_first = tp, causal, attention.num_heads, layer.norm_first
        self.head_dim = width // attention.num_heads
        self.attention_dropout = attention.dropout
        like = {"dtype": attention.in_proj_weight.dtype, "device": attention.in_proj_weight.device}
        self.qkv = nn.Linear(width, 3 * width, **like)
        self.out = nn.Linear(width, width, **like)
        self.up = nn.Linear(width, layer.linear1.out_features, **like)
        self.down = nn.Linear(layer.linear1.out_features, width, **like)
        self.norm1, self.norm2 = copy.deepcopy(layer.norm1), copy.deepcopy(layer.norm2)
        self.dropout, self.dropout1, self.dropout2 = layer.dropout, layer.dropout1, layer.dropout2
        self.activation = layer.activation
        self.enter: nn.Module = nn.Identity()
        self.reduce: nn.Module = nn.Identity()
        self.leave: nn.Module = nn.Identity()
        self.read_dense(layer)

    def _pairs(self, layer: nn.TransformerEncoderLayer) -> list[tuple[torch.Tensor, torch.Tensor, bool]]:
        """(this block's tensor, the encoder layer's, whether its rows are the in-projection's) for every weight."""
        attention = layer.self_attn
        return [
            (self.qkv.weight, attention.in_proj_weight, True), (self.qkv.bias, attention.in_proj_bias, True),
            (self.out.weight, attention.out_proj.weight, False), (self.out.bias, attention.out_proj.bias, False),
            (self.up.weight, layer.linear1.weight, False), (self.up.bias, layer.linear1.bias, False),
            (self.down.weight, layer.linear2.weight, False), (self.down.bias, layer.linear2.bias, False),
            *zip(self.norm1.parameters(), layer.norm1.parameters(), [False] * 2, strict=False),
            *zip(self.norm2.parameters(), layer.norm2.parameters(), [False] * 2, strict=False),
        ]  # fmt: skip

    @torch.no_grad()
    def read_dense(
        self,
        layer: nn.TransformerEncoderLayer,
        place: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
        value: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        """Take the encoder layer's weights: `place(mine, whole)` puts a whole tensor into one of this block's
        (sharded: its part), default a copy; `value(dense)` is the whole value of one of the layer's parameters
        (default: the parameter itself; a freed one, on the meta device, takes its value from a state_dict)."""
        rows = qkv_rows(self.qkv.in_features, self.tp)
        for mine, dense, reordered in self._pairs(layer):
            given = dense if value is None else value(dense)
            whole = given[rows] if reordered else given
            if place is None:
                mine.copy_(whole)
            else:
                place(mine, whole)

    @torch.no_grad()
    def dense_values(
        self, layer: nn.TransformerEncoderLayer, whole: Callable[[torch.Tensor], torch.Tensor]
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(the encoder layer's parameter, this block's value of it in the layer's layout) for each parameter;
        `whole(mine)` is a tensor of this block gathered whole (a collective over the TP group for a sharded one:
        every TP rank calls this)."""
        rows = qkv_rows(self.qkv.in_features, self.tp)
        out = []
        for mine, dense, reordered in self._pairs(layer):
            full = whole(mine)
            if reordered:
                ordered = torch.empty_like(full)
                ordered[rows] = full
                full = ordered
            out.append((dense, full))
        return out

    @torch.no_grad()
    def write_dense(self, layer: nn.TransformerEncoderLayer, whole: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Put this block's weights back into the encoder layer in its layout (`dense_values`; the layer's
        parameters must hold storage, not be freed)."""
        for dense, full in self.dense_values(layer, whole):
            dense.copy_(full)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.enter(x)
        if self.norm_first:
            x = x + self._attend(self.norm1(x))
            x = x + self._mlp(self.norm2(x))
        else:
            x = self.norm1(x + self._attend(x))
            x = self.norm2(x + self._mlp(x))
        return self.leave(x)

    def _attend(self, x: torch.Tensor) -> torch.Tensor:
        """Self-attention over this rank's heads (all of them before sharding: qkv's output width says which)."""
        qkv = self.qkv(x)
        batch, seq = qkv.shape[0], qkv.shape[1]  # the whole sequence (with sequence parallelism, x holds a share)
        heads = qkv.shape[-1] // (3 * self.head_dim)
        q, k, v = self._qkv(qkv, batch, seq, heads)
        p = self.attention_dropout if self.training else 0.0
        y = functional.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=self.causal)
        return self.dropout1(self.reduce(self.out(y.transpose(1, 2).reshape(batch, seq, heads * self.head_dim))))

    def _qkv(self, qkv: torch.Tensor, batch: int, seq: int, heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Query, key and value (batch, heads, seq, head_dim) from qkv's output: per TP rank held, [q; k; v]."""
        groups = self.tp if heads == self.heads else 1  # unsharded: tp groups of [q_i; k_i; v_i]; sharded: one
        parts = qkv.view(batch, seq, groups, 3, heads // groups, self.head_dim)
        q, k, v = (parts[:, :, :, j].reshape(batch, seq, heads, self.head_dim).transpose(1, 2) for j in range(3))
        return q, k, v

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout2(self.reduce(self.down(self.dropout(self.activation(self.up(x))))))


def shard_block(
    dense: nn.TransformerEncoderLayer,
    causal: bool,
    tp: int,
    mesh: DeviceMesh,
    device: torch.device,
    training: bool,
    prepare: Callable[[SplitBlock], None] | None = None,
    splits: dict[str, ParallelStyle] | None = None,
) -> SplitBlock:
    """The SplitBlock of encoder layer `dense` on `device`, sharded over `mesh` (`splits`, default SPLITS) in
    `training` mode: what a TP rank runs in its place (runtime.execution.tp_layers) and what the profiler times at
    each tp (profiler.split_timing). `prepare(block)` runs before the sharding (sequence parallelism's hooks:
    runtime.execution.sequence_parallel)."""
    dense.to(device)
    block = SplitBlock(dense, causal, tp).to(device)
    block.train(training)
    if prepare is not None:
        prepare(block)
    parallelize_module(block, mesh, dict(SPLITS if splits is None else splits))
    return block
