"""Partition and replication by dynamic programming over (layer suffix, devices used, stages after).

The DP runs from the last layer backwards, so a new stage knows how many
stages follow it: that is its 1F1B in-flight count, which bounds its
activation memory. Stage placements come from a Layout; the pipeline's last
stage sits at position 0 of the device order and earlier stages at higher
positions, so unused devices are the tail of the order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeplan.core.hardware.cluster import Cluster
from pipeplan.core.shared_params import SharedGroup
from pipeplan.core.units import MS_PER_S
from pipeplan.planner.phase_clock import timed_phase
from pipeplan.planner.search.mapping import Layout
from pipeplan.sim.cost.layers import LayerCosts, static_bytes
from pipeplan.sim.cost.link_model import link_arrays, ring_allreduce_terms

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

    @property
    def blocks(self) -> tuple[tuple[int, int], ...]:
        """The blocks the DP cuts between."""
        return next(iter(self.sums.values())).blocks


I_BLOCK = 32
"""The DP's step takes first blocks i this many at a time, each with only the last blocks j >= i (the rest is inf)."""

CHUNK_ENTRIES = 1 << 20
"""Placement arrays are built this many (position, device) entries at a time, which bounds their memory."""


def _placement_arrays(inp: DpInputs, layout: Layout, rho: int) -> dict[str, np.ndarray]:
    """Per first unit a of a stage of `rho` units: min speed, min memory, ring all-reduce terms, outgoing link.

    The stage at unit a runs on layout.devices(a, rho); its outgoing transfer goes to a stage assumed to have as
    many replicas, just below it in the order (device i of the one paired with device i of the other). All
    positions at once, as index arrays, a chunk of CHUNK_ENTRIES at a time.
    """
    positions = layout.units - rho + 1
    r = rho * layout.unit
    order = np.asarray(layout.order, dtype=np.int64)
    devices_all = inp.cluster.devices
    device_speed = np.array([d.speed for d in devices_all], dtype=float)
    device_memory = np.array([d.memory_bytes for d in devices_all], dtype=float)
    speed = np.empty(positions)
    memory = np.empty(positions)
    ring_factor = np.zeros(positions)  # all-reduce ms per param byte
    ring_fixed = np.zeros(positions)
    out_rate = np.full(positions, INF)
    out_latency = np.zeros(positions)
    width = r * layout.replicas
    step = max(1, CHUNK_ENTRIES // width)
    for lo in range(0, positions, step):
        first = np.arange(lo, min(positions, lo + step))
        devs = order[_stage_indices(layout, first, r)]  # [a, i] = layout.devices(a, rho)[i]
        speed[first] = device_speed[devs].min(axis=1)
        memory[first] = device_memory[devs].min(axis=1)
        if width > 1:
            ring_factor[first], ring_fixed[first] = _ring_terms(inp.cluster, devs)
        below = first > 0
        if below.any():
            src = devs[below]
            dst = order[_below_indices(layout, first[below], r)]
            rate = np.minimum(inp.bandwidth[src, dst], inp.bandwidth[dst, src]).min(axis=1)
            out_rate[first[below]] = np.where(rate > 0, rate * r, 0.0)
            latency = np.maximum(inp.latency[src, dst].max(axis=1), inp.latency[dst, src].max(axis=1))
            out_latency[first[below]] = latency
    return {
        "speed": speed,
        "memory": memory,
        "ring_factor": ring_factor,
        "ring_fixed": ring_fixed,
        "out_rate": out_rate,
        "out_latency": out_latency,
    }


def _stage_indices(layout: Layout, first_units: np.ndarray, r: int) -> np.ndarray:
    """Indices into layout.order of the devices of a stage of r positions at each unit of `first_units`, in
    Layout.devices's order (one row per stage)."""
    start = first_units * layout.unit
    if layout.replica_major:
        within = (np.arange(layout.replicas)[:, None] * layout.per_pipeline + np.arange(r)[None, :]).ravel()
        return start[:, None] + within[None, :]
    return start[:, None] * layout.replicas + np.arange(r * layout.replicas)[None, :]


def _below_indices(layout: Layout, first_units: np.ndarray, r: int) -> np.ndarray:
    """Indices into layout.order of the stage just below each stage of `first_units` (r positions per pipeline
    replica, clipped at the stage's first position), replica-major: the destinations of its outgoing transfer."""
    top = first_units * layout.unit
    low = np.maximum(0, top - r)
    position = np.minimum(low[:, None] + np.arange(r)[None, :], top[:, None] - 1)[:, None, :]  # [a, 1, i]
    replica = np.arange(layout.replicas)[None, :, None]
    if layout.replica_major:
        index = replica * layout.per_pipeline + position
    else:
        unit_first = (position // layout.unit) * layout.unit
        index = unit_first * layout.replicas + replica * layout.unit + (position - unit_first)
    return index.reshape(len(first_units), -1)


def _ring_terms(cluster: Cluster, devs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ring_allreduce_terms of every row of `devs` (each a ring in the given order), as arrays."""
    rate, latency = link_arrays(cluster)
    nxt = np.roll(devs, -1, axis=1)
    rates = rate[devs, nxt]
    if not (rates > 0).all():
        for row in devs:  # raises, naming the first pair that cannot talk
            ring_allreduce_terms(cluster, tuple(int(d) for d in row))
    n = devs.shape[1]
    if cluster.allreduce_bytes_per_s is not None:
        bandwidth = np.full(len(devs), cluster.allreduce_bytes_per_s)
        slowest_latency = np.full(len(devs), cluster.allreduce_latency_ms)
    else:
        bandwidth = rates.min(axis=1)
        slowest_latency = latency[devs, nxt].max(axis=1)
    return MS_PER_S * 2 * (n - 1) / n / bandwidth, 2 * (n - 1) * slowest_latency


Tables = dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]
"""Per stage width rho (units): u, fill and room of a stage of blocks i..j whose later stages use k' units ([i, j, k'],
inf work where j < i), and the least room over k' of each (i, j) (inf where j < i)."""


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
    nb = len(inp.blocks)
    k_units = layout.units
    m = inp.microbatches
    max_stages = min(inp.max_stages, nb, k_units)
    tables: Tables = {}
    for rho in inp.unit_choices:
        if rho > k_units:
            continue
        arr = _placement_arrays(inp, layout, rho)
        sums = inp.sums[rho * layout.unit]  # costs at b / r samples per device
        static = static_bytes(sums.param_bytes, inp.optimizer_factor)
        speed = arr["speed"][None, None, :]
        t = sums.work_ms[:, :, None] / speed
        rate = arr["out_rate"][None, None, :]
        with np.errstate(divide="ignore", invalid="ignore"):
            moved = MS_PER_S * sums.cut_after[None, :, None] / rate
            c = np.where(rate == INF, 0.0, arr["out_latency"][None, None, :] + moved)
        c = np.nan_to_num(c, nan=INF)
        ar = sums.param_bytes[:, :, None] * arr["ring_factor"][None, None, :] + arr["ring_fixed"][None, None, :]
        # the all-reduce starts after the stage's last backward and hides behind the backwards still to
        # run on the stages before it (estimated as if they had this stage's replicas and speed)
        drain = sums.bwd_before_ms[:, None, None] / speed
        exposed = np.maximum(ar - drain, 0.0) if inp.hide_allreduce else ar
        exposed = exposed + sums.optimizer_ms[:, :, None] / speed  # the optimizer step follows the all-reduce
        cycle = np.maximum(t, c)
        u = (m - 1) * cycle + exposed if m > 1 else np.where(np.isfinite(cycle), exposed, INF)
        # the most microbatches whose activations fit beside the weights (negative: not even the weights)
        act = sums.saved_bytes[:, :, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            room = (arr["memory"][None, None, :] - static[:, :, None]) / act
        room = np.where(static[:, :, None] > arr["memory"][None, None, :], -1.0, np.nan_to_num(room, nan=INF, posinf=INF))
        least_room = np.where(np.triu(np.ones((nb, nb), dtype=bool)), room.min(axis=2), INF)  # over j >= i
        tables[rho] = (u, t + 2 * c, room, least_room)
    return solve_tables(tables, inp.blocks, k_units, max_stages, m, keep)


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
        for rho, (u, fill, room, least_room) in tables.items():
            window = _window(support, k_units - rho + 1)
            if window is None:
                continue
            lo, hi, k0, k1 = window
            # only suffixes the previous count reached: stage i..j with lo <= j < hi (i <= j: inf work otherwise),
            # later stages on k' in [k0, k1) units; every cell left out is inf, so argmin's first minimum is the same
            for i0 in range(0, hi, I_BLOCK):
                i1 = min(hi, i0 + I_BLOCK)
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
