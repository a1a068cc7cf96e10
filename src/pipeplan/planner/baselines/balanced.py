"""`balanced`: the contiguous partition minimizing the slowest stage, one device per stage, 1F1B.

What DeepSpeed's `partition_balanced` and torchgpipe's `balance_by_time`
give (core.partition.solve): layers split into p contiguous blocks so that the largest block time
(forward + backward) is as small as possible, block i on device i.
"""

from __future__ import annotations

import time

from pipeplan.core.errors import PipeplanError, PlanError
from pipeplan.core.partition import solve
from pipeplan.core.plan import Plan, Stage
from pipeplan.planner.baselines.rules import require_schedule
from pipeplan.planner.plan_space import divisors, microbatch_sizes, power_of_two
from pipeplan.planner.request import PlanRequest, PlanResult
from pipeplan.planner.simulated import evaluate
from pipeplan.sim.cost.plan_costs import plan_costs

MAX_STAGES = 64


def default_microbatch_sizes(global_batch: int, stages: int) -> list[int]:
    """Microbatch sizes to try, preferred first: powers of two, largest with m >= 4p first, then smaller ones.

    GPipe's rule of thumb: m >= 4p microbatches keep the bubble small; among
    those the largest microbatch runs each kernel most efficiently. Smaller
    sizes follow, for when memory does not fit.
    """
    sizes = [b for b in reversed(divisors(global_batch)) if power_of_two(b)]
    good = [b for b in sizes if global_batch // b >= 4 * stages]
    return good + [b for b in sizes if b not in good] if good else sorted(sizes)


def pipeline_replicas(devices: int, stages: int, global_batch: int) -> int:
    """DeepSpeed's data-parallel degree: devices // stages, lowered until it divides the global batch."""
    replicas = max(1, devices // stages)
    while global_batch % replicas:
        replicas -= 1
    return replicas


def plan_balanced(request: PlanRequest) -> PlanResult:
    """Plan with the balanced partition over p = min(layers, devices, 64) stages, one device each, 1F1B.

    Stage i runs on device i; when devices are left over, the whole pipeline
    is copied rp = devices // p times (DeepSpeed's data-parallel degree, lowered
    to divide the global batch) onto the next devices in order. The
    microbatch size is the request's, else the largest power of two giving
    m >= 4p microbatches per pipeline that fits in memory (smaller ones if none does).

    Raises:
        PlanError: a schedule other than 1f1b was asked for, or no microbatch size fits.
    """
    started = time.perf_counter()
    require_schedule(request, "balanced", "1f1b")
    profile, cluster = request.profile, request.cluster
    stages_count = min(profile.num_layers, cluster.num_devices, MAX_STAGES)
    replicas = pipeline_replicas(cluster.num_devices, stages_count, request.global_batch) if request.pipelines_allowed else 1
    bounds = solve([layer.fwd_ms + layer.bwd_ms for layer in profile.layers], stages_count)
    stages = tuple(
        Stage(bounds[i], bounds[i + 1] - 1, tuple(t * stages_count + i for t in range(replicas))) for i in range(stages_count)
    )
    replica_batch = request.global_batch // replicas
    if request.microbatch_size:
        sizes = microbatch_sizes(request, replica_batch)
    else:
        sizes = default_microbatch_sizes(replica_batch, stages_count)
    error: PipeplanError | None = None
    for size in sizes:
        plan = Plan(stages, replicas, replica_batch // size, size, "1f1b")
        try:
            result, memory = evaluate(request, plan, record=True)
        except PipeplanError as exc:
            error = error or exc
            continue
        extra = {"bottleneck_ms": max(r.busy for r in result.per_rank) / plan.microbatches}
        costs = plan_costs(plan, request.model)
        return PlanResult(plan, "balanced", result, costs, memory, time.perf_counter() - started, extra)
    if error is None:
        raise PlanError(
            f"planner 'balanced' runs {replicas} pipeline replicas; microbatch size {request.microbatch_size} "
            f"does not divide their batch of {replica_batch}"
        )
    raise PlanError(f"planner 'balanced' found no microbatch size that fits: {error}")
