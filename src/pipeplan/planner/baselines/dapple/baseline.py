"""`dapple`: DAPPLE's planner (Fan et al., PPoPP 2021), its plan scored by pipeplan's simulator.

What the request maps to:
- the graph: the profile's DAG (`layer_inputs`; a chain without them) with
  PipeDream's states (dapple.planning_model), as the authors' planner (HPGO) reads
  it; a graph over STATE_LIMIT states, or over SET_DP_STATES where the
  placement DP has to track GPU sets (dapple.dp), is planned over
  MAX_BLOCKS blocks of consecutive layers instead (layer_groups; a cap, the
  original does not finish there);
- the cluster: machines from Device.node, link rates from its links
  (dapple.comm_times.rates_of; HPGO hard-codes V100 rates);
- the search (dapple.ranking): every p with floor(N/p) replicas, any stage
  GPU count, every placement-policy sequence over the replicas, DAPPLE's DP,
  ranked by the paper's pivot latency (HPGO's analytic ranking:
  dapple.hpgo, checked against its saved plans in the tests).
The microbatch size is an input of DAPPLE: when the request leaves it open,
each power of two is planned and the plan that simulates fastest is kept,
as a user tuning that flag would. Per size the best-ranked candidate that
fits in memory is taken. The schedule is DAPPLE's early backward (1F1B),
with K_i = min(2(S-i)-1, M) warm-up forwards when a transfer takes at least
half the forward of the stage it feeds (a `list` order); with
`--schedule 1f1b` plain 1F1B.
"""

from __future__ import annotations

import time

from pipeplan.core.downsets import bits
from pipeplan.core.errors import PipeplanError, PlanError
from pipeplan.core.plan import Plan, Stage
from pipeplan.planner.baselines.dapple.comm_times import rates_of
from pipeplan.planner.baselines.dapple.dp import DappleStage
from pipeplan.planner.baselines.dapple.gpus import machines_of
from pipeplan.planner.baselines.dapple.planning_model import DappleModel, dapple_model
from pipeplan.planner.baselines.dapple.ranking import FAITHFUL_GPUS, Candidate, Links, candidates, rank, stage_transfer_s
from pipeplan.planner.baselines.downset_tables import StateLimitError
from pipeplan.planner.baselines.layer_groups import merge_layers
from pipeplan.planner.baselines.pipedream_graph import graph_of_profile
from pipeplan.planner.baselines.rules import layer_order, microbatch_sizes, require_schedule
from pipeplan.planner.request import PlanRequest, PlanResult
from pipeplan.planner.simulated import best_of
from pipeplan.schedules.one_f_one_b import one_f_one_b
from pipeplan.sim.cost.memory import check_fits

STATE_LIMIT = 1_000
SET_DP_STATES = 64
MAX_BLOCKS = 48
MAX_MICROBATCHES = 512


def planning_model(request: PlanRequest, links: Links) -> tuple[DappleModel, list[tuple[int, ...]] | None]:
    """DAPPLE's model of the request's graph, or of its layers merged into blocks (module docstring): the model and,
    for blocks, each block's layers."""
    sets_needed = links.machines.gpus <= FAITHFUL_GPUS and len(links.machines.ends) > 1 and links.machines.largest > 1
    try:
        model = dapple_model(graph_of_profile(request.profile), request.global_batch, STATE_LIMIT)
        if not (sets_needed and model.count > SET_DP_STATES):
            return model, None
    except StateLimitError:
        pass
    blocks = merge_layers(request.profile, MAX_BLOCKS)
    spans = [blocks.layer_range(b, b) for b in range(len(blocks.starts))]
    return dapple_model(graph_of_profile(blocks.profile), request.global_batch), [tuple(range(a, z + 1)) for a, z in spans]


def stage_devices(links: Links, device_of: tuple[int, ...], candidate: Candidate) -> list[tuple[int, ...]]:
    """Each stage's device ids, replica-major; a placement-free stage takes the next free GPUs, replica by replica."""
    out: list[tuple[int, ...]] = []
    start = 0
    for s in candidate.stages:
        if s.parts is None:
            count = s.units * candidate.replicas
            out.append(tuple(device_of[g] for g in range(start, start + count)))
            start += count
        else:
            parts = s.parts if len(s.parts) == candidate.replicas else (s.gpus,)
            out.append(tuple(device_of[g] for part in parts for g in bits(part)))
            start = max(start, *(x + 1 for x in bits(s.gpus)))
    return out


def to_plan(request: PlanRequest, model: DappleModel, blocks: list[tuple[int, ...]] | None, links: Links,
            device_of: tuple[int, ...], candidate: Candidate, size: int, extra: bool) -> Plan:  # fmt: skip
    """The pipeplan Plan of a candidate: stages as node sets in a layer order where each is contiguous."""
    sets = model.stage_layers([s.end for s in candidate.stages])
    if blocks is not None:
        sets = [sorted(layer for b in s for layer in blocks[b]) for s in sets]
    order = layer_order(request.profile, sets)
    stages, first = [], 0
    for members, devices in zip(sets, stage_devices(links, device_of, candidate), strict=True):
        stages.append(Stage(first, first + len(members) - 1, devices))
        first += len(members)
    m = request.global_batch // (candidate.replicas * size)
    if not extra:
        return Plan(tuple(stages), candidate.replicas, m, size, "1f1b", layer_order=order)
    schedule = one_f_one_b(len(stages), m, extra_warmup=True).ranks
    return Plan(tuple(stages), candidate.replicas, m, size, "list", order=schedule, layer_order=order)


def comparable(model: DappleModel, links: Links, candidate: Candidate) -> bool:
    """True when some boundary's transfer takes at least half the forward time of the stage it feeds."""
    rp = candidate.replicas
    for a, b in zip(candidate.stages, candidate.stages[1:], strict=False):
        x = stage_transfer_s(model, links, a, b, rp, float(model.cut_bytes[b.after]))
        if x >= 0.5 * model.between(model.fwd_s, b.after, b.end) / (b.units * rp):
            return True
    return False


def allowed(request: PlanRequest, candidate: Candidate) -> bool:
    """Whether the request's replication allows the candidate."""
    if not request.pipelines_allowed and candidate.replicas > 1:
        return False
    return request.stage_replicas_allowed or all(s.units == 1 for s in candidate.stages)


def plan_dapple(request: PlanRequest) -> PlanResult:
    """Plan like DAPPLE and score the plan with the simulator (module docstring).

    Raises:
        PlanError: a schedule other than 1f1b was asked for, no candidate is allowed or has a microbatch, or none
            fits in memory (naming the best-ranked one's overflow).
    """
    started = time.perf_counter()
    require_schedule(request, "dapple", "1f1b")
    machines, device_of = machines_of(request.cluster)
    links = Links(machines, rates_of(request.cluster))
    model, blocks = planning_model(request, links)
    found = [c for c in candidates(model, links, "any" if request.stage_replicas_allowed else "one") if allowed(request, c)]
    if not found:
        raise PlanError(
            f"planner 'dapple' has no candidate under replication {request.replication!r} on {machines.gpus} GPUs: "
            f"a straight pipeline over more than half of them needs as many stages, {request.profile.name} has "
            f"{model.count} planning states; try --replication pipelines or any"
        )
    plans: list[Plan] = []
    overflow: str | None = None
    for size in microbatch_sizes(request, request.global_batch, max_microbatches=request.global_batch):
        ranked = []
        for index, c in enumerate(found):
            batch, rest = divmod(request.global_batch, c.replicas * size)
            if rest or batch > MAX_MICROBATCHES or any(size % s.units for s in c.stages):
                continue
            value = rank(model, links, c, size)
            if value is not None:
                ranked.append((value, index, c))
        ranked.sort(key=lambda item: (item[0], item[1]))
        for _, _, c in ranked:
            variants = [True, False] if request.schedule == "auto" and comparable(model, links, c) else [False]
            plan = None
            for extra in variants:
                candidate_plan = to_plan(request, model, blocks, links, device_of, c, size, extra)
                try:
                    check_fits(candidate_plan, request.model)
                except PipeplanError as error:
                    overflow = overflow or f"{c.label} at microbatch size {size}: {error}"
                    continue
                plan = candidate_plan
                break
            if plan is not None:
                plans.append(plan)
                break
    if not plans:
        reason = (
            f"no candidate fits in memory; the best-ranked: {overflow}"
            if overflow
            else f"global batch {request.global_batch} gives no candidate a whole number of microbatches "
            f"(each stage splits a microbatch over its GPUs per replica; at most {MAX_MICROBATCHES} microbatches)"
        )
        raise PlanError(f"planner 'dapple' found no plan for {request.profile.name} on {request.cluster.name}: {reason}")
    extra_info = {"candidates": len(found), "states": model.count, "blocks": blocks is not None}
    return best_of(request, "dapple", plans, started, extra_info)


__all__ = ["Candidate", "DappleStage", "candidates", "plan_dapple"]
