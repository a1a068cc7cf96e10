"""The one plan space every planner, the lower bound and exact enumerate: replica splits, microbatch sizes, schedules.

A plan of a request has rp pipeline replicas (rp divides the global batch; at most the device count, and 1 when the
request allows no replicated pipelines) and a microbatch size b dividing the replica's batch g / rp (the request's b
when it sets one), so m = g / (rp b) microbatches; its schedule is one of the registry's generated synchronous
schedules, kfkb with k in KFKB_GROUPS. Each planner walks a part of it, written as a filter here:

- the lower bound and the pipeplan search: every shape (shapes, microbatch_sizes);
- exact: every shape with its m (shapes_with_counts), the schedules EXACT_SCHEDULES;
- the baselines: powers of two (and the profile's batch) up to a microbatch count (baselines.rules), balanced's
  preferred order (baselines.balanced), PipeDream's multiples of its replica counts (baselines.pipedream);
- the replicated seeds: the splits of all devices into pipelines (full_splits).

Tensor parallelism (issue 34) is a dimension of the space, tensor_degrees, with the ZeRO stages 0..2: the
Megatron-style grid baseline (baselines.megatron) and pipeplan's search on profiles with split layers
(search.tensor_grid) walk it; every plan the other planners make has tp 1 and zero 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from pipeplan.planner.request import PlanRequest
from pipeplan.schedules.registry import ORDERED, PLANNABLE, TABLE


def divisors(n: int) -> list[int]:
    """Divisors of n, ascending."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def power_of_two(n: int) -> bool:
    """True for 1, 2, 4, ..."""
    return n > 0 and n & (n - 1) == 0


def replica_counts(request: PlanRequest) -> list[int]:
    """The pipeline-replica counts rp of the space, ascending: divisors of the global batch up to the device count
    (only 1 when the request allows no replicated pipelines)."""
    if not request.pipelines_allowed:
        return [1]
    return [rp for rp in divisors(request.global_batch) if rp <= request.cluster.num_devices]


def microbatch_sizes(request: PlanRequest, replica_batch: int, keep: Callable[[int], bool] | None = None) -> list[int]:
    """Microbatch sizes b of one pipeline replica's batch, ascending: the request's when it sets one (if it divides
    the batch), else the divisors of the batch that `keep` keeps (all without it)."""
    if request.microbatch_size is not None:
        return [request.microbatch_size] if replica_batch % request.microbatch_size == 0 else []
    sizes = divisors(replica_batch)
    return sizes if keep is None else [b for b in sizes if keep(b)]


def shapes(request: PlanRequest) -> list[tuple[int, int]]:
    """Every (pipeline replicas rp, microbatch size b) a plan of the request may have: rp ascending, then b."""
    return [(rp, b) for rp in replica_counts(request) for b in microbatch_sizes(request, request.global_batch // rp)]


def shapes_with_counts(request: PlanRequest) -> list[tuple[int, int, int]]:
    """shapes as (rp, microbatches m, microbatch size b): rp ascending, m descending."""
    return [(rp, request.global_batch // (rp * b), b) for rp, b in shapes(request)]


def full_splits(devices: int, global_batch: int) -> list[tuple[int, int]]:
    """(replicas rp, devices per pipeline) splitting all `devices` into equal pipelines, rp dividing the global
    batch: devices per pipeline ascending."""
    return [(devices // width, width) for width in divisors(devices) if global_batch % (devices // width) == 0]


TP_DEGREES = (1, 2, 4, 8)
"""The tensor-parallel degrees t the space holds, where they fit in a server (tensor_degrees)."""


def tensor_degrees(request: PlanRequest) -> list[int]:
    """The tensor-parallel degrees t of the space, ascending: [1] unless the profile has a layer that splits
    (LayerProfile.tp), else each t of TP_DEGREES that divides the smallest server's device count (a group stays on
    one server's fast links) and every split layer's width (core.layer_profile.TensorSplit); only the request's
    forced degree when it sets one (PlanRequest.tensor_parallel, checked against the widths there; a group may then
    span servers, which the plan's notes say: planner.search.tensor_grid.cross_server_notes)."""
    if request.tensor_parallel is not None:
        return [request.tensor_parallel]
    widths = {layer.tp.width for layer in request.profile.layers if layer.tp is not None}
    if not widths:
        return [1]
    per_node: dict[int, int] = {}
    for device in request.cluster.devices:
        per_node[device.node] = per_node.get(device.node, 0) + 1
    server = min(per_node.values())
    return [t for t in TP_DEGREES if server % t == 0 and all(w % t == 0 for w in widths)]


KFKB_GROUPS = (2, 3, 4)
"""The kfkb group sizes k the bound and exact try (k < m)."""
EXACT_SCHEDULES = (("1f1b", 1), ("zb-h1", 1), *(("kfkb", k) for k in KFKB_GROUPS), ("gpipe", 1))
"""(schedule, k) in the order exact tries them (a tie keeps the first)."""
EXACT_COVERED = tuple(n for n in PLANNABLE if TABLE[n].generator is not None and not TABLE[n].takes_chunks)
"""The schedules exact searches: every generated one of p stages (interleaving re-cuts a plan into chunk-stages)."""


def allows_order(schedule: str) -> bool:
    """Whether a request's schedule lets a planner write an explicit order: "auto" or an ordered one (list)."""
    return schedule == "auto" or schedule in ORDERED
