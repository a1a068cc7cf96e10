"""Data-parallel replicas: one process group per pipeline rank, gradients all-reduced after the last backward, or
in buckets during it.

With a bucket size (GradSync's `bucket_bytes`, as PyTorch DDP's bucket_cap_mb) a stage's parameters are cut into
buckets as sim.cost.grad_buckets prices them: layer by layer from the stage's last, each bucket taking layers until
it holds the size or more. During the stage's last backward task each parameter's post-accumulate-grad hook marks it
final, and each bucket's all-reduce is launched once all of its parameters are, in bucket order (every copy launches
the same collectives in the same order); what the task left unlaunched (a parameter without a gradient, a W task
whose hooks did not fire) is launched right after it, in the same order.

Note:
    On an emulated network (runtime.transport.link_emulation) each all-reduce takes the emulated time of a ring over
    its devices in the plan's order: every participant sends its launch time (the trace's clock) in a tiny MAX
    all-reduce right behind the bucket's, so all of them know when the last one started; each computes the same
    end from that start (EmulatedLinks.ring_end) and holds the sums until then, as Wire.deliver holds a message.
    The emulation only delays: the bytes summed are the real all-reduce's. A stage's buckets go over the emulated ring
    one after another: a bucket starts at the later of its last participant's launch and the previous bucket's end.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.tensor import DTensor

from pipeplan.runtime.placement import Role, Topology
from pipeplan.runtime.rank_errors import RuntimeFault
from pipeplan.runtime.transport.link_emulation import Wire
from pipeplan.sim.cost.grad_buckets import fill_buckets


@dataclass(frozen=True, slots=True)
class AllReduceSpan:
    """One emulated all-reduce as every participant timed it: its stage, start and end (ms on the trace's clock), its
    bucket's bytes, the ring's time at the nominal rates (no trace) and which of the stage's buckets it is in the
    iteration (0: the first, or the only one)."""

    stage: int
    start_ms: float
    end_ms: float
    nbytes: int
    nominal_ms: float
    bucket: int = 0


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

    def wait(self, timeout: timedelta, after_ms: float = -math.inf) -> tuple[float, float]:
        """Wait for the last participant's start (or `after_ms`, the ring's previous bucket's end, when later), then
        until the emulated end; return (start, end) in trace ms."""
        self._work.wait(timeout)
        start = max(float(self._start[0]), after_ms)
        end = self.wire.links.ring_end(self.ring, self.nbytes, start)
        self.wire.deliver(end)
        return start, end


@dataclass(frozen=True, slots=True)
class Launched:
    """One launched all-reduce: its work, bucket and gradients, what it is (for a failure), its emulated timing, and
    the chain it goes over the ring in (the stage of a bucketed all-reduce, whose buckets run one after another;
    None: alone)."""

    work: Any
    bucket: torch.Tensor
    grads: list[torch.Tensor]
    what: str
    timing: RingTiming | None = None
    chain: int | None = None


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


def launch(
    params: Sequence[torch.Tensor], group: Any, what: str, wire: Wire | None, ring: tuple[int, ...], chain: int | None = None
) -> Launched:
    """Start the all-reduce (sum) of `params`' gradients (a missing one as zeros) in one flat bucket on `group`,
    without waiting; on an emulated network (`wire`) time it as a ring over `ring`'s devices (after the previous
    bucket of `chain`, when given)."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [local_tensor(p.grad) for p in params if p.grad is not None]
    bucket = flat_bucket(grads)
    work = dist.all_reduce(bucket, group=group, async_op=True)
    nbytes = bucket.numel() * bucket.element_size()
    timing = RingTiming(wire, ring, nbytes, group, bucket.device) if wire is not None else None
    return Launched(work, bucket, grads, what, timing, chain)


def finish_all(pending: Iterable[Launched], timeout: timedelta) -> list[tuple[float, float] | None]:
    """Wait for each launched all-reduce (and, emulated, for its end) and write its sums back into the gradients;
    return each one's emulated (start, end) in trace ms (None: the real network). A failed one is a RuntimeFault
    naming what it was.

    Raises:
        RuntimeFault: an all-reduce failed or timed out.
    """
    spans: list[tuple[float, float] | None] = []
    chain_end: dict[int, float] = {}  # each chain's last bucket's emulated end
    for one in pending:
        try:
            one.work.wait(timeout)
            span = None
            if one.timing is not None:
                after = chain_end.get(one.chain, -math.inf) if one.chain is not None else -math.inf
                span = one.timing.wait(timeout, after)
                if one.chain is not None:
                    chain_end[one.chain] = span[1]
            spans.append(span)
        except RuntimeError as exc:
            first = str(exc).splitlines()[0]
            raise RuntimeFault(f"{one.what} failed: {first}") from exc
        scatter_back(one.bucket, one.grads)
    return spans


def scatter_back(bucket: torch.Tensor, grads: Sequence[torch.Tensor]) -> None:
    """Copy the summed bucket back into the gradients it was made from."""
    for g, summed in zip(grads, _unflatten_dense_tensors(bucket, list(grads)), strict=True):
        g.copy_(summed)


def layer_buckets(layers: Sequence[nn.Module], params: Sequence[torch.Tensor], bucket_bytes: float) -> list[list[torch.Tensor]]:
    """`params` (a stage's trained parameters) cut as sim.cost.grad_buckets.fill_buckets cuts its layers: layer by
    layer from the last, each bucket taking layers until it holds `bucket_bytes` or more (a parameter two layers
    hold goes with the later); parameters no layer holds (or only layers holding no bytes) make a last bucket of
    their own."""
    wanted = {id(p) for p in params}
    seen: set[int] = set()
    owned: list[list[torch.Tensor]] = [[] for _ in layers]
    for position in range(len(layers) - 1, -1, -1):  # from the last: a parameter two layers hold goes with the later
        owned[position] = [p for p in layers[position].parameters() if id(p) in wanted and id(p) not in seen]
        seen.update(id(p) for p in owned[position])
    sizes = [float(sum(local_tensor(p).numel() * local_tensor(p).element_size() for p in own)) for own in owned]
    buckets = [[p for position in bucket for p in owned[position]] for bucket in fill_buckets(sizes, bucket_bytes)]
    placed = {id(p) for bucket in buckets for p in bucket}
    rest = [p for p in params if id(p) not in placed]
    if rest:
        buckets.append(rest)
    return buckets


@dataclass
class StageBuckets:
    """A stage's buckets (layer_buckets) and, during its last backward task, how many of each one's parameters are
    not final yet and how many buckets have been launched."""

    buckets: list[list[torch.Tensor]]
    waiting: list[int] = field(default_factory=list)
    launched: int = 0
    armed: bool = False
    handles: list[Any] = field(default_factory=list)


class GradSync:
    """All-reduce (sum) of a process's stage gradients over every copy of its stage.

    Every process must construct it (new_group is collective), in the same order. On a tensor-parallel stage each
    TP rank's copies form their own group (they hold the same shard). Gradients are summed, not averaged: each
    stage's loss is already scaled by 1 / global batch, so the sum is the gradient of the global mean loss. On an
    emulated network (`wire`) each stage's all-reduce is a ring over the stage's devices as the plan lists them.
    With `bucket_bytes` a stage whose layers were given (`use_buckets`) is all-reduced in buckets during its last
    backward task (module docstring); None: one flat bucket after it.
    """

    def __init__(
        self, topology: Topology, role: Role, timeout_s: float, wire: Wire | None = None, bucket_bytes: float | None = None
    ) -> None:
        self.bucket_bytes = bucket_bytes
        self._buckets: dict[int, StageBuckets] = {}
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

    def use_buckets(self, stage: int, layers: Sequence[nn.Module], params: Sequence[torch.Tensor]) -> None:
        """All-reduce local `stage`'s `params` in buckets of its `layers` (in position order) from hooks during its
        last backward task; nothing without `bucket_bytes` or without copies of the stage."""
        if self.group is None or self.bucket_bytes is None or not params or self.plan.zero >= 2:
            return
        state = StageBuckets(layer_buckets(layers, params, self.bucket_bytes))
        for k, bucket in enumerate(state.buckets):
            for p in bucket:
                state.handles.append(p.register_post_accumulate_grad_hook(functools.partial(self._final, stage, k)))
        self._buckets[stage] = state

    def begin(self) -> None:
        """An iteration begins: no stage's hooks launch anything until its last backward task (`arm`), whatever an
        iteration that failed left armed."""
        for state in self._buckets.values():
            state.armed = False

    def arm(self, stage: int) -> None:
        """Local `stage`'s last backward task begins: from now its parameters' hooks launch its buckets."""
        state = self._buckets.get(stage)
        if state is not None:
            state.waiting = [len(bucket) for bucket in state.buckets]
            state.launched, state.armed = 0, True

    def _final(self, stage: int, k: int, param: torch.Tensor) -> None:
        """A parameter of bucket k of `stage` has its gradient accumulated: launch the buckets now complete, in order."""
        state = self._buckets[stage]
        if state.armed:
            state.waiting[k] -= 1
            self._launch_ready(stage, state, everything=False)

    def _launch_ready(self, stage: int, state: StageBuckets, everything: bool) -> None:
        """Launch `stage`'s next buckets in order while they are complete (`everything`: all that are left)."""
        devices = self.plan.stages[stage].devices
        n = len(state.buckets)
        while state.launched < n and (everything or state.waiting[state.launched] <= 0):
            k = state.launched
            what = f"gradient all-reduce of stage {stage} (bucket {k} of {n}) over processes {list(self.members)}"
            self._pending.append((launch(state.buckets[k], self.group, what, self.wire, devices, chain=stage), stage))
            state.launched += 1

    def start(self, stage: int, params: Sequence[torch.Tensor]) -> None:
        """After local `stage`'s last backward task: launch the all-reduce of `params`' gradients (one flat bucket)
        without waiting, or, bucketed, the buckets its hooks did not launch."""
        if self.group is None or not params or self.plan.zero >= 2:
            return  # zero 2: the sharded optimizer's step reduce-scatters them (runtime.execution.sharded_state)
        state = self._buckets.get(stage)
        if state is not None:
            self._launch_ready(stage, state, everything=True)
            state.armed = False
            return
        what = f"gradient all-reduce of stage {stage} over processes {list(self.members)}"
        self._pending.append((launch(params, self.group, what, self.wire, self.plan.stages[stage].devices), stage))

    def finish(self) -> tuple[AllReduceSpan, ...]:
        """Wait for every launched all-reduce and write the sums back into the gradients; return the emulated ones'
        spans (none on the real network)."""
        spans = finish_all((one for one, _ in self._pending), self.timeout)
        out = []
        count: dict[int, int] = {}
        for (one, stage), span in zip(self._pending, spans, strict=True):
            k = count[stage] = count.get(stage, -1) + 1
            if span is not None and one.timing is not None:
                out.append(AllReduceSpan(stage, span[0], span[1], one.timing.nbytes, one.timing.nominal_ms, k))
        self._pending = []
        return tuple(out)
