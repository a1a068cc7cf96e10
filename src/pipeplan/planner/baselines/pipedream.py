"""`pipedream`: PipeDream's planner (pipedream_planner) as a user of the original runs it, scored by the simulator.

What the request maps to, in the original's flags:
- `-n`/`-b`: the cluster's levels and bandwidths (pipedream_levels: GPUs of
  a machine at the slowest link inside one, then machines, grouped further by
  the links between them).
- `--activation_compression_ratio 1`: transfers modelled, uncompressed (the
  command the original's README runs); no `--use_memory_constraint` (its
  default: off); `-s` the smallest device memory (unused without the rule).
- `--straight_pipeline` when the request forbids a stage on several devices
  (replication `pipelines` or `none`: PipeDream has no whole-pipeline
  replicas), with `--use_fewer_machines` when the planning graph has fewer
  layers than devices (a user would leave GPUs idle).
- The profile's DAG (`layer_inputs`; a chain without them); stages are the
  node sets the original returns, placed in a layer order where each is
  contiguous.

The plan runs synchronous 1F1B with one pipeline. The original's replicas
take whole minibatches round-robin; pipeplan splits every microbatch evenly
over a stage's replicas, so the microbatch size must be a multiple of every
replica count (split_sizes): the request's, else each such size (the least
common multiple times a power of two) is simulated and the fastest kept.
When no size of the global batch is a multiple of the original's counts
(14 replicas of a batch of 256), the DP runs again with every level's counts
limited to divisors of the batch, and the result says so (`plan`).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

import numpy as np

from pipeplan.core.errors import PlanError
from pipeplan.core.plan import Plan, Stage
from pipeplan.core.profile import ModelProfile
from pipeplan.planner.baselines.pipedream_graph import graph_of_profile
from pipeplan.planner.baselines.pipedream_levels import Levels, levels_of
from pipeplan.planner.baselines.pipedream_planner import (
    PipeDreamOptions,
    PipeDreamPlan,
    PipeDreamStage,
    plan_graph,
    planning_states,
)
from pipeplan.planner.baselines.rules import layer_order, require_schedule
from pipeplan.planner.plan_space import microbatch_sizes, power_of_two
from pipeplan.planner.request import PlanRequest, PlanResult
from pipeplan.planner.simulated import best_of

MAX_MICROBATCHES = 512


def default_options(request: PlanRequest, levels: Levels, planning_nodes: int) -> PipeDreamOptions:
    """The flags a user of the original would pass for this request (module docstring)."""
    straight = not request.stage_replicas_allowed
    return PipeDreamOptions(
        units=levels.units,
        bandwidths_bytes_per_s=levels.bandwidths_bytes_per_s,
        memory_bytes=min(d.memory_bytes for d in request.cluster.devices),
        straight=straight,
        fewer=straight and int(np.prod(levels.units)) > planning_nodes,
        compression=1.0,
    )


def stage_devices(levels: Levels, stages: tuple[PipeDreamStage, ...]) -> list[tuple[int, ...]]:
    """Each stage's devices: a level-l stage on r units takes the next r units of its level inside every unit the
    stage above it holds, so its devices are a block of pipedream_levels' grid."""
    grid = levels.grid.reshape(tuple(reversed(levels.units)))
    depth = len(levels.units)
    start: dict[tuple[int, tuple[int, ...]], int] = {}
    cursor: dict[tuple[int, tuple[int, ...]], int] = {}
    out = []
    for index, stage in enumerate(stages):
        ids = (*stage.path[1:], index)  # the stage holding it at each level, top first
        counts = tuple(reversed(stage.replicas_per_level))
        block = []
        for q in range(depth):
            key = (q, ids[: q + 1])
            if key not in start:
                parent = (q, ids[:q])
                start[key] = cursor.get(parent, 0)
                cursor[parent] = start[key] + counts[q]
            block.append(start[key])
        sel = tuple(slice(b, b + c) for b, c in zip(block, counts, strict=True))
        out.append(tuple(int(d) for d in grid[sel].reshape(-1)))
    return out


def split_sizes(request: PlanRequest, step: int) -> list[int]:
    """Microbatch sizes for a plan whose stage replica counts have least common multiple `step`: the request's,
    else step x 2^i dividing the global batch, at most MAX_MICROBATCHES microbatches, smallest first (a filter on
    planner.plan_space).

    Raises:
        PlanError: no such size (naming the replica counts' multiple and the global batch).
    """
    gb = request.global_batch

    def keep(b: int) -> bool:
        return b % step == 0 and power_of_two(b // step) and gb // b <= MAX_MICROBATCHES

    sizes = [b for b in microbatch_sizes(request, gb, keep) if b % step == 0]
    if not sizes:
        given = f"microbatch size {request.microbatch_size}" if request.microbatch_size is not None else f"global batch {gb}"
        raise PlanError(
            f"planner 'pipedream' found a plan whose stage replica counts need a microbatch size that is a multiple of "
            f"{step} (pipeplan splits each microbatch evenly over a stage's replicas; PipeDream hands whole minibatches "
            f"round-robin), which {given} does not allow; try a global batch that is a multiple of {step}"
        )
    return sorted(sizes, reverse=True)


def to_plan(
    profile: ModelProfile,
    stages: tuple[PipeDreamStage, ...],
    devices: list[tuple[int, ...]],
    microbatch_size: int,
    microbatches: int,
) -> Plan:
    """A pipeplan Plan of the original's stages (node sets) on their devices: the layer order in which each stage
    is contiguous (core.dag.order_from_stages), stages as position ranges over it."""
    order = layer_order(profile, [s.layers for s in stages])
    plan_stages = []
    first = 0
    for stage, devs in zip(stages, devices, strict=True):
        plan_stages.append(Stage(first, first + len(stage.layers) - 1, devs))
        first += len(stage.layers)
    return Plan(tuple(plan_stages), 1, microbatches, microbatch_size, "1f1b", layer_order=order)


def plan_pipedream(request: PlanRequest) -> PlanResult:
    """PipeDream's partition and replication, run as synchronous 1F1B (module docstring).

    Raises:
        PlanError: a schedule other than 1f1b was asked for, the original finds no plan (why, by how much), or
            no microbatch size fits.
    """
    started = time.perf_counter()
    require_schedule(request, "pipedream", "1f1b")
    graph = graph_of_profile(request.profile)
    levels = levels_of(request.cluster)
    planned = planning_states(graph)
    options = default_options(request, levels, planned[0].graph.num_nodes)
    found: PipeDreamPlan = plan_graph(graph, options, planned)
    original = [s.replicas for s in found.stages]
    note = "the original's plan"
    try:
        sizes = split_sizes(request, math.lcm(*original))
    except PlanError:
        # pipeplan cannot split the batch over these counts: the best plan whose counts divide it instead
        batch = request.microbatch_size or request.global_batch
        allowed = frozenset(c for c in range(1, max(levels.units) + 1) if batch % c == 0)
        found = plan_graph(graph, replace(options, allowed=allowed), planned)
        sizes = split_sizes(request, math.lcm(*(s.replicas for s in found.stages)))
        note = f"replica counts limited to divisors of {batch}: the original's plan has {original}"
    devices = stage_devices(levels, found.stages)
    plans = [to_plan(request.profile, found.stages, devices, size, request.global_batch // size) for size in sizes]
    extra = {"stages": len(found.stages), "replicas": [s.replicas for s in found.stages], "flags": levels.describe(),
             "predicted_ms_per_minibatch": found.predicted_ms, "states": found.num_states, "plan": note}  # fmt: skip
    return best_of(request, "pipedream", plans, started, extra)
