"""How a device holds its stage's parameters: the bytes of weights, gradients, master copy and optimizer state per
parameter byte, unsharded and under ZeRO, and the bytes its data-parallel exchange moves.

A profile's `param_bytes` count each parameter once in the dtype of its master copy: the weights themselves when
they are the master (core.profile.ModelProfile.master_copy False, the runtime's float32 weights), else the 32-bit
master copy of 16-bit working weights (4 bytes per parameter). Per parameter byte a device then holds (Holding):

| profile | weights | gradients | master | fp32 main-grad copy | bytes per parameter with Adam |
|---|---:|---:|---:|---:|---:|
| master_copy false | 1 | 1 | 0 | 0 | 4 + 4 + 8 = 16 (of fp32 weights) |
| master_copy, main_grads "weights" | 1/2 | 1/2 | 1 | 0 | 2 + 2 + 4 + 8 = 16 (ZeRO's count) |
| master_copy, main_grads "fp32" | 1/2 | 1 | 1 | 0 | 2 + 4 + 4 + 8 = 18 (Megatron-LM, bf16) |
| master_copy, main_grads "fp32_copy" | 1/2 | 1/2 | 1 | 1 | 2 + 2 + 4 + 4 + 8 = 20 (Megatron-LM, fp16) |

plus the optimizer's state, optimizer_factor per parameter byte (Adam: 2). ZeRO over d copies shards the master copy,
the fp32 main-grad copy and the optimizer's state (ZeRO-1), and the gradients too (ZeRO-2); the working weights
stay whole. So ZeRO-1 holds w + g + (m + c + f) / d and ZeRO-2 w + (g + m + c + f) / d per parameter byte: with
Adam, 4 + 12/d and 2 + 14/d bytes per parameter for ZeRO's layout (Rajbhandari et al., "ZeRO", SC'20, Figure 1),
6 + 12/d and 4 + 16/d for Megatron-LM's bf16 and fp16 layouts under its distributed optimizer (NVIDIA/Megatron-LM
docs/source/distrib_optimizer.md), 8 + 8/d for fp32 weights. The data-parallel exchange (all-reduce, or
reduce-scatter and all-gather under ZeRO) moves the gradients the update reads in the dtype they are reduced in,
`grads` per parameter byte: 16-bit gradients are reduced in 16 bits (Megatron-LM's fp16 default), fp32 ones in 32.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeplan.core.profile import ModelProfile


@dataclass(frozen=True, slots=True)
class Holding:
    """Bytes a device holds per parameter byte of its stage before sharding (module docstring): the working weights,
    their gradients (also the bytes per parameter byte the data-parallel exchange moves), the master copy and the
    fp32 copy of 16-bit gradients the update reads; the optimizer's state is the cost model's optimizer_factor."""

    weights: float = 1.0
    grads: float = 1.0
    master: float = 0.0
    main_copy: float = 0.0

    def factor(self, optimizer_factor: float) -> float:
        """Bytes held per parameter byte without ZeRO: weights + gradients + master + fp32 copy + optimizer state."""
        return (self.weights + self.grads + self.master + self.main_copy) + optimizer_factor

    def sharded(self, param_bytes: float, optimizer_factor: float, zero: int, d: int) -> float:
        """A device's bytes for `param_bytes` of its stage under ZeRO `zero` (1 or 2) over d copies (module docstring)."""
        if zero >= 2:
            return param_bytes * (self.weights + (self.grads + self.master + self.main_copy + optimizer_factor) / d)
        return param_bytes * (self.weights + self.grads + (self.master + self.main_copy + optimizer_factor) / d)


PLAIN = Holding()
"""The weights are the master copy: weights and gradients in its dtype (master_copy false)."""

_MIXED = {
    "weights": Holding(0.5, 0.5, 1.0, 0.0),
    "fp32": Holding(0.5, 1.0, 1.0, 0.0),
    "fp32_copy": Holding(0.5, 0.5, 1.0, 1.0),
}


def holding(profile: ModelProfile) -> Holding:
    """How a device holds `profile`'s parameters (its master_copy and main_grads)."""
    return _MIXED[profile.main_grads] if profile.master_copy else PLAIN
