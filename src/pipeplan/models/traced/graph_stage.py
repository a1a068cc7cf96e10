"""One pipeline stage of a branching model: the layers at positions [first, last] of a layer order, run as a graph.

A stage receives and sends ONE tensor per microbatch, as a chain's stage does,
so the transport and the schedules do not change: the tensors that cross a
cut (the live set after it, core.dag's rule, in position order) are each
flattened to (batch, -1) and concatenated on dimension 1; the receiver splits
them again by their known per-sample shapes (models.traced.graph.LayerGraph). A
tensor made before the stage and read after it is unpacked and packed again:
the stage forwards it. Packing and unpacking are autograd operations, so the
gradient of the received tensor is the packed gradient of every piece.
Everything else (saved state, B, the zero-bubble split, the seeding of each
layer call from an RngKey) is StageModule's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from pipeplan.core.errors import ProfileError
from pipeplan.models.stage import StageModule
from pipeplan.models.traced.graph import LayerGraph


def pack(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The tensors as one (batch, features) tensor: each flattened after the batch dimension, concatenated."""
    flat = [t.reshape(t.shape[0], -1) for t in tensors]
    return flat[0] if len(flat) == 1 else torch.cat(flat, dim=1)


def unpack(packed: torch.Tensor, shapes: Sequence[tuple[int, ...]]) -> list[torch.Tensor]:
    """The tensors `pack` made, given each one's shape after the batch dimension."""
    widths = [math.prod(shape) for shape in shapes]
    if packed.dim() != 2 or packed.shape[1] != sum(widths):
        raise ProfileError(f"a stage received shape {tuple(packed.shape)}, expected (batch, {sum(widths)})")
    # narrow, not split: each piece is a view of its own, which a layer may change in place (split's views may not be)
    starts = [sum(widths[:i]) for i in range(len(widths))]
    pieces = [packed.narrow(1, start, width) for start, width in zip(starts, widths, strict=True)]
    return [piece.reshape(packed.shape[0], *shape) for piece, shape in zip(pieces, shapes, strict=True)]


class GraphStage(StageModule):
    """The layers at positions [first, last] of `order`; input and output are the packed live sets (module docstring).

    The first stage receives the model's input as it is; the last one returns the model's output (then the loss).
    `module` holds the stage's layers in position order (its child i is the layer at position first + i).
    """

    def __init__(
        self,
        index: int,
        layers: Sequence[nn.Module],
        graph: LayerGraph,
        order: Sequence[int],
        first: int,
        last: int,
        is_last: bool,
        split_backward: bool,
    ) -> None:
        if sorted(order) != list(range(len(layers))):
            raise ProfileError(f"a layer order must list each of the model's {len(layers)} layers once, got {list(order)}")
        self.layer_ids = tuple(order[first : last + 1])
        super().__init__(index, [layers[i] for i in self.layer_ids], first == 0, is_last, split_backward, self.layer_ids)
        self.graph = graph
        self.received = graph.live_after(order, first - 1) if first > 0 else ()
        self.sent = () if is_last else graph.live_after(order, last)
        if is_last and last != len(order) - 1:
            raise ProfileError(f"stage {index} is the last but ends at position {last}, not at the model's output")
        for boundary, live in ((first - 1, self.received), (last, self.sent)):
            for layer in live:
                if not graph.dtypes[layer].is_floating_point:
                    raise ProfileError(
                        f"layer {graph.names[layer]!r} outputs {graph.dtypes[layer]}, which would cross the cut after "
                        f"position {boundary}: only floating-point tensors cross stages; cut elsewhere"
                    )
        self._layers = [layers[i] for i in self.layer_ids]

    def run(self, inputs: torch.Tensor) -> torch.Tensor:
        """The stage's layers on the received tensor; the packed live set after the stage (the last: the output)."""
        graph = self.graph
        values: dict[int, torch.Tensor] = {}
        if self.received:
            values.update(zip(self.received, unpack(inputs, [graph.shapes[i] for i in self.received]), strict=True))
        for layer_id, layer in zip(self.layer_ids, self._layers, strict=True):
            sources = graph.inputs[layer_id]
            self._seed(layer_id)
            values[layer_id] = layer(*(values[s] for s in sources)) if sources else layer(inputs)
        if self.is_last:
            return values[self.layer_ids[-1]]
        return pack([values[i] for i in self.sent])
