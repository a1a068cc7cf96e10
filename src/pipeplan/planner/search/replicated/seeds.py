"""pipeplan's own generator of replicated-pipeline seeds, DAPPLE-inspired (not the `dapple` baseline).

This is the allocation search pipeplan's earlier `dapple` baseline ran, from a
first reading of the DAPPLE paper (Fan et al., PPoPP 2021); the baseline is now
a faithful port of DAPPLE's algorithm (planner/baselines/dapple*.py), and this
reading lives on here because its plans seed pipeplan's search well:

1. Hybrid: for every number g of GPUs per pipeline (a divisor of the cluster
   size D), rp = D / g whole-pipeline replicas. A dynamic program over
   (layers placed, GPUs used, which GPUs are taken) adds one stage at a time:
   the next layers on the next mp GPUs per replica, picked by a placement
   policy (Fresh First, Append First, Scatter First, from `Device.node`),
   minimizing the slowest block (stage compute, or the transfer of 2x the cut
   activation into the stage). A stage's GPU count divides the pipeline
   replica's batch (each microbatch is split over them).
2. Straight plans (one GPU per stage) with g = 2 and g = D, and two-stage
   splits of all D GPUs; g = 1 is plain data parallelism.
3. Every candidate is ranked by the pivot-stage latency model
   (baselines.dapple.pivot.latency) with M = GBS / (rp * microbatch size), stage times
   taken at the microbatch size; the best one that fits in memory wins. The
   schedule is 1F1B, with K_i = min(2(S-i)-1, M) warm-up forwards when
   transfers are comparable to compute (a boundary's transfer takes at least
   half the forward time of the stage it feeds), stored as an explicit `list`
   order; with `--schedule 1f1b` the plain 1F1B order only.

Note:
    To keep it fast: g runs over the divisors of D up to 64; all rp replicas of
    a stage use one policy; above 16 GPUs a stage takes 2^i GPUs or a multiple
    of the machine size; a two-stage split picks its layer cut by the slowest
    block before ranking; profiles over 48 layers are planned over 48 blocks
    (layer_groups.merge_layers). A stage's time uses its slowest device's
    `speed`. When the request leaves the microbatch size open, each power of
    two is planned and the plan that simulates fastest is kept.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from pipeplan.core.errors import PipeplanError, PlanError
from pipeplan.core.plan import Plan, Stage
from pipeplan.planner.baselines.dapple.pivot import latency
from pipeplan.planner.baselines.layer_groups import Blocks, merge_layers
from pipeplan.planner.baselines.rules import microbatch_sizes, require_schedule
from pipeplan.planner.plan_space import full_splits
from pipeplan.planner.request import PlanRequest, PlanResult
from pipeplan.planner.search.replicated.allocation import ReplicaSearch
from pipeplan.planner.search.replicated.placing import (
    ring_allreduce_ms,
)
from pipeplan.planner.simulated import best_of
from pipeplan.schedules.one_f_one_b import one_f_one_b
from pipeplan.sim.cost.memory import check_fits
from pipeplan.sim.cost.model import CostModel

SEED_NAME = "replicated"
"""The name of these seeds in the search's extra["seeds"]."""
MAX_BLOCKS = 48
MAX_GPUS_PER_PIPELINE = 64
MAX_MICROBATCHES = 512


@dataclass(frozen=True, slots=True)
class Candidate:
    """A replicated-pipeline plan before the microbatch size is fixed: (first block, last block, GPUs) per stage, and rp."""

    stages: tuple[tuple[int, int, tuple[int, ...]], ...]
    replicas: int
    kind: str


def stage_gpu_counts(devices: int, node_size: int, limit: int) -> list[int]:
    """GPUs a stage may take per replica: all of 1..limit up to 16 GPUs, 2^i and machine multiples up to 64, else 2^i."""
    if devices <= 16:
        return list(range(1, limit + 1))
    counts = {2**i for i in range(limit.bit_length()) if 2**i <= limit}
    if devices <= 64:
        counts |= {node_size * k for k in range(1, limit // max(node_size, 1) + 1)}
    return sorted(counts)


def two_stage_first_counts(total: int) -> list[int]:
    """GPUs of the first stage of a two-stage split on a large cluster: 2^i or total - 2^i."""
    powers = {2**i for i in range(total.bit_length())}
    return sorted((powers | {total - p for p in powers}) - {0, total})


def candidates(search: ReplicaSearch, global_batch: int, replication: str = "any") -> list[Candidate]:
    """Every plan the generator considers: data parallel, hybrid per g, straight, two-stage splits.

    `replication` (planner.request.REPLICATION_CHOICES) keeps only the candidates it allows: "pipelines" those whose
    stages have one GPU per pipeline replica (data parallel, straight pipelines and hybrids of one-GPU stages,
    two-stage splits of two GPUs), "none" besides those only one pipeline replica (straight over all GPUs).
    """
    total = search.num_devices
    per_replica = global_batch / search.profile.batch_size  # profile batches per iteration, all replicas
    last = search.num_blocks - 1
    one_pipeline = replication == "none"
    wide_stages = replication == "any"
    out = [] if one_pipeline and total > 1 else [Candidate(((0, last, tuple(range(total))),), total, "data-parallel")]
    for rp, g in full_splits(total, global_batch):
        if not 2 <= g <= MAX_GPUS_PER_PIPELINE or (one_pipeline and g != total):
            continue
        replica_batch = global_batch // rp
        # a stage's GPUs split each microbatch, so their count must divide the pipeline replica's batch
        counts = [c for c in stage_gpu_counts(total, search.node_size, g) if replica_batch % c == 0 and (wide_stages or c == 1)]
        found = search.best_pipeline(g, total // g, counts, per_replica / (total // g))
        if found is not None:
            out.append(Candidate(found, total // g, f"hybrid g={g}"))
    straight = ([2] if total > 2 and total % 2 == 0 else []) + [total]  # the authors' 1:1 split and all-straight
    for g in straight:
        if g <= search.num_blocks and not (one_pipeline and g != total):
            found = search.best_pipeline(g, total // g, [1], per_replica / (total // g))
            if found is not None:
                out.append(Candidate(found, total // g, f"straight g={g}"))
    if total >= 2 and search.num_blocks >= 2 and (wide_stages or total == 2):
        firsts = range(1, total) if total <= MAX_GPUS_PER_PIPELINE else two_stage_first_counts(total)
        for g1 in firsts:
            for found in search.two_stage_splits(g1, per_replica):
                out.append(Candidate(found, 1, f"two-stage {g1}+{total - g1}"))
    return out


def stage_times(model: CostModel, search: ReplicaSearch, first: int, last: int, devices: tuple[int, ...], replicas: int,
                microbatch_size: int) -> tuple[float, float]:  # fmt: skip
    """(F, B) ms of blocks first..last per microbatch on their devices: DAPPLE (and this generator) profiles at the
    microbatch size planned for, so the times are the cost model's at b / r samples per device (sim.cost.layers)."""
    lo, hi = search.blocks.layer_range(first, last)
    work = model.layers.stage(range(lo, hi + 1), microbatch_size, len(devices) // replicas, search.speed(devices))
    return work.fwd_ms, work.bwd_ms


def cut_bytes(model: CostModel, search: ReplicaSearch, last: int, microbatch_size: int) -> float:
    """Bytes of one microbatch crossing the cut after block `last`."""
    return model.layers.cut_bytes(search.blocks.layer_range(last, last)[1], microbatch_size)


def latency_of(model: CostModel, search: ReplicaSearch, candidate: Candidate, microbatch_size: int, microbatches: int) -> float:
    """The pivot model's latency of a candidate at one microbatch size (ms)."""
    fwd: list[float] = []
    bwd: list[float] = []
    allreduce: list[float] = []
    prev: tuple[int, int, tuple[int, ...]] | None = None
    for first, last, devices in candidate.stages:
        if prev is not None:
            xfer = search.transfer_ms(prev[2], devices, candidate.replicas, cut_bytes(model, search, prev[1], microbatch_size))
            fwd.append(xfer)
            bwd.append(xfer)
            allreduce.append(0.0)
        f, b = stage_times(model, search, first, last, devices, candidate.replicas, microbatch_size)
        fwd.append(f)
        bwd.append(b)
        grads = search.params(first, last) * search.grads
        allreduce.append(ring_allreduce_ms(grads, len(devices), search.slowest_bytes_per_ms(devices)))
        prev = (first, last, devices)
    return latency(fwd, bwd, allreduce, microbatches)[0]


def to_plan(blocks: Blocks, candidate: Candidate, microbatch_size: int, microbatches: int, extra_warmup: bool) -> Plan:
    """The pipeplan Plan of a candidate (blocks mapped back to layers)."""
    stages = tuple(Stage(*blocks.layer_range(first, last), devices) for first, last, devices in candidate.stages)
    if not extra_warmup:
        return Plan(stages, candidate.replicas, microbatches, microbatch_size, "1f1b")
    order = one_f_one_b(len(stages), microbatches, extra_warmup=True).ranks
    return Plan(stages, candidate.replicas, microbatches, microbatch_size, "list", order=order)


def transfers_comparable(model: CostModel, search: ReplicaSearch, candidate: Candidate, microbatch_size: int) -> bool:
    """True when some boundary's transfer of one microbatch takes at least half the next stage's forward."""
    for (_, last, before), (first, end, after) in zip(candidate.stages, candidate.stages[1:], strict=False):
        xfer = search.transfer_ms(before, after, candidate.replicas, cut_bytes(model, search, last, microbatch_size))
        fwd, _ = stage_times(model, search, first, end, after, candidate.replicas, microbatch_size)
        if xfer >= 0.5 * fwd:
            return True
    return False


def choose(request: PlanRequest, search: ReplicaSearch, found: list[Candidate], microbatch_size: int) -> Plan | None:
    """The pick at one microbatch size: the lowest pivot latency among candidates that fit."""
    ranked = []
    for index, candidate in enumerate(found):
        replica_batch, rest = divmod(request.global_batch, candidate.replicas)
        if rest or replica_batch % microbatch_size:
            continue
        if any(microbatch_size % (len(devices) // candidate.replicas) for _, _, devices in candidate.stages):
            continue  # a microbatch is split evenly over a stage's replicas
        m = replica_batch // microbatch_size
        if m > MAX_MICROBATCHES:
            continue
        ranked.append((latency_of(request.model, search, candidate, microbatch_size, m), index, candidate, m))
    ranked.sort(key=lambda item: (item[0], item[1]))
    for _, _, candidate, m in ranked:
        # the extra warm-up order is a `list` plan: not when the request asks for plain 1f1b
        extra_ok = request.schedule == "auto" and transfers_comparable(request.model, search, candidate, microbatch_size)
        variants = [True, False] if extra_ok else [False]
        for extra in variants:
            plan = to_plan(search.blocks, candidate, microbatch_size, m, extra)
            try:
                check_fits(plan, request.model)
            except PipeplanError:
                continue
            return plan
    return None


def plan_replicated(request: PlanRequest) -> PlanResult:
    """Plan replicated pipelines as above and score the plan with the simulator (see the module docstring).

    Raises:
        PlanError: a schedule other than 1f1b was asked for, or no candidate fits in memory.
    """
    started = time.perf_counter()
    require_schedule(request, SEED_NAME, "1f1b")
    model = request.model
    search = ReplicaSearch(merge_layers(request.profile, MAX_BLOCKS), request.cluster, model.optimizer_factor, model.holding)
    found = candidates(search, request.global_batch, request.replication)
    if not found:
        raise PlanError(
            f"seed generator {SEED_NAME!r} has no candidate under replication {request.replication!r} "
            f"on {search.num_devices} GPUs: "
            f"a straight pipeline over all of them needs as many layer blocks, {request.profile.name} has "
            f"{search.num_blocks}; try --replication pipelines or any"
        )
    plans = []
    for size in microbatch_sizes(request, request.global_batch, max_microbatches=request.global_batch):
        plan = choose(request, search, found, size)
        if plan is not None:
            plans.append(plan)
    if not plans:
        raise PlanError(
            f"seed generator {SEED_NAME!r} found no plan that fits for {request.profile.name} on {request.cluster.name} "
            f"(global batch {request.global_batch}); try a smaller --microbatch-size or more devices"
        )
    return best_of(request, SEED_NAME, plans, started, {"candidates": len(found)})
