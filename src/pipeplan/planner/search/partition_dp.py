"""Partition and replication by dynamic programming over (layer suffix, devices used, stages after).

The DP runs from the last layer backwards, so a new stage knows how many
stages follow it: that is its 1F1B in-flight count, which bounds its
activation memory. Stage placements come from a Layout; the pipeline's last
stage sits at position 0 of the device order and earlier stages at higher
positions, so unused devices are the tail of the order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipeplan.core.hardware.cluster import Cluster
from pipeplan.core.shared_params import SharedGroup
from pipeplan.core.units import MS_PER_S
from pipeplan.planner.phase_clock import timed_phase
from pipeplan.planner.search.blocks import MAX_BLOCKS
from pipeplan.planner.search.dp_placement import placement_arrays
from pipeplan.planner.search.mapping import Layout
from pipeplan.sim.cost.holding import PLAIN, Holding
from pipeplan.sim.cost.layers import LayerCosts, static_bytes

INF = np.inf


@dataclass(frozen=True, slots=True)
class DpStage:
    """One stage of a DP solution: layers [first_layer, last_layer] at units [first_unit, first_unit+units)."""

    first_layer: int
    last_layer: int
    first_unit: int
    units: int


@dataclass(frozen=True, slots=True)
class DpSolution:
    """Stages in pipeline order and the DP's estimate of the iteration time (ms)."""

    stages: tuple[DpStage, ...]
    estimate_ms: float


@dataclass(frozen=True, slots=True)
class BlockSums:
    """Per block range [i, j] (i <= j) at one number of samples per device: fwd+bwd ms, param bytes, saved bytes,
    optimizer-step ms; cut bytes of a whole microbatch after block j; backward ms of all blocks before block i."""

    work_ms: np.ndarray
    param_bytes: np.ndarray
    saved_bytes: np.ndarray
    optimizer_ms: np.ndarray
    cut_after: np.ndarray
    bwd_before_ms: np.ndarray
    blocks: tuple[tuple[int, int], ...]


def block_sums(costs: LayerCosts, blocks: tuple[tuple[int, int], ...], samples: float, microbatch_size: int) -> BlockSums:
    """Range sums over blocks of the layer costs at `samples` samples per device (inf work where j < i).

    Cuts carry a whole microbatch of `microbatch_size` samples (split later over the pairs between two stages).
    """
    arrays = costs.arrays(samples)
    starts = np.array([a for a, _ in blocks], dtype=np.int64)
    layers = costs.profile.layers

    def per_block(values: np.ndarray) -> np.ndarray:
        return np.add.reduceat(np.asarray(values, dtype=float), starts)

    work = per_block(arrays.fwd + arrays.bwd)
    params = per_block(np.array([x.param_bytes for x in layers]))
    # a stage of blocks i..j holds their saved bytes less what neighbours share, but for block i's first layer
    shared_first = arrays.shared[starts]
    saved = per_block(arrays.saved - arrays.shared)
    optimizer = per_block(costs.optimizer_steps_ms)
    bwd = per_block(arrays.bwd)

    def ranges(v: np.ndarray) -> np.ndarray:
        c = np.concatenate([[0.0], np.cumsum(v)])
        return c[None, 1:] - c[:-1, None]  # [i, j] = sum v[i..j]

    upper = np.triu(np.ones((len(blocks), len(blocks)), dtype=bool))
    last = len(layers) - 1
    cut_after = np.array([costs.cut_bytes(b, microbatch_size) if b < last else 0.0 for _, b in blocks], dtype=float)
    bwd_before = np.concatenate([[0.0], np.cumsum(bwd)[:-1]])
    return BlockSums(
        np.where(upper, ranges(work), INF),
        ranges(params) - shared_overlap(costs.profile.shared_params, blocks),
        ranges(saved) + shared_first[:, None],
        ranges(optimizer),
        cut_after,
        bwd_before,
        blocks,
    )


def shared_overlap(groups: tuple[SharedGroup, ...], blocks: tuple[tuple[int, int], ...]) -> np.ndarray | float:
    """[i, j]: the bytes a stage of blocks i..j would count twice (core.shared_params.overlap_bytes; 0 without groups)."""
    if not groups:
        return 0.0
    first = np.array([a for a, _ in blocks], dtype=np.int64)
    out = np.zeros((len(blocks), len(blocks)))
    for g in groups:
        block = np.searchsorted(first, np.array(g.layers), side="right") - 1  # each member's block
        members = np.bincount(block, minlength=len(blocks)).astype(float)
        c = np.concatenate([[0.0], np.cumsum(members)])
        count = c[None, 1:] - c[:-1, None]  # [i, j] = members in blocks i..j
        out += np.maximum(count - 1, 0.0) * g.param_bytes
    return out


@dataclass(frozen=True, slots=True)
class DpInputs:
    """Everything one DP run needs besides the layout: block sums per stage replica count r (at b / r samples)."""

    sums: dict[int, BlockSums]
    cluster: Cluster
    bandwidth: np.ndarray
    latency: np.ndarray
    microbatches: int
    optimizer_factor: float
    unit_choices: tuple[int, ...]
    max_stages: int
    hide_allreduce: bool = False
    holding: Holding = PLAIN

    @property
    def blocks(self) -> tuple[tuple[int, int], ...]:
        """The blocks the DP cuts between."""
        return next(iter(self.sums.values())).blocks


I_BLOCK = MAX_BLOCKS
"""The DP's step takes first blocks i this many at a time, each with only the last blocks j >= i (the rest is inf).
All of them (search.blocks.MAX_BLOCKS, 64): one step per (count, width) is about 5 % faster than two of 32 (fewer
NumPy calls outweigh the cells below the diagonal), and the solutions are the same for any block (tests)."""

Tables = dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]
"""Per stage width rho (units): u, fill and room of a stage of blocks i..j whose later stages use k' units ([i, j, k'],
inf work where j < i), and the least room over k' of each (i, j) (inf where j < i)."""

Placements = dict[tuple[Layout, int], dict[str, np.ndarray]]
"""placement_arrays by (layout, stage width rho), for one cluster and its link matrices."""


@dataclass(frozen=True, slots=True)
class DpCache:
    """What partition_dp_each keeps across the calls of one caller on one cluster, link matrices, blocks and
    optimizer: placement arrays per (layout, width), and the solutions per everything the tables are made of.

    Two layouts whose stages see the same speeds, memory, rings and links (a device order and its mirror image on a
    symmetric cluster) have the same tables, so the same solutions (stages in units and blocks, estimates): the
    second is looked up. `solved` keys hold the ids of the block sums, which its values keep alive."""

    placements: Placements = field(default_factory=dict)
    solved: dict[tuple[object, ...], tuple[list[list[DpSolution]], tuple[BlockSums, ...]]] = field(default_factory=dict)


@timed_phase("partition_dp")
def partition_dp(inp: DpInputs, layout: Layout, keep: int = 4) -> list[DpSolution]:
    """The `keep` best partitions with replication for this layout, by the DP's estimate.

    Stage estimate: u_s = (m-1) * max(t_s, c_s) + AR_s + O_s with t_s the
    stage's F+B per microbatch at b / r_s samples per device, c_s its outgoing
    transfer, AR_s its all-reduce (with `hide_allreduce`, max(0, AR_s - D_s)
    where D_s is the backward of the earlier layers, which can hide it) and
    O_s its optimizer step; a
    suffix's value is max_s u_s plus the fill sum_s (t_s + 2 c_s). Memory:
    weights, gradients and optimizer state plus min(stages after, m)
    microbatches of activations must fit the smallest device of the stage.
    """
    return _solve_each(inp, layout, (inp.hide_allreduce,), keep, DpCache())[0]


@timed_phase("partition_dp")
def partition_dp_each(
    inp: DpInputs, layout: Layout, hides: tuple[bool, ...], keep: int = 4, cache: DpCache | None = None
) -> list[list[DpSolution]]:
    """partition_dp's solutions with `hide_allreduce` set to each of `hides` in turn (inp's own setting is not
    read), from one build of what the estimates share: the same lists as one partition_dp call per setting.
    `cache`: kept by the caller across calls on the same cluster, link matrices, blocks and optimizer (DpCache)."""
    return _solve_each(inp, layout, hides, keep, DpCache() if cache is None else cache)


def _solve_each(inp: DpInputs, layout: Layout, hides: tuple[bool, ...], keep: int, cache: DpCache) -> list[list[DpSolution]]:
    """The solutions per setting of `hides` (partition_dp_each), looked up in `cache` when its tables were built."""
    widths = [rho for rho in inp.unit_choices if rho <= layout.units]
    for rho in widths:
        if (layout, rho) not in cache.placements:
            cache.placements[(layout, rho)] = placement_arrays(inp.cluster, inp.bandwidth, inp.latency, layout, rho)
    sums = tuple(inp.sums[rho * layout.unit] for rho in widths)
    placed = b"".join(a.tobytes() for rho in widths for a in cache.placements[(layout, rho)].values())
    key = (tuple(map(id, sums)), tuple(widths), layout.unit, layout.units, inp.microbatches, inp.max_stages,
           inp.optimizer_factor, inp.holding, hides, keep, placed)  # fmt: skip
    found = cache.solved.get(key)
    if found is None:
        max_stages = min(inp.max_stages, len(inp.blocks), layout.units)
        tables = stage_tables(inp, layout, hides, cache.placements)
        solved = [solve_tables(t, inp.blocks, layout.units, max_stages, inp.microbatches, keep) for t in tables]
        found = cache.solved[key] = (solved, sums)
    return [list(solutions) for solutions in found[0]]


def stage_tables(inp: DpInputs, layout: Layout, hides: tuple[bool, ...], placements: Placements) -> list[Tables]:
    """The DP's stage tables (Tables) with the all-reduce hidden or not per entry of `hides`; everything but the
    all-reduce's exposed part (u) is computed once and shared by all of them."""
    nb = len(inp.blocks)
    k_units = layout.units
    m = inp.microbatches
    upper = np.triu(np.ones((nb, nb), dtype=bool))
    tables: list[Tables] = [{} for _ in hides]
    for rho in inp.unit_choices:
        if rho > k_units:
            continue
        arr = placements.get((layout, rho))
        if arr is None:
            arr = placements[(layout, rho)] = placement_arrays(inp.cluster, inp.bandwidth, inp.latency, layout, rho)
        sums = inp.sums[rho * layout.unit]  # costs at b / r samples per device
        static = static_bytes(sums.param_bytes, inp.optimizer_factor, inp.holding)
        speed = arr["speed"][None, None, :]
        t = sums.work_ms[:, :, None] / speed
        rate = arr["out_rate"][None, None, :]
        with np.errstate(divide="ignore", invalid="ignore"):
            moved = MS_PER_S * sums.cut_after[None, :, None] / rate
            c = np.where(rate == INF, 0.0, arr["out_latency"][None, None, :] + moved)
        c = np.nan_to_num(c, nan=INF)
        grads = sums.param_bytes * inp.holding.grads  # the gradients the ring moves (sim.cost.holding)
        ar = grads[:, :, None] * arr["ring_factor"][None, None, :] + arr["ring_fixed"][None, None, :]
        optimizer = sums.optimizer_ms[:, :, None] / speed  # the optimizer step follows the all-reduce
        cycle = np.maximum(t, c)
        busy = (m - 1) * cycle if m > 1 else None
        # the most microbatches whose activations fit beside the weights (negative: not even the weights)
        act = sums.saved_bytes[:, :, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            room = (arr["memory"][None, None, :] - static[:, :, None]) / act
        room = np.where(static[:, :, None] > arr["memory"][None, None, :], -1.0, np.nan_to_num(room, nan=INF, posinf=INF))
        least_room = np.where(upper, room.min(axis=2), INF)  # over j >= i
        fill = t + 2 * c
        for table, hide in zip(tables, hides, strict=True):
            # the all-reduce starts after the stage's last backward and hides behind the backwards still to
            # run on the stages before it (estimated as if they had this stage's replicas and speed)
            exposed = np.maximum(ar - sums.bwd_before_ms[:, None, None] / speed, 0.0) if hide else ar
            exposed = exposed + optimizer
            u = busy + exposed if busy is not None else np.where(np.isfinite(cycle), exposed, INF)
            table[rho] = (u, fill, room, least_room)
    return tables


def solve_tables(
    tables: Tables, blocks: tuple[tuple[int, int], ...], k_units: int, max_stages: int, m: int, keep: int
) -> list[DpSolution]:
    """partition_dp's recurrence over its stage tables (`tables`, one per width rho, in the order tried: an earlier
    width wins a tie), then the `keep` best (estimate, stage count, units) and their stages."""
    nb = len(blocks)
    shape = (max_stages + 1, nb + 1, k_units + 1)
    value = np.full(shape, INF)  # max part
    filled = np.full(shape, INF)  # fill part
    choice_j = np.full(shape, -1, dtype=np.int64)
    choice_rho = np.zeros(shape, dtype=np.int64)
    value[0, nb, 0] = 0.0
    filled[0, nb, 0] = 0.0
    first_rows, later_units = np.arange(I_BLOCK)[:, None], np.arange(k_units + 1)[None, :]
    for cnt in range(1, max_stages + 1):
        support = _support(value[cnt - 1])
        if support is None:
            break
        best = value[cnt] + filled[cnt]
        inflight = min(cnt, m)
        rows = 1 if cnt == max_stages else nb  # the last count's suffixes of blocks 1.. are never extended
        for rho, (u, fill, room, least_room) in tables.items():
            window = _window(support, k_units - rho + 1)
            if window is None:
                continue
            lo, hi, k0, k1 = window
            # only suffixes the previous count reached: stage i..j with lo <= j < hi (i <= j: inf work otherwise),
            # later stages on k' in [k0, k1) units; every cell left out is inf, so argmin's first minimum is the same
            for i0 in range(0, min(hi, rows), I_BLOCK):
                i1 = min(hi, rows, i0 + I_BLOCK)
                j0 = max(lo, i0)
                obj = np.maximum(value[cnt - 1][None, j0 + 1 : hi + 1, k0:k1], u[i0:i1, j0:hi, k0:k1])
                obj += filled[cnt - 1][None, j0 + 1 : hi + 1, k0:k1]
                obj += fill[i0:i1, j0:hi, k0:k1]
                if least_room[i0:i1, j0:hi].min() < inflight:
                    np.putmask(obj, room[i0:i1, j0:hi, k0:k1] < inflight, INF)
                j_best = np.argmin(obj, axis=1)  # (i - i0, k' - k0)
                obj_best = obj[first_rows[: i1 - i0], j_best, later_units[:, : k1 - k0]]
                better = obj_best < best[i0:i1, rho + k0 : rho + k1]
                if not better.any():
                    continue
                idx_i, idx_k = np.nonzero(better)
                idx_j = j_best[idx_i, idx_k] + j0
                obj_kept = obj_best[idx_i, idx_k]
                idx_i += i0
                idx_k += k0
                value[cnt, idx_i, idx_k + rho] = np.maximum(value[cnt - 1, idx_j + 1, idx_k], u[idx_i, idx_j, idx_k])
                filled[cnt, idx_i, idx_k + rho] = filled[cnt - 1, idx_j + 1, idx_k] + fill[idx_i, idx_j, idx_k]
                choice_j[cnt, idx_i, idx_k + rho] = idx_j
                choice_rho[cnt, idx_i, idx_k + rho] = rho
                best[idx_i, idx_k + rho] = obj_kept
    total = value[:, 0, :] + filled[:, 0, :]
    flat = [(float(total[c, k]), c, k) for c in range(1, max_stages + 1) for k in range(1, k_units + 1) if total[c, k] < INF]
    flat.sort()
    solutions = []
    for estimate, cnt, k in flat[:keep]:
        solutions.append(DpSolution(_reconstruct(choice_j, choice_rho, blocks, cnt, k), estimate))
    return solutions


def _support(value: np.ndarray) -> tuple[int, int, int, int] | None:
    """(first, last) suffix start x and (first, last) units k' where `value` (one stage count's [x, k']) has a finite
    cell; None when it has none."""
    finite = np.isfinite(value)
    if not finite.any():
        return None
    xs = np.flatnonzero(finite.any(axis=1))
    ks = np.flatnonzero(finite.any(axis=0))
    return int(xs[0]), int(xs[-1]), int(ks[0]), int(ks[-1])


def _window(support: tuple[int, int, int, int], positions: int) -> tuple[int, int, int, int] | None:
    """The cells a stage count's step can reach from `support` (the previous count's, _support): last block j in
    [lo, hi) (suffix x = j + 1 >= 1) and later units k' in [k0, k1) below `positions`; None when there are none."""
    x0, x1, ka, kb = support
    lo, hi = max(x0, 1) - 1, x1
    k0, k1 = ka, min(kb + 1, positions)
    if hi <= lo or k1 <= k0:
        return None
    return lo, hi, k0, k1


def _reconstruct(
    choice_j: np.ndarray, choice_rho: np.ndarray, blocks: tuple[tuple[int, int], ...], cnt: int, k: int
) -> tuple[DpStage, ...]:
    """Follow the DP's choices from (all stages, first block, k units) to the end of the model."""
    stages = []
    i = 0
    while cnt > 0:
        j = int(choice_j[cnt, i, k])
        rho = int(choice_rho[cnt, i, k])
        stages.append(DpStage(blocks[i][0], blocks[j][1], k - rho, rho))
        i, k, cnt = j + 1, k - rho, cnt - 1
    return tuple(stages)
