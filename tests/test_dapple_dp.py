"""dapple.dp's GPU-set DP (every pair and state of a level at once) and dapple.gpus' bitmask placement policies
against the plain code they replaced, kept here as the reference: a visit of every (prefix set, placement) pair,
state by state, and the policies over lists of free GPUs."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeplan.planner.baselines.dapple.comm_times import HPGO_RATES, LinkRates, transfer_s
from pipeplan.planner.baselines.dapple.dp import DappleStage, _Cell, _least_splits, _unwind, dp_sets
from pipeplan.planner.baselines.dapple.gpus import FRESH_FIRST, POLICIES, SCATTER_FIRST, Machines, place
from pipeplan.planner.baselines.dapple.planning_model import DappleModel, dapple_model
from pipeplan.planner.baselines.pipedream_graph import _graph


def plain_place(machines: Machines, taken: int, need: int, policy: str) -> int | None:
    """The policies over lists of free GPU indices (the code before bitmasks)."""
    count = len(machines.ends)
    free = [[g for g in machines.span(i) if not taken >> g & 1] for i in range(count)]
    picked, left = 0, need
    if policy == SCATTER_FIRST:
        if sum(len(f) for f in free) < need:
            return None
        cursor = [0] * count
        while left:
            for i, f in enumerate(free):
                if left and cursor[i] < len(f):
                    picked |= 1 << f[cursor[i]]
                    cursor[i] += 1
                    left -= 1
        return picked
    want_fresh = policy == FRESH_FIRST
    for i, f in enumerate(free):
        if left and (len(f) == len(machines.span(i))) == want_fresh:
            for g in f[:left]:
                picked |= 1 << g
            left -= len(f[:left])
    return picked if left == 0 else None


def plain_replica_placements(machines: Machines, taken: int, need: int, replicas: int) -> dict[int, tuple[int, ...]]:
    """Every distinct set of `replicas` placements, each by any policy, the first policy sequence kept."""
    frontier: dict[int, tuple[int, ...]] = {taken: ()}
    for _ in range(replicas):
        grown: dict[int, tuple[int, ...]] = {}
        for mask, parts in frontier.items():
            seen: list[int] = []
            for policy in POLICIES:
                gpus = plain_place(machines, mask, need, policy)
                if gpus is not None and gpus not in seen:
                    seen.append(gpus)
                    grown.setdefault(mask | gpus, (*parts, gpus))
        frontier = grown
    return {mask & ~taken: parts for mask, parts in frontier.items()}


def plain_dp_sets(model: DappleModel, machines: Machines, rates: LinkRates, p: int, rp: int,
                  straight: bool) -> tuple[float, list[DappleStage]] | None:  # fmt: skip
    """dp_sets as the visit of every (level, last stage size, prefix set, placement) and state in turn: a cell is
    kept when strictly below its set's cell so far, the best cell of (j, m) when strictly below the best so far."""
    states = model.count
    cells: list[list[dict[int, _Cell]]] = [[{} for _ in range(p)] for _ in range(states)]
    best: list[list[_Cell | None]] = [[None] * p for _ in range(states)]
    for m in range(1 if straight else p):
        gpus = plain_place(machines, 0, (m + 1) * rp, FRESH_FIRST)
        if gpus is None:
            continue
        for j in range(states):
            cell = _Cell(float(model.table_s[0, j]) / (m + 1) / rp, None, m + 1, (gpus,))
            cells[j][m][gpus] = cell
            best[j][m] = cell
    rows = model.table_s[1:, :]
    payload = 2.0 * model.cut_bytes
    for m in range(1, p):
        for mp in range(1, 2 if straight else m + 1):
            prefix = m - mp
            stage = rows / (mp * rp)
            sets: dict[int, list[tuple[int, _Cell]]] = {}
            for k in range(states):
                for taken, cell in cells[k][prefix].items():
                    sets.setdefault(taken, []).append((k, cell))
            for taken, found in sets.items():
                for gpus, parts in plain_replica_placements(machines, taken, mp, rp).items():
                    key = taken | gpus
                    for j in range(states):
                        low, at = np.inf, -1
                        for k, cell in found:
                            last = 0
                            for part in cell.parts:
                                last |= part
                            move = transfer_s(machines, rates, last, gpus, 1.0) * payload[k]
                            value = max(cell.time, move, stage[k, j])
                            if value < low:
                                low, at = value, k
                        now = cells[j][m].get(key)
                        if low < (np.inf if now is None else now.time):
                            cell = _Cell(float(low), (at, prefix, taken), mp, parts)
                            cells[j][m][key] = cell
                            top = best[j][m]
                            if top is None or low < top.time:
                                best[j][m] = cell
    top = best[states - 1][p - 1]
    return None if top is None else (top.time, _unwind(cells, top, states - 1))


def chain_model(costs: list[tuple[float, float, float, float]], batch: int = 8) -> DappleModel:
    """DAPPLE's model of a chain of layers (fwd ms, bwd ms, activation bytes, weight bytes)."""
    names = [f"l{i}" for i in range(len(costs))]
    producers = [() if i == 0 else (i - 1,) for i in range(len(costs))]
    return dapple_model(_graph("chain", 4, names, names, costs, producers), batch)


# few distinct values, so that equal times (ties) are common
layer = st.tuples(st.sampled_from([1.0, 2.0, 4.0, 7.5]), st.sampled_from([1.0, 3.0, 8.0]),
                  st.sampled_from([0.0, 1e6, 3e8]), st.sampled_from([0.0, 1e7, 5e8]))  # fmt: skip
RATES = [HPGO_RATES, LinkRates(25e9, 25e9, 25e9), LinkRates(3e9, 1e8, 2e8)]
shapes = st.sampled_from([(2, 2), (2, 2, 2), (3, 3), (4, 2), (1, 3, 2), (2, 2, 2, 2), (4, 4)])


@settings(max_examples=60, deadline=None)
@given(costs=st.lists(layer, min_size=2, max_size=6), sizes=shapes, p=st.integers(2, 8), replicas=st.integers(1, 3),
       straight=st.booleans(), rates=st.sampled_from(RATES))  # fmt: skip
def test_set_dp_equals_the_plain_visit(costs: list, sizes: tuple[int, ...], p: int, replicas: int, straight: bool,
                                       rates: LinkRates) -> None:  # fmt: skip
    """Value, stages and GPUs of every plan equal the plain visit's, ties included (exactly: the same operations)."""
    machines = Machines(tuple(np.cumsum(sizes).tolist()))
    if p * replicas > machines.gpus:
        return
    model = chain_model(costs)
    assert dp_sets(model, machines, rates, p, replicas, straight) == plain_dp_sets(model, machines, rates, p, replicas, straight)


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(1, 6), min_size=1, max_size=5), taken=st.integers(0, 2**30 - 1),
       need=st.integers(1, 12), policy=st.sampled_from(POLICIES))  # fmt: skip
def test_bitmask_policies_equal_the_list_policies(sizes: list[int], taken: int, need: int, policy: str) -> None:
    """place over bitmasks gives the GPUs (or None) the policies over lists of free GPUs give."""
    machines = Machines(tuple(np.cumsum(sizes).tolist()))
    taken &= (1 << machines.gpus) - 1
    assert place(machines, taken, need, policy) == plain_place(machines, taken, need, policy)


def plain_least_splits(base: np.ndarray, stage: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per pair q and state j, every split k in order: the least max(base[q, k], stage[k, j]) and its first k."""
    pairs, states = base.shape
    low = np.full((pairs, states), np.inf)
    at = np.zeros((pairs, states), dtype=np.int64)
    for q in range(pairs):
        for j in range(states):
            for k in range(states):
                value = max(base[q, k], stage[k, j])
                if value < low[q, j]:
                    low[q, j], at[q, j] = value, k
    return low, at


@settings(max_examples=80, deadline=None)
@given(pairs=st.integers(1, 5), states=st.integers(1, 20), chain=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_least_splits_equal_the_scan_of_every_split(pairs: int, states: int, chain: bool, seed: int) -> None:
    """_least_splits (a block of states over the splits up to its last finite one) gives the least value and the
    first split reaching it of a scan of every split, bit for bit, ties and all-inf states included: on chains
    (stage finite below the diagonal only) and on any pattern of inf."""
    rng = np.random.default_rng(seed)
    base = rng.choice([1.0, 2.0, 3.0, np.inf], size=(pairs, states))
    stage = rng.choice([0.5, 2.0, 3.0, np.inf], size=(states, states))
    if chain:
        stage[np.tril_indices(states)] = np.inf  # stage[k, j] for k < j only
    low, at = _least_splits(base, stage)
    want_low, want_at = plain_least_splits(base, stage)
    assert np.array_equal(low, want_low) and np.array_equal(at, want_at)
