"""Data-parallel replicas: one process group per pipeline rank, gradients all-reduced after the last backward.

Note:
    On an emulated network (runtime.transport.link_emulation) each all-reduce takes the emulated time of a ring over
    its devices in the plan's order: every participant sends its launch time (the trace's clock) in a tiny MAX
    all-reduce right behind the bucket's, so all of them know when the last one started; each computes the same
    end from that start (EmulatedLinks.ring_end) and holds the sums until then, as Wire.deliver holds a message.
    The emulation only delays: the bytes summed are the real all-reduce's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.tensor import DTensor

from pipeplan.runtime.placement import Role, Topology
from pipeplan.runtime.rank_errors import RuntimeFault
from pipeplan.runtime.transport.link_emulation import Wire


@dataclass(frozen=True, slots=True)
class AllReduceSpan:
    """One emulated all-reduce as every participant timed it: its stage, start and end (ms on the trace's clock), its
    bucket's bytes and the ring's time at the nominal rates (no trace)."""

    stage: int
    start_ms: float
    end_ms: float
    nbytes: int
    nominal_ms: float


class RingTiming:
    """The emulated time of one launched all-reduce over `ring` (device ids, the plan's order): launches the MAX
    exchange of the participants' start times on `group` (collective: every participant, in the same order)."""

    def __init__(self, wire: Wire, ring: tuple[int, ...], nbytes: int, group: Any, device: torch.device) -> None:
        self.wire, self.ring, self.nbytes = wire, ring, nbytes
        self._start = torch.tensor([wire.now_ms()], dtype=torch.float64, device=device)
        self._work = dist.all_reduce(self._start, op=dist.ReduceOp.MAX, group=group, async_op=True)

    @property
    def nominal_ms(self) -> float:
        """The ring's time at the nominal rates (no trace)."""
        return self.wire.links.ring_parts(self.ring, self.nbytes)[0]

    def wait(self, timeout: timedelta) -> tuple[float, float]:
        """Wait for the last participant's start, then until the emulated end; return (start, end) in trace ms."""
        self._work.wait(timeout)
        start = float(self._start[0])
        end = self.wire.links.ring_end(self.ring, self.nbytes, start)
        self.wire.deliver(end)
        return start, end


@dataclass(frozen=True, slots=True)
class Launched:
    """One launched all-reduce: its work, bucket and gradients, what it is (for a failure), its emulated timing."""

    work: Any
    bucket: torch.Tensor
    grads: list[torch.Tensor]
    what: str
    timing: RingTiming | None = None


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This process's part of `tensor`: a DTensor's local shard (a tensor-parallel weight or its gradient, whose
    storage it shares), else the tensor itself."""
    if isinstance(tensor, DTensor):
        with torch.no_grad():
            return tensor.to_local()
    return tensor


def flat_bucket(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """One flat tensor holding every gradient (the bucket one all-reduce sums)."""
    return _flatten_dense_tensors(list(grads))


def launch(params: Sequence[torch.Tensor], group: Any, what: str, wire: Wire | None, ring: tuple[int, ...]) -> Launched:
    """Start the all-reduce (sum) of `params`' gradients (a missing one as zeros) in one flat bucket on `group`,
    without waiting; on an emulated network (`wire`) time it as a ring over `ring`'s devices."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [local_tensor(p.grad) for p in params if p.grad is not None]
    bucket = flat_bucket(grads)
    work = dist.all_reduce(bucket, group=group, async_op=True)
    nbytes = bucket.numel() * bucket.element_size()
    timing = RingTiming(wire, ring, nbytes, group, bucket.device) if wire is not None else None
    return Launched(work, bucket, grads, what, timing)


def finish_all(pending: Iterable[Launched], timeout: timedelta) -> list[tuple[float, float] | None]:
    """Wait for each launched all-reduce (and, emulated, for its end) and write its sums back into the gradients;
    return each one's emulated (start, end) in trace ms (None: the real network). A failed one is a RuntimeFault
    naming what it was.

    Raises:
        RuntimeFault: an all-reduce failed or timed out.
    """
    spans: list[tuple[float, float] | None] = []
    for one in pending:
        try:
            one.work.wait(timeout)
            spans.append(one.timing.wait(timeout) if one.timing is not None else None)
        except RuntimeError as exc:
            first = str(exc).splitlines()[0]
            raise RuntimeFault(f"{one.what} failed: {first}") from exc
        scatter_back(one.bucket, one.grads)
    return spans


def scatter_back(bucket: torch.Tensor, grads: Sequence[torch.Tensor]) -> None:
    """Copy the summed bucket back into the gradients it was made from."""
    for g, summed in zip(grads, _unflatten_dense_tensors(bucket, list(grads)), strict=True):
        g.copy_(summed)


class GradSync:
    """All-reduce (sum) of a process's stage gradients over every copy of its stage.

    Every process must construct it (new_group is collective), in the same order. On a tensor-parallel stage each
    TP rank's copies form their own group (they hold the same shard). Gradients are summed, not averaged: each
    stage's loss is already scaled by 1 / global batch, so the sum is the gradient of the global mean loss. On an
    emulated network (`wire`) each stage's all-reduce is a ring over the stage's devices as the plan lists them.
    """

    def __init__(self, topology: Topology, role: Role, timeout_s: float, wire: Wire | None = None) -> None:
        self.group: dist.ProcessGroup | None = None
        self.members: tuple[int, ...] = (role.process,)
        self.timeout = timedelta(seconds=timeout_s)
        self.wire = wire
        self.plan = topology.plan
        for r in range(topology.plan.num_ranks):
            for k in range(topology.plan.stages[r].tp):
                members = topology.stage_group(r, k)
                if len(members) > 1:
                    group = dist.new_group(list(members), timeout=self.timeout)
                    if (r, k) == (role.sched_rank, role.tp_rank):
                        self.group, self.members = group, members
        self._pending: list[tuple[Launched, int]] = []

    @property
    def active(self) -> bool:
        """True when the stage has more than one copy."""
        return self.group is not None

    def start(self, stage: int, params: Sequence[torch.Tensor]) -> None:
        """Launch the all-reduce of `params`' gradients (one flat bucket) without waiting."""
        if self.group is None or not params:
            return
        what = f"gradient all-reduce of stage {stage} over processes {list(self.members)}"
        self._pending.append((launch(params, self.group, what, self.wire, self.plan.stages[stage].devices), stage))

    def finish(self) -> tuple[AllReduceSpan, ...]:
        """Wait for every launched all-reduce and write the sums back into the gradients; return the emulated ones'
        spans (none on the real network)."""
        spans = finish_all((one for one, _ in self._pending), self.timeout)
        out = []
        for (one, stage), span in zip(self._pending, spans, strict=True):
            if span is not None and one.timing is not None:
                out.append(AllReduceSpan(stage, span[0], span[1], one.timing.nbytes, one.timing.nominal_ms))
        self._pending = []
        return tuple(out)
