"""DAPPLE's partition-and-placement DP: states placed so far, GPUs per replica used, which GPUs are taken.

For a pipeline of p GPUs per replica and rp replicas (HPGO
`compute_plan_sync`), cell (j, m, taken) holds the best plan of the states up
to j on m+1 GPUs per replica whose GPUs are `taken`; its value is the slowest
block: a stage's compute over its m'·rp GPUs, or the transfer of 2x the cut
activations into it from the previous stage's GPUs. The first stage takes
its GPUs Fresh First (no all-reduce term: HPGO leaves it out); each later
stage every placement of its replicas (dapple.gpus). Per (j, m) the best
cell over all GPU sets is kept and unwound at the end:

    A[j, m, T ∪ G] = min over k ⊂ j, m', placements G of m' GPUs x rp after T:
                     max( A[k, m-m', T], C(k+1..j) / (m' rp), transfer(last GPUs of A[k, m-m', T] -> G, 2 cut_k) )

Reduction (dp_counts): when every GPU set a stage can get costs the same for
its size (all GPUs on one machine, or rp above the largest machine's GPU
count, so each stage spans machines: transfers and all-reduces then take the
collective rate whatever the placement, dapple.comm_times), the taken set drops
out and the DP runs over (j, m) only. Every count sequence is placeable
(Scatter First takes any free GPUs), so its value is the full DP's exactly.
Ties between equal plans may fall otherwise than in HPGO (which visits states
in hash order).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from pipeplan.planner.baselines.dapple.comm_times import LinkRates
from pipeplan.planner.baselines.dapple.gpus import FRESH_FIRST, Machines, place, replica_placements
from pipeplan.planner.baselines.dapple.planning_model import DappleModel


@dataclass(frozen=True, slots=True)
class DappleStage:
    """A stage: states after `after` (-1: from the start) up to `end`, `units` GPUs per replica, and its GPUs per
    replica (bitmasks; None where any placement costs the same and one is chosen later)."""

    after: int
    end: int
    units: int
    parts: tuple[int, ...] | None = None

    @property
    def gpus(self) -> int:
        """All replicas' GPUs (bitmask)."""
        out = 0
        for part in self.parts or ():
            out |= part
        return out


class _Cell(NamedTuple):  # a tuple: the DP makes one per kept (state, level, GPU set), often millions
    time: float
    split: tuple[int, int, int] | None  # (k, m of the prefix, prefix GPU set)
    units: int
    parts: tuple[int, ...]


def placement_free(machines: Machines, replicas: int) -> bool:
    """True when every placement of a stage costs the same for its size (module docstring)."""
    return len(machines.ends) == 1 or replicas > machines.largest


@dataclass(slots=True)
class Levels:
    """dp_sets' cells for one (rp, straight), level by level: level m's cells depend on the levels below it only,
    never on p, so the tables of p GPUs per replica are the first p levels of the tables of any larger p. A
    `reuse` dict handed to dp_sets keeps one Levels per (rp, straight) and each call only adds the levels it lacks
    (the candidates' p = 1..N share rp over long runs: on 32 GPUs p = 17..32 all have rp = 1)."""

    cells: list[list[dict[int, _Cell]]]  # cells[j][m]: GPU set -> cell
    best: list[list[_Cell | None]]  # best[j][m]: the best cell over GPU sets
    seeded: int = 0  # levels given their first-stage cells
    done: int = 1  # levels complete (level 0 holds first-stage cells only)
    placed: dict[tuple[int, int], dict[int, tuple[int, ...]]] = field(default_factory=dict)
    gathered: dict[int, _Level] = field(default_factory=dict)

    def grow(self, levels: int) -> None:
        """Room for `levels` levels in every state's row (rows already longer stay as they are)."""
        for row, top in zip(self.cells, self.best, strict=True):
            row.extend({} for _ in range(levels - len(row)))
            top.extend(None for _ in range(levels - len(top)))


def dp_sets(
    model: DappleModel, machines: Machines, rates: LinkRates, p: int, rp: int, straight: bool, split_idle: bool = True,
    reuse: dict[tuple[int, bool], Levels] | None = None,
) -> tuple[float, list[DappleStage]] | None:  # fmt: skip
    """The best plan of all states on p GPUs per replica and rp replicas, or None (module docstring).

    With `split_idle` False, a pipeline that leaves GPUs idle (p·rp < GPUs) is tried as one stage only, as HPGO does.
    `reuse` (with `split_idle`): the levels computed by earlier calls of the same model and cluster (Levels), the
    same cells as a fresh computation.
    """
    states = model.count
    shared = reuse is not None and split_idle
    levels = reuse.get((rp, straight)) if shared else None
    if levels is None:
        levels = Levels([[] for _ in range(states)], [[] for _ in range(states)])
        if shared:
            reuse[rp, straight] = levels
    levels.grow(p)  # a no-op where earlier calls made room for more levels
    cells, best = levels.cells, levels.best
    for m in range(levels.seeded, 1 if straight else p):
        gpus = place(machines, 0, (m + 1) * rp, FRESH_FIRST)
        if gpus is None:
            continue
        for j in range(states):
            cell = _Cell(float(model.table_s[0, j]) / (m + 1) / rp, None, m + 1, (gpus,))
            cells[j][m][gpus] = cell
            best[j][m] = cell
    levels.seeded = max(levels.seeded, 1 if straight else p)
    if split_idle or p * rp == machines.gpus:
        _recurrence(model, machines, rates, p, rp, straight, levels)
    top = best[states - 1][p - 1]
    if top is None:
        return None
    return top.time, _unwind(cells, top, states - 1)


def _recurrence(model: DappleModel, machines: Machines, rates: LinkRates, p: int, rp: int, straight: bool,
                levels: Levels) -> None:  # fmt: skip
    """Fill every (j, m >= 1) cell of the levels not done yet below p: per (m, m'), every (prefix GPU set,
    placement) pair and every state at once (_step)."""
    states = model.count
    cells, placed, gathered = levels.cells, levels.placed, levels.gathered
    rows = model.table_s[1:, :]  # rows[k, j]: compute of the states after k up to j
    payload = 2.0 * model.cut_bytes
    for m in range(levels.done, p):
        times: dict[int, np.ndarray] = {}  # per GPU set taken at level m, each state's cell time so far
        seeded = {key for j in range(states) for key in cells[j][m]}  # the first stage's sets (Fresh First)
        for mp in range(1, 2 if straight else m + 1):
            prefix = m - mp
            if prefix not in gathered:  # the prefix level is complete: gather it once
                gathered[prefix] = _gather(cells, prefix, states, machines)
            level = gathered[prefix]
            takens, options, of_set = [], [], []
            for t, taken in enumerate(level.sets):
                if (taken, mp) not in placed:
                    placed[taken, mp] = replica_placements(machines, taken, mp, rp)
                here = placed[taken, mp]
                takens.extend([taken] * len(here))
                options.extend(here.items())
                of_set.extend([t] * len(here))
            if options:
                # base[q, k]: max(A[k] of pair q's prefix set, the transfer from its last stage's GPUs into q's GPUs),
                # a function of (prefix set, receiving machine or -1): computed once per distinct such key
                sets = np.array(of_set)
                home = _homes(machines, [gpus for gpus, _ in options])
                _, once, alike = np.unique(sets * (len(machines.ends) + 1) + home + 1, return_index=True, return_inverse=True)
                moves = _moves(rates, level, sets[once], home[once])
                base = np.maximum(level.times[sets[once]], moves * payload)
                _step(levels, m, mp, rows / (mp * rp), (base, alike.reshape(-1)), takens, options, times, seeded)
        levels.done = max(levels.done, m + 1)


CHUNK_VALUES = 1 << 21
"""_step's pairs x states x states block, in float64 values (16 MiB)."""


def _step(levels: Levels, m: int, mp: int, stage: np.ndarray, bases: tuple[np.ndarray, np.ndarray], takens: list[int],
          options: list[tuple[int, tuple[int, ...]]], times: dict[int, np.ndarray], seeded: set[int]) -> None:  # fmt: skip
    """Level m's cells from a last stage of mp GPUs per replica: pair q (prefix set takens[q], placement options[q])
    offers state j low[q, j] = min over k of max(base[q, k], stage[k, j]) (the first such k: at[q, j]), where
    `bases` holds the distinct rows of base and each pair's row among them.

    The same cells as visiting the pairs in order and each state, keeping a cell when strictly better than its
    set's (GPU set takens[q] | placement) cell so far: per (set, j) the first pair reaching the set's minimum,
    kept where below the cell it had; a set new to a state's dict enters it in the order of its first pair with a
    finite time (where the visit would insert it); best[j][m] the first pair, in pair order, of the smallest kept
    time, where below the best so far.
    """
    cells, best = levels.cells, levels.best
    distinct, row = bases
    low, at = _least_splits(distinct, stage)
    low, at = low[row], at[row]
    pairs, states = low.shape
    keys = [taken | gpus for taken, (gpus, _) in zip(takens, options, strict=True)]
    ids: dict[int, int] = {}
    kid = np.array([ids.setdefault(key, len(ids)) for key in keys], dtype=np.int64)
    order = np.argsort(kid, kind="stable")  # pairs grouped by set, in pair order within a set
    sorted_low = low[order]
    starts = np.flatnonzero(np.r_[True, kid[order][1:] != kid[order][:-1]])
    group_min = np.minimum.reduceat(sorted_low, starts, axis=0)  # (set, j)
    index = np.broadcast_to(order[:, None], (pairs, states))
    never = np.int64(pairs)
    first_min = np.minimum.reduceat(
        np.where(sorted_low == group_min[np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, pairs]))], index, never),
        starts,
        axis=0,
    )
    first_finite = np.minimum.reduceat(np.where(np.isfinite(sorted_low), index, never), starts, axis=0)
    set_keys = list(ids)
    before = np.empty((len(set_keys), states))
    for s, key in enumerate(set_keys):
        now = times.get(key)
        if now is None:  # a set no pair reached yet at level m: only the first stage's cells may hold it
            now = (
                np.array([c.time if (c := cells[j][m].get(key)) else np.inf for j in range(states)]) if key in seeded else np.inf
            )
        before[s] = now
    kept = group_min < before
    # the kept cells, state by state, a state's new sets in the order of their first finite pair
    js, ss = np.nonzero(kept.T)
    order = np.lexsort((first_finite[ss, js], js))
    js, ss = js[order], ss[order]
    qs = first_min[ss, js]
    made = zip(js.tolist(), ss.tolist(), qs.tolist(), group_min[ss, js].tolist(), at[qs, js].tolist(), strict=True)
    make, prefix = tuple.__new__, m - mp  # _Cell(...) without NamedTuple's Python-level __new__: the same tuple
    for j, s, q, v, k in made:
        cells[j][m][set_keys[s]] = make(_Cell, (v, (k, prefix, takens[q]), mp, options[q][1]))
    np.copyto(before, group_min, where=kept)
    for s in np.flatnonzero(kept.any(axis=1)).tolist():
        times[set_keys[s]] = before[s].copy()
    # best[j][m]: of the smallest kept time, the set whose first pair reaching it comes first
    offered = np.where(kept, group_min, np.inf)
    smallest = offered.min(axis=0)
    first = np.argmin(np.where(kept & (offered == smallest), first_min, never), axis=0)
    for j in np.flatnonzero(kept.any(axis=0)).tolist():
        top = best[j][m]
        if top is None or smallest[j] < top.time:
            best[j][m] = cells[j][m][set_keys[int(first[j])]]


END_BLOCK = 8
"""_least_splits takes the states j this many at a time, over the splits k below the block's last finite one."""


def _least_splits(base: np.ndarray, stage: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """low[q, j] = min over k of max(base[q, k], stage[k, j]) and at[q, j] its first k (0 where every k is inf).

    A split k past the last finite stage[k, j] of a block of states j offers inf to each of them, so it is left
    out: it can be neither the least value nor, where all are inf, the first k (0). On a chain (stage[k, j]
    finite for k < j only) that halves the (pair, j, k) values; the floats and the first k are argmin's over all k.
    """
    pairs, states = base.shape
    low = np.empty((pairs, states))
    at = np.zeros((pairs, states), dtype=np.int64)
    finite = np.isfinite(stage)
    reach = np.where(finite.any(axis=0), states - np.argmax(finite[::-1], axis=0), 0)  # per j: 1 + last finite k
    by_end = np.ascontiguousarray(stage.T)  # (j, k)
    for j0 in range(0, states, END_BLOCK):
        j1 = min(states, j0 + END_BLOCK)
        width = int(reach[j0:j1].max())
        if width == 0:
            low[:, j0:j1] = np.inf
            continue
        step = max(1, CHUNK_VALUES // ((j1 - j0) * width))
        for a in range(0, pairs, step):
            value = np.maximum(base[a : a + step, None, :width], by_end[None, j0:j1, :width])  # (pair, j, k)
            first = np.argmin(value, axis=2)
            at[a : a + step, j0:j1] = first
            low[a : a + step, j0:j1] = np.take_along_axis(value, first[:, :, None], axis=2)[:, :, 0]
    return low, at


@dataclass(frozen=True, slots=True)
class _Level:
    """A complete level's cells by GPU set taken: the sets (in first-cell order), per set and state the cell time
    (inf: none), and of that cell's last stage's GPUs the count and the count on each machine (0: no cell)."""

    sets: list[int]
    times: np.ndarray  # (set, state)
    senders: np.ndarray  # (set, state)
    on_machine: np.ndarray  # (set, state, machine)


def _gather(cells: list[list[dict[int, _Cell]]], prefix: int, states: int, machines: Machines) -> _Level:
    """Level `prefix` as a _Level."""
    index: dict[int, int] = {}
    rows: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    masks = machines.masks
    counts: dict[int, list[int]] = {}
    for k in range(states):
        for taken, cell in cells[k][prefix].items():
            if taken not in index:
                index[taken] = len(rows)
                rows.append(
                    (np.full(states, np.inf), np.zeros(states, dtype=np.int64), np.zeros((states, len(masks)), dtype=np.int64))
                )
            times, senders, on = rows[index[taken]]
            last = cell.parts[0] if len(cell.parts) == 1 else _union(cell.parts)
            times[k] = cell.time
            senders[k] = last.bit_count()
            if last not in counts:
                counts[last] = [(last & mask).bit_count() for mask in masks]
            on[k] = counts[last]
    return _Level(list(index), np.array([r[0] for r in rows]), np.array([r[1] for r in rows]), np.array([r[2] for r in rows]))


def _homes(machines: Machines, receivers: list[int]) -> np.ndarray:
    """The machine holding each receiving GPU set, -1 where it spans machines."""
    return np.array([machines.machine_of(g.bit_length() - 1) if machines.within_one(g) else -1 for g in receivers])


def _moves(rates: LinkRates, level: _Level, of_set: np.ndarray, home: np.ndarray) -> np.ndarray:
    """transfer_s of one byte (pair, state): from the last stage's GPUs of the state's cell in the pair's prefix set
    into the pair's GPUs, on machine `home` (-1: spread over machines), as transfer_s computes it (the same
    operations, so the same floats); 0 where no cell.

    Receivers on one machine h pay remote_p2p for the senders' share off h, else local; receivers spread over
    machines pay remote_collective (senders and receivers together span machines too)."""
    senders = level.senders[of_set]  # (pair, state)
    local = home >= 0
    on_home = np.zeros_like(senders)
    on_home[local] = np.take_along_axis(level.on_machine[of_set[local]], home[local][:, None, None], axis=2)[:, :, 0]
    remote = senders - on_home
    with np.errstate(divide="ignore", invalid="ignore"):
        p2p = 1.0 / senders * remote / rates.remote_p2p
    out = np.where(remote > 0, p2p, 1.0 / rates.local)
    out[~local] = 1.0 / rates.remote_collective
    out[senders == 0] = 0.0
    return out


def _union(parts: tuple[int, ...]) -> int:
    out = 0
    for part in parts:
        out |= part
    return out


def _unwind(cells: list[list[dict[int, _Cell]]], cell: _Cell, j: int) -> list[DappleStage]:
    """The stages of a cell's plan, first stage first."""
    stages = []
    while cell.split is not None:
        k, mk, taken = cell.split
        stages.append(DappleStage(k, j, cell.units, cell.parts))
        j, cell = k, cells[k][mk][taken]
    stages.append(DappleStage(-1, j, cell.units, None if cell.parts is None else _split(cell.parts[0], cell.units)))
    return list(reversed(stages))


def _split(gpus: int, units: int) -> tuple[int, ...]:
    """A Fresh First set of all replicas cut into replicas of `units` GPUs, lowest indices first."""
    out, part, count = [], 0, 0
    while gpus:
        low = gpus & -gpus
        gpus ^= low
        part |= low
        count += 1
        if count == units:
            out.append(part)
            part, count = 0, 0
    return tuple(out)


def move_rate(machines: Machines, rates: LinkRates) -> float:
    """Seconds per byte of a transfer between stages when placements do not matter (one machine: local)."""
    return 1.0 / (rates.local if len(machines.ends) == 1 else rates.remote_collective)


def dp_counts(model: DappleModel, move_s_per_byte: float, gpus: int, p: int, rp: int, straight: bool,
              split: bool = True) -> tuple[float, list[DappleStage]] | None:  # fmt: skip
    """dp_sets where placements do not matter (module docstring): cells (j, m), transfers at `move_s_per_byte`;
    `split` False: one stage only (dp_sets' `split_idle`)."""
    states = model.count
    if not split:
        if (straight and p > 1) or p * rp > gpus:
            return None
        return float(model.table_s[0, -1]) / p / rp, [DappleStage(-1, states - 1, p)]
    value = np.full((p, states), np.inf)
    back = np.full((p, states, 2), -1, dtype=np.int64)  # (k, m') of each cell's last stage; k = -1: one stage
    for m in range(1 if straight else p):
        if (m + 1) * rp <= gpus:
            value[m] = model.table_s[0] / (m + 1) / rp
    rows = model.table_s[1:, :]
    move = (move_s_per_byte * 2.0 * model.cut_bytes)[:, None]
    for m in range(1, p):
        mps = np.arange(1, 2 if straight else m + 1)
        prefix = value[m - mps]  # (m', k)
        cand = np.maximum(np.maximum(prefix[:, :, None], move[None]), rows[None] / (mps * rp)[:, None, None])
        flat = cand.reshape(len(mps) * states, states)
        at = np.argmin(flat, axis=0)
        low = flat[at, np.arange(states)]
        better = low < value[m]
        value[m] = np.where(better, low, value[m])
        back[m][better] = np.stack([at % states, mps[at // states]], axis=1)[better]
    top = float(value[p - 1, states - 1])
    if not np.isfinite(top):
        return None
    stages = []
    j, m = states - 1, p - 1
    while True:
        k, mp = (int(x) for x in back[m, j])
        if k < 0:
            stages.append(DappleStage(-1, j, m + 1))
            break
        stages.append(DappleStage(k, j, mp))
        j, m = k, m - mp
    return top, list(reversed(stages))
