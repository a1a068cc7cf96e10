"""Dynamic loss scaling for fp16 training, decided once for the whole job: every rank skips or steps together.

fp16 keeps ~5 significant digits between 6e-5 and 65504: small gradients underflow to zero unless the loss is
multiplied by a large scale S before the backward; gradients are divided by S again before the optimizer step.
When any gradient on any rank came out inf or nan (S too large), the step is skipped and S halves; after
`growth_interval` clean steps in a row, S doubles (torch.amp.GradScaler's policy, with its defaults).

Note:
    torch.amp.GradScaler decides per process: a stage whose gradients overflowed would skip its step while the
    others stepped, and the stages would train different models from then on. Here one all-reduce (MAX) of each
    rank's overflow flag, over every rank of the job, makes the decision before any rank steps, so all ranks skip or
    step together and keep the same scale. S is a power of two, so scaling and unscaling are exact.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

INIT_SCALE = 2.0**16
GROWTH_FACTOR = 2.0
BACKOFF_FACTOR = 0.5
GROWTH_INTERVAL = 2000


class LossScaler:
    """The job's loss scale: the seed gradient of each microbatch's loss, the agreed overflow check, the update."""

    def __init__(self, init_scale: float = INIT_SCALE, growth_interval: int = GROWTH_INTERVAL) -> None:
        self.scale = float(init_scale)
        self.growth_interval = growth_interval
        self.clean_steps = 0
        self.skipped: list[int] = []
        """The steps (0-based, of this run) skipped for an overflow."""
        self._step = 0

    def seed(self, loss: torch.Tensor) -> torch.Tensor:
        """The gradient the backward of `loss` starts from: S instead of 1 (so every gradient is scaled by S)."""
        return torch.full_like(loss, self.scale)

    def step(self, optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor], injected: bool = False) -> bool:
        """Unscale `params`' gradients and step `optimizer`, unless a gradient on any rank is not finite; then update S.

        Collective: every rank of the default group calls it once per iteration. `injected` counts as an overflow
        here (tests). Returns True when the step was taken.
        """
        found = injected or any(p.grad is not None and not bool(torch.isfinite(p.grad).all()) for p in params)
        flag = torch.tensor([1.0 if found else 0.0], dtype=torch.float64)
        if dist.is_initialized():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        overflow = bool(flag.item())
        if overflow:
            self.skipped.append(self._step)
            self.scale *= BACKOFF_FACTOR
            self.clean_steps = 0
        else:
            inverse = 1.0 / self.scale
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(inverse)
            optimizer.step()
            self.clean_steps += 1
            if self.clean_steps == self.growth_interval:
                self.scale *= GROWTH_FACTOR
                self.clean_steps = 0
        self._step += 1
        return not overflow
