"""FLOPs and bytes moved per layer: the work a roofline projection divides by a GPU's peak rates.

FLOPs come from `torch.utils.flop_counter.FlopCounterMode`: 2 FLOPs per
multiply-add of the matrix products (mm, addmm, bmm, baddbmm, convolutions,
scaled-dot-product attention). Elementwise work — layer norm, softmax, GELU,
dropout, additions — is *not* counted; it is memory-bound and the bytes term
of the roofline covers it. Attention is counted over the full S×S score
matrix (a causal mask does not halve it), forward as two products (QKᵀ and
scores·V). Backward depends on the kernel that ran: fused (flash) kernels
recompute the scores and count five products (QKᵀ, dV, dP, dQ, dK), as
torch counts its CUDA kernels; the math path (on the CPU when attention
dropout is on) keeps the scores and counts four.

Bytes moved is a documented lower bound — the traffic of a layer run as one
fused kernel that touches each tensor once:
    forward  = param_bytes + input_bytes + output_bytes
    backward = 2·param_bytes (read weights, write gradients) + saved_bytes
               + output_bytes (the incoming gradient)
               + input_bytes when the input needs a gradient (written).
Unfused eager execution moves more (intermediates round-trip through
memory); that is what the efficiency factor of the projection absorbs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from pipeplan.core.checks import check_nonneg_int
from pipeplan.core.errors import ProfileError

aten = torch.ops.aten


@dataclass(frozen=True, slots=True)
class LayerWork:
    """FLOPs, bytes moved and kernels launched by one layer for one batch, forward and backward separately."""

    name: str
    fwd_flops: int
    bwd_flops: int
    fwd_bytes: int
    bwd_bytes: int
    fwd_kernels: int = 0
    bwd_kernels: int = 0

    def __post_init__(self) -> None:
        for field in ("fwd_flops", "bwd_flops", "fwd_bytes", "bwd_bytes", "fwd_kernels", "bwd_kernels"):
            check_nonneg_int(ProfileError, f"layer {self.name!r} {field}", getattr(self, field))

    @property
    def flops(self) -> int:
        """Forward plus backward FLOPs."""
        return self.fwd_flops + self.bwd_flops

    @property
    def bytes_moved(self) -> int:
        """Forward plus backward bytes moved."""
        return self.fwd_bytes + self.bwd_bytes


def attention_flops(query: Sequence[int], key: Sequence[int], value: Sequence[int]) -> int:
    """Forward FLOPs of softmax(QKᵀ)V for (batch, heads, seq, dim) shapes: 2·b·h·Sq·Sk·(d_qk + d_v)."""
    b, h, s_q, d_qk = query
    s_k, d_v = key[2], value[3]
    return 2 * b * h * s_q * s_k * (d_qk + d_v)


def attention_backward_flops(query: Sequence[int], key: Sequence[int], value: Sequence[int]) -> int:
    """Backward FLOPs of attention: recomputed QKᵀ, then dV, dP, dQ and dK: 2·b·h·Sq·Sk·(3·d_qk + 2·d_v)."""
    b, h, s_q, d_qk = query
    s_k, d_v = key[2], value[3]
    return 2 * b * h * s_q * s_k * (3 * d_qk + 2 * d_v)


def _cpu_attention(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return attention_flops(query, key, value)


def _cpu_attention_backward(
    grad_out: Any, query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any
) -> int:
    return attention_backward_flops(query, key, value)


# torch's table covers the CUDA attention kernels but not the CPU flash kernel: without these two entries a
# transformer profiled on a laptop would show no attention FLOPs at all.
CPU_ATTENTION_FORMULAS: dict[Any, Any] = {
    aten._scaled_dot_product_flash_attention_for_cpu: _cpu_attention,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_attention_backward,
}


class KernelCounter(TorchDispatchMode):
    """Counts the operators that launch a kernel: every aten call whose first result is not a view of an input.

    Views, transposes and detaches only change metadata (no kernel); every
    other operator launches at least one kernel in eager execution, so the
    count times a launch floor bounds a layer's time below however small its
    batch (the projection's kernel floor).
    """

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        returns = func._schema.returns
        if not (returns and returns[0].alias_info is not None):
            self.count += 1
        return func(*args, **(kwargs or {}))


def flop_counter() -> FlopCounterMode:
    """A silent FlopCounterMode that also knows the CPU attention kernels."""
    return FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION_FORMULAS)


def bytes_moved(
    param_bytes: int, input_bytes: int, output_bytes: int, saved_bytes: int, input_needs_grad: bool
) -> tuple[int, int]:
    """(forward, backward) bytes moved by a layer under the fused lower-bound model of the module docstring."""
    fwd = param_bytes + input_bytes + output_bytes
    bwd = 2 * param_bytes + saved_bytes + output_bytes + (input_bytes if input_needs_grad else 0)
    return fwd, bwd
