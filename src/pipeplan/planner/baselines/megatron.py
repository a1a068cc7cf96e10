"""`megatron`: the plan Megatron-LM users write for a t x p x d grid, and the grid search they run over it.

A grid point (Narayanan et al., SC'21, section 3) is a tensor-parallel degree t, p pipeline stages, d data-parallel
copies of the pipeline (t p d devices), a microbatch size b and v model chunks per stage:

- layers: uniform per stage. For an analytic GPT profile (presets.gpt_profile) the units are transformer blocks
  (its attention and MLP layers together); when p v divides the blocks each chunk gets l / (p v) of them, the
  embedding joins the first and the head the last (Megatron-LM's rule); when it does not, the embedding and the
  head count as one block each and the l + 2 units split as evenly as they can, the larger parts first
  (Megatron-DeepSpeed's `type:transformer|embedding`, which BLOOM-176B ran at 70 blocks over 12 stages). Any other
  profile's units are its layers, split as evenly as they can.
- devices: Megatron-LM's rank order, tensor-parallel rank fastest, then data-parallel, then pipeline: the group of
  stage s in copy i is the t devices at positions t (i + d s) .. t (i + d s) + t - 1 of the cluster's devices in
  server order, so with t dividing the server size every group is inside one server.
- schedule: 1F1B (v = 1) or interleaved 1F1B (v > 1, the registry's `interleaved-1f1b`, which needs m a multiple
  of p); `zero` 1 adds the distributed optimizer (ZeRO-1) where d > 1; no sequence parallelism (SC'21 had none).

The grid search (plan_megatron): every t of planner.plan_space.tensor_degrees (dividing the server size and every
split width), every p dividing the blocks or the blocks + 2 (or, for another profile, its layers) with t p dividing
the devices, d = devices / (t p) dividing the global batch, v in CHUNKS where p > 1 and the blocks split evenly, and
b among the baselines' microbatch sizes (baselines.rules: powers of two); the fastest simulated plan that fits
memory wins, the first in that order on ties.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from pipeplan.core.errors import PipeplanError, PlanError
from pipeplan.core.plan import Plan, Stage
from pipeplan.core.profile import ModelProfile
from pipeplan.planner.baselines.rules import microbatch_sizes
from pipeplan.planner.plan_space import divisors, tensor_degrees
from pipeplan.planner.request import PlanRequest, PlanResult
from pipeplan.planner.simulated import evaluate
from pipeplan.sim.cost.plan_costs import plan_costs

CHUNKS = (1, 2)
"""The model chunks per stage v the grid search tries (1: 1F1B; 2: interleaved 1F1B)."""


@dataclass(frozen=True, slots=True)
class GridPoint:
    """One point of the grid: tensor-parallel degree `tp`, `pp` stages, `dp` copies, microbatch size `micro`,
    `chunks` v per stage and ZeRO stage `zero` (0 or 1)."""

    tp: int
    pp: int
    dp: int
    micro: int
    chunks: int = 1
    zero: int = 0


def _units(profile: ModelProfile) -> tuple[int, bool]:
    """(the units a stage holds whole, whether they are blocks): an analytic GPT profile's transformer blocks (its
    layers are the embedding, attention.i / mlp.i pairs and the head), else every layer."""
    names = [layer.name for layer in profile.layers]
    blocks = (len(names) - 2) // 2
    gpt = (
        len(names) >= 4
        and names[0] == "embedding"
        and names[-1] == "head"
        and names[1:-1] == [f"{kind}.{i}" for i in range(blocks) for kind in ("attention", "mlp")]
    )
    return (blocks, True) if gpt else (len(names), False)


def _even(total: int, parts: int) -> list[int]:
    """`total` split into `parts` sizes differing by at most one, the larger first."""
    q, r = divmod(total, parts)
    return [q + 1] * r + [q] * (parts - r)


def stage_bounds(profile: ModelProfile, parts: int) -> list[tuple[int, int]]:
    """The (first, last) layers of each of `parts` chunk-stages under the module's uniform rule.

    Raises:
        PlanError: more parts than units to split.
    """
    units, gpt = _units(profile)
    if not gpt:
        sizes = _even(units, parts)
    elif units % parts == 0:
        sizes = [2 * (units // parts)] * parts
        sizes[0] += 1
        sizes[-1] += 1
    else:
        # The embedding and the head count as one block each: a unit of one layer against a block's two.
        counts = _even(units + 2, parts)
        sizes = [2 * c for c in counts]
        sizes[0] -= 1
        sizes[-1] -= 1
    if parts > units + (2 if gpt else 0) or min(sizes) < 1:
        raise PlanError(f"megatron: {parts} stages are more than the profile's {units} units to split")
    bounds, first = [], 0
    for size in sizes:
        bounds.append((first, first + size - 1))
        first += size
    return bounds


def server_order(request: PlanRequest) -> list[int]:
    """The cluster's device ids in server order (node, then id)."""
    return [d.id for d in sorted(request.cluster.devices, key=lambda d: (d.node, d.id))]


def megatron_plan(request: PlanRequest, point: GridPoint) -> Plan:
    """The plan of one grid point (module note): uniform stages, Megatron-LM's device order, 1F1B or interleaved.

    Raises:
        PlanError: the grid does not fit the devices, the batch or the profile (naming which).
    """
    t, p, d, b, v = point.tp, point.pp, point.dp, point.micro, point.chunks
    devices = server_order(request)
    if t * p * d > len(devices):
        raise PlanError(f"megatron: t x p x d = {t} x {p} x {d} needs {t * p * d} devices, the cluster has {len(devices)}")
    if request.global_batch % (d * b):
        raise PlanError(f"megatron: global batch {request.global_batch} is no multiple of d x b = {d} x {b}")
    microbatches = request.global_batch // (d * b)
    if v > 1 and (p == 1 or microbatches % p):
        raise PlanError(f"megatron: interleaving (v {v}) needs p > 1 and m a multiple of p, got p {p}, m {microbatches}")
    bounds = stage_bounds(request.profile, p * v)
    groups = [
        tuple(devices[t * (i + d * s) + k] for i in range(d) for k in range(t)) for s in range(p)
    ]  # stage s: copy i's group of t, copy-major
    stages = tuple(Stage(first, last, groups[c % p], tp=t) for c, (first, last) in enumerate(bounds))
    schedule = "interleaved-1f1b" if v > 1 else "1f1b"
    zero = point.zero if d > 1 else 0
    return Plan(stages, d, microbatches, b, schedule, chunks=v, zero=zero)


def grid(request: PlanRequest, zero: int = 0) -> list[GridPoint]:
    """The grid points of the search, in its order: t, then p, then v, then b ascending (module note)."""
    units, gpt = _units(request.profile)
    devices = request.cluster.num_devices
    depths = sorted(set(divisors(units)) | (set(divisors(units + 2)) if gpt else set()))
    points = []
    for t in tensor_degrees(request):
        for p in depths:
            if devices % (t * p):
                continue
            d = devices // (t * p)
            if request.global_batch % d or (d > 1 and not request.pipelines_allowed):
                continue
            chunks = [v for v in CHUNKS if v == 1 or (p > 1 and units % (p * v) == 0)]
            for v in chunks:
                for b in sorted(microbatch_sizes(request, request.global_batch // d)):
                    if v > 1 and (request.global_batch // (d * b)) % p:
                        continue
                    points.append(GridPoint(t, p, d, b, v, zero))
    return points


def plan_megatron(request: PlanRequest, zero: int = 0) -> PlanResult:
    """The fastest plan of the grid that fits memory (module note); extra["grid"] holds the winning point and
    extra["grid_points"] how many were simulated or refused.

    Raises:
        PlanError: a schedule other than 1f1b / interleaved-1f1b was asked for, the grid is empty, or no point fits.
    """
    started = time.perf_counter()
    if request.schedule not in ("auto", "1f1b", "interleaved-1f1b"):
        raise PlanError(
            f"planner 'megatron' runs 1f1b or interleaved-1f1b only, got schedule {request.schedule!r}; "
            "use --planner pipeplan or exact to choose among schedules"
        )
    points = grid(request, zero)
    if request.schedule != "auto":
        points = [g for g in points if (g.chunks > 1) == (request.schedule == "interleaved-1f1b")]
    if not points:
        raise PlanError(
            f"megatron: no t x p x d grid fits {request.cluster.num_devices} devices and global batch "
            f"{request.global_batch} (t p must divide the devices, d the batch)"
        )
    best: tuple[float, GridPoint, PlanResult] | None = None
    error: PipeplanError | None = None
    for point in points:
        try:
            plan = megatron_plan(request, point)
            result, memory = evaluate(request, plan)
        except PipeplanError as exc:
            error = error or exc
            continue
        if best is None or result.iteration_time < best[0]:
            costs = plan_costs(plan, request.model)
            best = (result.iteration_time, point, PlanResult(plan, "megatron", result, costs, memory, 0.0))
    if best is None:
        assert error is not None
        first = str(error).splitlines()[0]
        raise PlanError(f"megatron: no grid point fits ({len(points)} tried; more devices give more t x p x d points): {first}")
    _, point, found = best
    result, memory = evaluate(request, found.plan, record=True)
    extra = {"grid": point, "grid_points": len(points)}
    return PlanResult(found.plan, "megatron", result, found.costs, memory, time.perf_counter() - started, extra)
