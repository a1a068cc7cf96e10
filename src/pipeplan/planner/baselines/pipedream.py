"""`pipedream`: PipeDream's hierarchical partitioning DP (Narayanan et al., SOSP 2019), run synchronously.

The optimizer of the paper and of msr-fiddle/pipedream
(`optimizer/optimizer_graph_hierarchical.py`), over a chain of layers:

    A(i..j, m) = min( T(i..j, m),
                      min_{i<=k<j, 1<=m'<m} max(A(i..k, m - m'), T(k+1..j, m'), 2 C_k / m', 2 C_j / m') )
    T(i..j, m) = (compute(i..j) + 4 (m-1) W(i..j) / (B m)) / m

with compute = forward + backward of one profile batch, W the parameter
bytes, C_k the bytes crossing the cut after layer k and B the level's
bandwidth. The DP runs once per level of the topology, bottom up: level 1
over the GPUs of a machine (bandwidth inside a machine), level 2 over the
machines (bandwidth between machines), where T of a layer range is level 1's
best time for it on one whole machine. A stage chosen at level 2 with m'
machines runs the level-1 split of its layers on each of its machines.

Note:
    Straight pipelines: one pipeline (no whole-pipeline replicas), stages
    replicated per level as the DP says, all units of a level used (the
    tool's default without --use_fewer_machines). The transfer terms are those
    the tool applies with an activation compression ratio of 1 (the paper's
    2 C term). Memory: a stage whose weights, gradients and optimizer state do
    not fit a device is skipped (in place of the tool's weight-stashing
    estimate, which is for asynchronous training). The plan runs 1F1B; the
    microbatch size (PipeDream's unit is the profile batch) is the request's,
    else each power of two is simulated and the fastest kept. Machines of
    unequal size, or one GPU per machine, give a single flat level with the
    slowest link as its bandwidth. Profiles over 128 layers are planned over
    128 blocks of consecutive layers (baseline_tools.merge_layers). A stage's
    replica count at each level is a power of two dividing the global batch
    (or the requested microbatch size), and a level-2 stage's machines times
    the GPUs of a machine divides it too: pipeplan splits each microbatch
    evenly over a stage's replicas, where PipeDream hands whole minibatches
    round-robin.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from pipeplan.core.cluster import Cluster
from pipeplan.core.errors import PlanError
from pipeplan.core.plan import Plan, Stage
from pipeplan.planner.baselines.layer_groups import Blocks, merge_layers
from pipeplan.planner.baselines.rules import microbatch_sizes, powers_of_two_dividing, require_schedule
from pipeplan.planner.request import PlanRequest, PlanResult
from pipeplan.planner.simulated import best_of
from pipeplan.sim.cost.layers import static_factor
from pipeplan.sim.cost.link_model import device_nodes, link_arrays

MAX_BLOCKS = 128
MAX_MICROBATCHES = 512


@dataclass(frozen=True, slots=True)
class LevelTable:
    """One level's DP: best time A[i, j, m] of layers i..j on m+1 units, with its last split and units.

    `split[i, j, m]` = k (the last stage is k+1..j) or -1 when one stage on all
    m+1 units is best; `units[i, j, m]` = m' units of the last stage.
    """

    time: np.ndarray
    split: np.ndarray
    units: np.ndarray


def level_dp(
    compute: np.ndarray,
    params: np.ndarray,
    cut: np.ndarray,
    units: int,
    bytes_per_ms: float,
    within: int,
    all_starts: bool,
    param_limit: float,
    allowed: frozenset[int] | None = None,
) -> LevelTable:
    """PipeDream's DP at one level.

    Args:
        compute: [L, L] time of layers i..j on one unit of the level below (inf where i > j).
        params: [L, L] parameter bytes of layers i..j.
        cut: [L] bytes crossing the cut after layer k (the last entry unused).
        units: units at this level (GPUs of a machine, or machines).
        bytes_per_ms: the level's bandwidth.
        within: units of the level below inside one unit (1 at level 1).
        all_starts: compute every start i (needed by the level above), else only i = 0.
        param_limit: largest parameter bytes a stage may hold (memory / (2 + optimizer factor)).
        allowed: the replica counts a stage may have (None: any).
    """
    n = compute.shape[0]
    m_range = np.arange(1, units + 1, dtype=float)  # m + 1 for m = 0..units-1
    heavy = params > param_limit
    base = compute[:, :, None] + 4.0 * (m_range - 1) * params[:, :, None] / (bytes_per_ms * m_range) / within
    time_ = np.where(heavy[:, :, None], np.inf, base / m_range)
    if allowed is not None:
        time_[:, :, [m for m in range(units) if m + 1 not in allowed]] = np.inf
    split = np.full(time_.shape, -1, dtype=np.int64)
    units_arr = np.broadcast_to(np.arange(1, units + 1), time_.shape).copy()
    starts = n if all_starts else 1
    # last[m'][k+1, j]: a stage of layers k+1..j on m' units; transfers in and out of it.
    last = {mp: np.where(heavy, np.inf, (compute + 4.0 * (mp - 1) * params / (bytes_per_ms * mp)) / mp) for mp in range(1, units)}
    xfer = {mp: 2.0 * cut / (bytes_per_ms * mp) for mp in range(1, units)}
    upper = np.triu(np.ones((n, n), dtype=bool), 1)  # k < j
    for m in range(1, units):
        best = time_[:starts, :, m].copy()
        best_k = np.full(best.shape, -1, dtype=np.int64)
        best_mp = np.full(best.shape, m + 1, dtype=np.int64)
        for mp in range(1, m + 1):
            if allowed is not None and mp not in allowed:
                continue
            prev = time_[:starts, :, m - mp]  # [i, k]
            stage = np.full((n, n), np.inf)  # [k, j]: layers k+1..j
            stage[:-1, :] = last[mp][1:, :]
            out = xfer[mp].copy()
            out[-1] = 0.0  # nothing leaves the last layer
            rest = np.maximum(np.maximum(stage, xfer[mp][:, None]), out[None, :])
            rest = np.where(upper, rest, np.inf)
            candidate = np.maximum(prev[:, :, None], rest[None, :, :])  # [i, k, j]
            k_best = candidate.argmin(axis=1)
            value = np.take_along_axis(candidate, k_best[:, None, :], axis=1)[:, 0, :]
            better = value < best
            best = np.where(better, value, best)
            best_k = np.where(better, k_best, best_k)
            best_mp = np.where(better, mp, best_mp)
        time_[:starts, :, m] = best
        split[:starts, :, m] = best_k
        units_arr[:starts, :, m] = best_mp
    return LevelTable(time_, split, units_arr)


def unwind(table: LevelTable, first: int, last: int, units: int) -> list[tuple[int, int, int]]:
    """The stages (first layer, last layer, units) of layers first..last on `units` units at one level."""
    stages = []
    j, m = last, units - 1
    while True:
        k = int(table.split[first, j, m])
        mp = int(table.units[first, j, m])
        if k < 0:
            stages.append((first, j, m + 1))
            break
        stages.append((k + 1, j, mp))
        j, m = k, m - mp
    return list(reversed(stages))


def levels_of(cluster: Cluster) -> tuple[list[list[int]], float, float | None]:
    """Machines (GPU ids) and the bandwidth (bytes/ms) inside and between them; a flat single level when uneven.

    Returns (machines, inside, between): with one machine, or machines of one
    GPU, or machines of unequal size, the machines collapse to one flat level
    (a single machine holding every GPU) and `between` is None.
    """
    by_node: dict[int, list[int]] = {}
    for d in cluster.devices:
        by_node.setdefault(d.node, []).append(d.id)
    machines = sorted((sorted(ids) for ids in by_node.values()), key=lambda ids: ids[0])
    sizes = {len(m) for m in machines}
    n = cluster.num_devices
    rate, _ = link_arrays(cluster)  # link_bandwidth of every pair (NIC caps applied)
    if len(machines) == 1 or sizes != {len(machines[0])} or len(machines[0]) == 1:
        return [list(range(n))], rate.off_diagonal_min() / 1000.0, None
    inside, between = rate.extremes(device_nodes(cluster))
    return machines, inside / 1000.0, between / 1000.0


def pipedream_stages(
    blocks: Blocks, cluster: Cluster, optimizer_factor: float, allowed: frozenset[int] | None = None
) -> tuple[Stage, ...]:
    """PipeDream's partition and replication of `blocks` over `cluster` (one pipeline).

    Raises:
        PlanError: no partition fits (weights too large, or no allowed replica counts add up to the devices).
    """
    profile = blocks.profile
    n = profile.num_layers
    work = np.concatenate([[0.0], np.cumsum([layer.fwd_ms + layer.bwd_ms for layer in profile.layers])])
    weights = np.concatenate([[0.0], np.cumsum([layer.param_bytes for layer in profile.layers])])
    lower = np.tril(np.ones((n, n), dtype=bool), -1)
    compute = np.where(lower, np.inf, work[None, 1:] - work[:-1, None])
    params = np.where(lower, 0.0, weights[None, 1:] - weights[:-1, None])
    cut = np.asarray([*profile.cut_bytes, 0.0])  # type: ignore[misc]
    limit = min(d.memory_bytes for d in cluster.devices) / static_factor(optimizer_factor)
    machines, inside, between = levels_of(cluster)
    per_machine = len(machines[0])
    level1 = level_dp(compute, params, cut, per_machine, inside, 1, between is not None, limit, allowed)
    why = "whose weights fit"
    if allowed == frozenset({1}) and n < cluster.num_devices:
        why = f"(PipeDream uses every GPU: one per stage needs {cluster.num_devices} layers, the model has {n})"
    no_partition = PlanError(
        f"planner 'pipedream' found no partition of {profile.name} over {cluster.name} with replica counts "
        f"{sorted(allowed or ())} {why}; try --planner pipeplan"
    )
    if between is None:
        if not np.isfinite(level1.time[0, n - 1, -1]):
            raise no_partition
        flat, start = [], 0
        for first, last, used in unwind(level1, 0, n - 1, per_machine):
            flat.append(Stage(*blocks.layer_range(first, last), tuple(machines[0][start : start + used])))
            start += used
        return tuple(flat)
    # a level-2 stage's memory was checked per level-1 stage inside each machine
    # a stage over m2 machines has up to m2 * per_machine replicas: keep that within the allowed counts (a stage
    # on one machine is level 1's, whose replica counts were checked there)
    machine_counts = None if allowed is None else frozenset(c for c in allowed if c == 1 or c * per_machine in allowed)
    level2 = level_dp(level1.time[:, :, -1], params, cut, len(machines), between, per_machine, False, np.inf, machine_counts)
    if not np.isfinite(level2.time[0, n - 1, -1]):
        raise no_partition
    stages = []
    next_machine = 0
    for first, last, used in unwind(level2, 0, n - 1, len(machines)):
        mine = machines[next_machine : next_machine + used]
        next_machine += used
        next_gpu = 0
        for sub_first, sub_last, gpus in unwind(level1, first, last, per_machine):
            devices = tuple(machine[g] for machine in mine for g in range(next_gpu, next_gpu + gpus))
            stages.append(Stage(*blocks.layer_range(sub_first, sub_last), devices))
            next_gpu += gpus
    return tuple(stages)


def plan_pipedream(request: PlanRequest) -> PlanResult:
    """PipeDream's partition and replication, run as synchronous 1F1B (see the module docstring).

    Raises:
        PlanError: a schedule other than 1f1b was asked for, or no microbatch size fits.
    """
    started = time.perf_counter()
    require_schedule(request, "pipedream", "1f1b")
    blocks = merge_layers(request.profile, MAX_BLOCKS)
    batch = request.microbatch_size or request.global_batch
    # PipeDream replicates stages, never whole pipelines: without stage replication every stage has one GPU
    allowed = frozenset(powers_of_two_dividing(batch)) if request.stage_replicas_allowed else frozenset({1})
    stages = pipedream_stages(blocks, request.cluster, request.model.optimizer_factor, allowed)
    replicas = [len(s.devices) for s in stages]
    plans = [
        Plan(stages, 1, request.global_batch // size, size, "1f1b")
        for size in microbatch_sizes(request, request.global_batch, MAX_MICROBATCHES)
        if all(size % r == 0 for r in replicas)
    ]
    if not plans:
        raise PlanError(
            f"planner 'pipedream' replicates a stage {max(replicas)} times, which no microbatch size of "
            f"global batch {request.global_batch} splits evenly; try a larger --global-batch"
        )
    return best_of(request, "pipedream", plans, started, {"stages": len(stages), "replicas": replicas})
