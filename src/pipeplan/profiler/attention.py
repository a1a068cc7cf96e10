"""Model attention as the fused kernel a GPU runs, for counting on the meta device.

On the meta device (shapes only, no data) torch runs scaled-dot-product
attention on its math path: it keeps the S×S score and probability matrices
for backward and its backward is four matrix products. A GPU runs a fused
(flash / memory-efficient) kernel instead, which keeps only the output and
one log-sum-exp per row, and recomputes the scores in backward (five
products). For a GPT-2 block at sequence 1024 the difference is most of its
saved bytes, so projecting onto a GPU counts attention through torch's fused
CPU kernel, which has the GPU kernels' memory and FLOP shape and a meta
implementation.

Note:
    Attention dropout is dropped inside the fused call: it is elementwise
    (no FLOPs) and a fused kernel keeps only its random seed, not a mask.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.nn import functional
from torch.overrides import TorchFunctionMode

_fused = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


class FusedAttentionMode(TorchFunctionMode):
    """Inside this mode, functional.scaled_dot_product_attention runs as one fused kernel (see the module docstring)."""

    def __torch_function__(
        self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if func is functional.scaled_dot_product_attention:
            fused = _fused_call(*args, **kwargs)
            if fused is not None:
                return fused
        return func(*args, **kwargs)


def _fused_call(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor | None:
    """The fused kernel's output, or None when the call is outside what it supports (GQA, non-4-D inputs)."""
    if enable_gqa or query.dim() != 4 or key.shape[1] != query.shape[1]:
        return None
    out, _logsumexp = _fused(query, key, value, 0.0, is_causal, attn_mask=attn_mask, scale=scale)
    return out
