"""Tests of the dapple baseline's pieces: placement policies, link times, the pivot latency, the DP and its reduction."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeplan.core.downsets import bits
from pipeplan.core.errors import PlanError
from pipeplan.planner.baselines.dapple.comm_times import HPGO_RATES, allreduce_s, transfer_s
from pipeplan.planner.baselines.dapple.dp import dp_counts, dp_sets, move_rate, placement_free
from pipeplan.planner.baselines.dapple.gpus import (
    APPEND_FIRST,
    FRESH_FIRST,
    SCATTER_FIRST,
    Machines,
    place,
    replica_placements,
)
from pipeplan.planner.baselines.dapple.pivot import latency, pivot
from pipeplan.planner.baselines.dapple.planning_model import dapple_model
from pipeplan.planner.baselines.pipedream_graph import _graph

TWO = Machines((4, 8))


def test_placement_policies_on_two_machines() -> None:
    """Machine 0 half used: Fresh First opens machine 1, Append First fills machine 0, Scatter First alternates."""
    taken = 0b0011
    assert bits(place(TWO, taken, 2, FRESH_FIRST) or 0) == [4, 5]
    assert bits(place(TWO, taken, 2, APPEND_FIRST) or 0) == [2, 3]
    assert bits(place(TWO, 0, 3, SCATTER_FIRST) or 0) == [0, 1, 4]
    assert place(TWO, 0b01111111, 2, FRESH_FIRST) is None
    assert place(TWO, 0, 2, APPEND_FIRST) is None  # nothing is partly used yet


def test_replica_placements_are_distinct_and_remember_the_first_sequence() -> None:
    """Two replicas of two GPUs on 2x4 GPUs: every distinct set once, each with its replicas' GPUs in order."""
    found = replica_placements(TWO, 0, 2, 2)
    assert len(found) == len(set(found))
    assert found[0b00110011] == (0b00000011, 0b00110000)  # Fresh First twice
    for mask, parts in found.items():
        assert sum(p.bit_count() for p in parts) == 4 and (parts[0] | parts[1]) == mask


def test_transfer_and_allreduce_follow_hpgo_rules() -> None:
    """Into one machine: the remote senders' share at the point-to-point rate; spread: the collective rate; an
    all-reduce inside a machine at the local rate times floor(n/2)."""
    one_remote = transfer_s(TWO, HPGO_RATES, 0b00010001, 0b00000010, 1e9)  # half the senders on machine 1
    assert one_remote == pytest.approx(1e9 / 2 / 1e9)
    assert transfer_s(TWO, HPGO_RATES, 0b1, 0b10, 1e9) == pytest.approx(1e9 / 25e9)
    assert transfer_s(TWO, HPGO_RATES, 0b1, 0b00110000 | 0b10, 3e9) == pytest.approx(1.0)
    assert allreduce_s(TWO, HPGO_RATES, 0b1111, 1e9) == pytest.approx(2 * 1e9 * 3 / 4 / 25e9 / 2)
    assert allreduce_s(TWO, HPGO_RATES, 0b00010001, 3e9) == pytest.approx(2 * 3e9 / 2 / 3e9)
    assert allreduce_s(TWO, HPGO_RATES, 0b1, 1e9) == 0.0


def test_pivot_latency_uniform_is_the_1f1b_closed_form() -> None:
    """Equal stages without all-reduce: L = (M + S - 1)(F + B), pivot the last stage."""
    value, q = latency([1.0] * 3, [2.0] * 3, [0.0] * 3, 4)
    assert q == 2 and value == pytest.approx((4 + 3 - 1) * 3.0)


def test_pivot_latency_hand_case_with_slow_middle_stage() -> None:
    """F=[1,3,1], B=[2,6,2], M=4: the middle stage is the pivot, L = 4 + 3*9 + 8; a last-stage all-reduce of 20 ends it."""
    assert pivot([1.0, 3.0, 1.0], [2.0, 6.0, 2.0], 4) == 1
    assert latency([1.0, 3.0, 1.0], [2.0, 6.0, 2.0], [0.0] * 3, 4)[0] == pytest.approx(4 + 27 + 8)
    assert latency([1.0, 3.0, 1.0], [2.0, 6.0, 2.0], [0.0, 0.0, 20.0], 4)[0] == pytest.approx(4 + 27 + 20)


def test_latency_rejects_bad_lists() -> None:
    """Lists of different lengths or no microbatch: a PlanError naming the values."""
    with pytest.raises(PlanError, match="equal, non-empty"):
        latency([1.0], [1.0, 2.0], [0.0], 2)
    with pytest.raises(PlanError, match="at least one microbatch, got 0"):
        latency([1.0], [1.0], [0.0], 0)


def chain_model(costs: list[tuple[float, float, float, float]], batch: int = 8):  # type: ignore[no-untyped-def]
    """DAPPLE's model of a chain of layers (fwd ms, bwd ms, activation bytes, weight bytes)."""
    names = [f"l{i}" for i in range(len(costs))]
    producers = [() if i == 0 else (i - 1,) for i in range(len(costs))]
    return dapple_model(_graph("chain", 4, names, names, costs, producers), batch)


layer = st.tuples(st.floats(0.1, 50.0), st.floats(0.1, 50.0), st.floats(0.0, 5e8), st.floats(0.0, 5e8))


@settings(max_examples=25, deadline=None)
@given(costs=st.lists(layer, min_size=2, max_size=7), sizes=st.sampled_from([(1,) * 6, (2, 2, 2), (6,)]),
       p=st.integers(1, 3), straight=st.booleans())  # fmt: skip
def test_placement_free_dp_equals_the_set_dp(costs: list, sizes: tuple[int, ...], p: int, straight: bool) -> None:
    """Where placements cannot matter (one machine, or more replicas than a machine's GPUs), the DP over (state,
    GPUs) finds the value of the DP over GPU sets exactly."""
    ends = tuple(np.cumsum(sizes).tolist())
    machines = Machines(ends)
    model = chain_model(costs)
    rp = machines.gpus // p
    if not placement_free(machines, rp):
        rp = machines.largest + 1
        p = machines.gpus // rp
        if p < 1:
            return
    full = dp_sets(model, machines, HPGO_RATES, p, rp, straight)
    fast = dp_counts(model, move_rate(machines, HPGO_RATES), machines.gpus, p, rp, straight)
    assert (full is None) == (fast is None)
    if full is not None and fast is not None:
        assert fast[0] == pytest.approx(full[0], rel=1e-12)
        assert sum(s.units for s in fast[1]) == p


def test_set_dp_covers_every_state_once_on_the_gpus_asked_for() -> None:
    """Two 4-GPU machines, p = 4, rp = 2: the stages cover the states in order, use 4 GPUs per replica, no GPU twice."""
    model = chain_model([(5.0, 10.0, 1e8, 1e7), (1.0, 2.0, 1e8, 1e9), (5.0, 10.0, 1e6, 1e7), (3.0, 3.0, 1e8, 1e7)])
    found = dp_sets(model, TWO, HPGO_RATES, 4, 2, False)
    assert found is not None
    stages = found[1]
    assert stages[0].after == -1 and stages[-1].end == model.count - 1
    assert all(a.end == b.after for a, b in itertools.pairwise(stages))
    assert sum(s.units for s in stages) == 4
    used = [g for s in stages for g in bits(s.gpus)]
    assert len(used) == len(set(used)) == 8


@settings(max_examples=20, deadline=None)
@given(costs=st.lists(layer, min_size=2, max_size=6), sizes=st.sampled_from([(2, 2, 2), (3, 3), (4, 2), (2, 2, 2, 2)]),
       straight=st.booleans(), descending=st.booleans())  # fmt: skip
def test_set_dp_reusing_levels_equals_a_fresh_dp(costs: list, sizes: tuple[int, ...], straight: bool, descending: bool) -> None:
    """dp_sets with one `reuse` dict over every p (ascending, as the candidates ask, or descending) gives the same
    value and stages as a fresh DP for each p: level m's cells do not depend on p."""
    machines = Machines(tuple(np.cumsum(sizes).tolist()))
    model = chain_model(costs)
    reuse: dict = {}
    counts = range(machines.gpus, 0, -1) if descending else range(1, machines.gpus + 1)
    for p in counts:
        rp = machines.gpus // p
        assert dp_sets(model, machines, HPGO_RATES, p, rp, straight, reuse=reuse) == dp_sets(
            model, machines, HPGO_RATES, p, rp, straight
        )
