"""Optimizer state (a plan's zero 1) and gradients (zero 2) sharded over a stage's data-parallel group: each copy
steps one slice.

After the gradient all-reduce (runtime.execution.replicas.GradSync) every copy of a stage holds the same summed
gradients. A ShardedOptimizer lays this process's trained parameters (a tensor-parallel weight: its local shard) end
to end, one flat vector per dtype, and cuts it into d slices of ceil(n / d) elements, d the processes of the
stage's data-parallel group (placement.Topology.stage_group): copy i keeps the optimizer's state of slice i only,
steps that slice, and every copy all-gathers the stepped slices into its parameters. The optimizers it shards
(ELEMENTWISE) update each element from that element's gradient and state alone, so stepping a slice is stepping
those elements of the whole: the run's losses and weights are the unsharded run's.

Note:
    `state_dict()` gathers the state whole, in the format an unsharded optimizer over the same parameters gives
    (a collective over the group), so a checkpoint does not depend on the sharding; `load_state_dict()` keeps this
    process's slice of such a state. The gradient norm (whole_model.WholeModel.clip_grad_norm_) is unchanged: the
    gradients stay whole on every copy (zero 1 shards the optimizer's state, not the gradients).

    zero 2: GradSync does not all-reduce the stage's gradients; each copy accumulates its own microbatches' gradients
    whole through the iteration (torch's accumulation into .grad), and the step reduce-scatters them once, per dtype
    (one flat tensor padded to d x ceil(n / d)), keeps its slice and frees the whole gradients: between steps a copy
    holds n / d gradient elements and n / d of state; during the backward it holds the whole gradient as zero 1
    does (no bucketed reduce-scatter during the backward), so zero 2's saving here is between steps and at the
    update, not at the backward's peak. A gradient norm needs the summed gradients: clip_grad_norm_ under zero 2 is
    refused (distributed_pipeline.DistributedPipeline.clip_grad_norm_).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from pipeplan.core.errors import PlanError
from pipeplan.runtime.execution.replicas import GradSync, local_tensor

ELEMENTWISE: tuple[type[torch.optim.Optimizer], ...] = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)
"""The optimizers whose state shards by element (each element's update reads only its own gradient and state)."""

MakeOptimizer = Callable[[list[torch.Tensor]], torch.optim.Optimizer]
"""Builds the optimizer over a list of tensors (the same settings for the whole parameters or their slices)."""


@dataclass
class Bucket:
    """One dtype's trained parameters laid end to end (`total` elements) and this process's slice [lo, hi) of
    them, held as `shard` (the tensor its inner optimizer steps, filled from the parameters at each step and emptied
    after it: between steps a process holds its slice's state and nothing more); `chunk` = ceil(total / d), every
    slice's padded size."""

    params: list[torch.Tensor]
    total: int
    chunk: int
    lo: int
    hi: int
    shard: torch.Tensor

    def pieces(self) -> Iterator[tuple[torch.Tensor, int, int, int]]:
        """(parameter, start in its local tensor, start in the slice, length) of each part of the slice."""
        offset = 0
        for p in self.params:
            n = local_tensor(p).numel()
            lo, hi = max(self.lo, offset), min(self.hi, offset + n)
            if lo < hi:
                yield p, lo - offset, lo - self.lo, hi - lo
            offset += n

    def hold(self) -> None:
        """Give `shard` its slice's storage (filled by the caller)."""
        self.shard.set_(torch.empty(self.hi - self.lo, dtype=self.shard.dtype, device=self.shard.device))

    def release(self) -> None:
        """Empty `shard` (the same tensor, which keys the optimizer's state, without storage)."""
        self.shard.set_(torch.empty(0, dtype=self.shard.dtype, device=self.shard.device))


def bucket(params: Sequence[torch.Tensor], index: int, size: int) -> Bucket:
    """Slice `index` of `size` of `params` (one dtype) laid end to end."""
    total = sum(local_tensor(p).numel() for p in params)
    chunk = max(1, math.ceil(total / size))
    lo, hi = min(total, index * chunk), min(total, (index + 1) * chunk)
    first = local_tensor(params[0])
    shard = torch.zeros(hi - lo, dtype=first.dtype, device=first.device)
    return Bucket(list(params), total, chunk, lo, hi, shard)


class ShardedOptimizer(torch.optim.Optimizer):
    """An elementwise optimizer over `params` whose state is sharded over a data-parallel group (module docstring).

    Its `param_groups` are the whole parameters' (a learning rate set there reaches the slices at the next step);
    its `state` is what this process holds: its slices' state only.

    Args:
        make: builds the optimizer (one of ELEMENTWISE) over a list of tensors.
        params: this process's parameters, in the same order on every process of the group.
        group: the data-parallel group (every member holds the same parameters and, at each step, gradients).
        index: this process's position in the group; `size`: the group's processes.
        reduce: zero 2: the gradients are this process's own sums (not all-reduced); the step reduce-scatters them
            over the group, keeps this process's slice and frees the whole gradients (module docstring).

    Raises:
        PlanError: `make` builds an optimizer that is not elementwise.
    """

    def __init__(
        self, make: MakeOptimizer, params: Sequence[torch.Tensor], group: Any, index: int, size: int, reduce: bool = False
    ) -> None:
        self.group, self.index, self.size, self.reduce = group, index, size, reduce
        self.grad_held = 0  # elements of gradient this process held at its last step's update (zero 2: its slices)
        trained = [p for p in params if p.requires_grad]
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for p in trained:
            by_dtype.setdefault(local_tensor(p).dtype, []).append(p)
        self.buckets = [bucket(ps, index, size) for _, ps in sorted(by_dtype.items(), key=lambda item: str(item[0]))]
        self.inner = make([b.shard for b in self.buckets])
        check_elementwise(type(self.inner))
        for b in self.buckets:
            b.release()
        hyper = {k: v for k, v in self.inner.param_groups[0].items() if k != "params"}
        super().__init__([{"params": list(params), **hyper}], dict(self.inner.defaults))
        self.state = self.inner.state  # type: ignore[assignment]  # what this process holds: its slices' state

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """The one group of the whole parameters (made by the constructor); a further group is refused.

        Raises:
            PlanError: a group added after the constructor's.
        """
        if self.param_groups:
            raise PlanError("a sharded optimizer holds one parameter group (this process's parameters, sliced at its "
                            "construction): build it with every parameter, through DistributedPipeline.optimizer")  # fmt: skip
        super().add_param_group(param_group)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """Step this process's slices with the parameters' (all-reduced) gradients, then all-gather every slice
        into the parameters (a collective over the group)."""
        if closure is not None:
            raise PlanError("a sharded optimizer's step takes no closure (the pipeline computed the gradients)")
        for key, value in self.param_groups[0].items():
            if key != "params":
                self.inner.param_groups[0][key] = value
        self.grad_held = 0
        for b in self.buckets:
            b.hold()
            for p, at, start, n in b.pieces():
                b.shard[start : start + n].copy_(local_tensor(p).reshape(-1)[at : at + n])
            b.shard.grad = self._reduced(b) if self.reduce else self._own(b)
            self.grad_held += b.shard.grad.numel()
        self.inner.step()
        for b in self.buckets:
            b.shard.grad = None
            whole = self._gather(b, b.shard)
            b.release()
            offset = 0
            for p in b.params:
                local = local_tensor(p)
                local.copy_(whole[offset : offset + local.numel()].view_as(local))
                offset += local.numel()
        return None

    def _own(self, b: Bucket) -> torch.Tensor:
        """This process's slice of `b`'s (all-reduced) gradients."""
        grad = torch.zeros_like(b.shard)
        for p, at, start, n in b.pieces():
            if p.grad is not None:
                grad[start : start + n].copy_(local_tensor(p.grad).reshape(-1)[at : at + n])
        return grad

    def _reduced(self, b: Bucket) -> torch.Tensor:
        """zero 2: `b`'s gradients (this process's sums) laid end to end, padded to d slices, reduce-scattered over
        the group: this process's slice of the sum over every copy; the whole gradients are freed (set to None)."""
        flat = torch.zeros(b.chunk * self.size, dtype=b.shard.dtype, device=b.shard.device)
        offset = 0
        for p in b.params:
            n = local_tensor(p).numel()
            if p.grad is not None:
                flat[offset : offset + n].copy_(local_tensor(p.grad).reshape(-1))
                p.grad = None
            offset += n
        out = torch.empty(b.chunk, dtype=flat.dtype, device=flat.device)
        dist.reduce_scatter_tensor(out, flat, group=self.group)
        return out[: b.hi - b.lo].clone()

    def _gather(self, b: Bucket, part: torch.Tensor) -> torch.Tensor:
        """Every process's slice of `b` (`part`: this one's, shaped as its shard) laid end to end: total elements."""
        padded = torch.zeros(b.chunk, dtype=part.dtype, device=part.device)
        padded[: part.numel()].copy_(part)
        out = torch.empty(b.chunk * self.size, dtype=part.dtype, device=part.device)
        dist.all_gather_into_tensor(out, padded, group=self.group)
        return out[: b.total]

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        """The whole state, as an unsharded optimizer over the same parameters gives it (a collective over the group:
        every slice's state gathered)."""
        group = self.param_groups[0]
        index = {id(p): i for i, p in enumerate(group["params"])}
        state: dict[int, dict[str, Any]] = {}
        for b in self.buckets:
            mine = self.inner.state.get(b.shard, {})
            for key in sorted(mine):  # the same keys on every process: every slice is stepped at every step
                value = mine[key]
                if isinstance(value, torch.Tensor) and value.dim() == 1:
                    whole = self._gather(b, value)
                    offset = 0
                    for p in b.params:
                        n = local_tensor(p).numel()
                        state.setdefault(index[id(p)], {})[key] = whole[offset : offset + n].view_as(local_tensor(p)).clone()
                        offset += n
                else:
                    for p in b.params:
                        copied = value.clone() if isinstance(value, torch.Tensor) else value
                        state.setdefault(index[id(p)], {})[key] = copied
        hyper = {k: v for k, v in group.items() if k != "params"}
        return {"state": dict(sorted(state.items())), "param_groups": [{**hyper, "params": list(range(len(index)))}]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        """Keep this process's slices of a whole state (`state_dict()`'s, or an unsharded optimizer's over the same
        parameters).

        Raises:
            PlanError: a state of another number of parameters.
        """
        groups, per_param = state_dict["param_groups"], state_dict["state"]
        group = self.param_groups[0]
        count = sum(len(g["params"]) for g in groups)
        if len(groups) != 1 or count != len(group["params"]):
            raise PlanError(f"optimizer state holds {count} parameters in {len(groups)} group(s), this optimizer "
                            f"{len(group['params'])} in 1: load the state of an optimizer over the same parameters")  # fmt: skip
        hyper = {k: v for k, v in groups[0].items() if k != "params"}
        group.update(hyper)
        index = {id(p): i for i, p in enumerate(group["params"])}
        inner_state: dict[int, dict[str, Any]] = {}
        for j, b in enumerate(self.buckets):
            held = [per_param.get(index[id(p)], {}) for p in b.params]
            keys = next((sorted(h) for h in held if h), [])
            mine: dict[str, Any] = {}
            for key in keys:
                first = next(h[key] for h in held if key in h)
                if isinstance(first, torch.Tensor) and first.dim() >= 1:
                    parts = [h[key].reshape(-1) if key in h else torch.zeros(local_tensor(p).numel(), dtype=first.dtype)
                             for h, p in zip(held, b.params, strict=True)]  # fmt: skip
                    mine[key] = torch.cat(parts)[b.lo : b.hi].clone()
                else:
                    mine[key] = first.clone() if isinstance(first, torch.Tensor) else first
            if mine:
                inner_state[j] = mine
        inner_group = {**hyper, "params": list(range(len(self.buckets)))}
        self.inner.load_state_dict({"state": inner_state, "param_groups": [inner_group]})
        self.state = self.inner.state  # type: ignore[assignment]


def check_elementwise(kind: type[torch.optim.Optimizer]) -> None:
    """Raise PlanError unless optimizer class `kind` is one whose state shards by element (ELEMENTWISE)."""
    if kind not in ELEMENTWISE:
        names = ", ".join(f"torch.optim.{k.__name__}" for k in ELEMENTWISE)
        raise PlanError(f"plan zero 1 shards optimizer state by element: {kind.__name__} is not one of {names}; "
                        "use one of them, or a plan with zero 0")  # fmt: skip


def plan_optimizer(make: MakeOptimizer, params: Sequence[torch.Tensor], sync: GradSync, zero: int) -> torch.optim.Optimizer:
    """The optimizer of this process's `params` under a plan's `zero`: `make(params)` at zero 0 or where the stage has
    one copy (`sync` has no group), else its state sharded over the stage's data-parallel group."""
    if zero == 0 or sync.group is None:
        return make(list(params))
    index = sync.members.index(dist.get_rank())
    return ShardedOptimizer(make, params, sync.group, index, len(sync.members), reduce=zero >= 2)
