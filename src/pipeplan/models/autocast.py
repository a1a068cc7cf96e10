"""A run's compute precision in torch: the autocast context its forwards run under (core.precision names them)."""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager

import torch

COMPUTE_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
"""The 16-bit type each mixed precision computes in (core.precision.MIXED)."""


def autocast(precision: str, device: torch.device | str = "cpu") -> AbstractContextManager[object]:
    """torch.autocast in the precision's 16-bit type on `device`'s kind; nothing for `full` (compute in the dtype).

    Note:
        The profiler and the runtime both run their forwards (and the loss) under this one context, and their
        backwards outside it, as torch's own mixed-precision recipe does, so a profile measures the arithmetic a run
        performs.
    """
    if precision == "full":
        return contextlib.nullcontext()
    kind = torch.device(device).type
    return torch.autocast(kind, dtype=COMPUTE_DTYPES[precision])
