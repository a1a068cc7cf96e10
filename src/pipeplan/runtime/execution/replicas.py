"""Data-parallel replicas: one process group per pipeline rank, gradients all-reduced after the last backward."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from pipeplan.runtime.errors import RuntimeFault
from pipeplan.runtime.placement import Role, Topology


def flat_bucket(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """One flat tensor holding every gradient (the bucket one all-reduce sums)."""
    return _flatten_dense_tensors(list(grads))


def finish_all(pending: Iterable[tuple[Any, torch.Tensor, Sequence[torch.Tensor], str]], timeout: timedelta) -> None:
    """Wait for each launched all-reduce (work, bucket, its gradients, what it is) and write its sums back into the
    gradients; a failed one is a RuntimeFault naming what it was.

    Raises:
        RuntimeFault: an all-reduce failed or timed out.
    """
    for work, bucket, grads, what in pending:
        try:
            work.wait(timeout)
        except RuntimeError as exc:
            first = str(exc).splitlines()[0]
            raise RuntimeFault(f"{what} failed: {first}") from exc
        scatter_back(bucket, grads)


def scatter_back(bucket: torch.Tensor, grads: Sequence[torch.Tensor]) -> None:
    """Copy the summed bucket back into the gradients it was made from."""
    for g, summed in zip(grads, _unflatten_dense_tensors(bucket, list(grads)), strict=True):
        g.copy_(summed)


class GradSync:
    """All-reduce (sum) of a process's stage gradients over every copy of its stage.

    Every process must construct it (new_group is collective), in the same order.
    Gradients are summed, not averaged: each stage's loss is already scaled by
    1 / global batch, so the sum is the gradient of the global mean loss.
    """

    def __init__(self, topology: Topology, role: Role, timeout_s: float) -> None:
        self.group: dist.ProcessGroup | None = None
        self.members: tuple[int, ...] = (role.process,)
        self.timeout = timedelta(seconds=timeout_s)
        for r in range(topology.plan.num_ranks):
            members = topology.stage_group(r)
            if len(members) > 1:
                group = dist.new_group(list(members), timeout=self.timeout)
                if r == role.sched_rank:
                    self.group, self.members = group, members
        self._pending: list[tuple[object, torch.Tensor, list[torch.Tensor], int]] = []

    @property
    def active(self) -> bool:
        """True when the stage has more than one copy."""
        return self.group is not None

    def start(self, stage: int, params: Sequence[torch.Tensor]) -> None:
        """Launch the all-reduce of `params`' gradients (one flat bucket) without waiting."""
        if self.group is None or not params:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        bucket = flat_bucket(grads)
        work = dist.all_reduce(bucket, group=self.group, async_op=True)
        self._pending.append((work, bucket, grads, stage))

    def finish(self) -> None:
        """Wait for every launched all-reduce and write the sums back into the gradients."""
        members = list(self.members)
        finish_all(((w, b, g, f"gradient all-reduce of stage {stage} over processes {members}") for w, b, g, stage in
                    self._pending), self.timeout)  # fmt: skip
        self._pending = []
