"""Simulator: closed forms, hand-derived transfer timings, queueing, memory, deadlocks, bad costs."""

from __future__ import annotations

import time
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeplan.core.errors import CostError, DeadlockError, ScheduleError
from pipeplan.core.schedule import Schedule
from pipeplan.io.bandwidth_trace_json import bandwidth_trace_from_json
from pipeplan.schedules import make_schedule
from pipeplan.sim import Costs, Flow, StageCost, lower_bound, simulate, uniform_costs
from pipeplan.sim.engine.simulator import simulate_in_time_order

F, B = 1.0, 2.0


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("p", "m"), [(1, 1), (1, 5), (2, 1), (3, 3), (4, 8), (5, 17), (8, 3)])
def test_no_transfer_iteration_is_m_plus_p_minus_1_times_f_plus_b(name: str, p: int, m: int) -> None:
    """Uniform f, b and no transfer time: gpipe and 1f1b take (m+p-1)(f+b) with bubble (p-1)/(m+p-1)."""
    schedule = make_schedule(name, p, m)
    result = simulate(schedule, uniform_costs(schedule, F, B))
    assert result.iteration_time == (m + p - 1) * (F + B)
    assert result.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)
    assert all(r.busy == m * (F + B) for r in result.per_rank)
    assert all(r.idle == (p - 1) * (F + B) for r in result.per_rank)


@pytest.mark.parametrize(("p", "m"), [(1, 4), (3, 2), (4, 4), (4, 9), (6, 20)])
def test_peak_inflight_per_stage_follows_the_warmup_depth(p: int, m: int) -> None:
    """Peak in-flight on stage r: 1f1b min(p-r, m), gpipe m, kfkb min(k(p-r), m)."""
    one = simulate(make_schedule("1f1b", p, m), uniform_costs(make_schedule("1f1b", p, m), F, B))
    assert one.stage_peak_inflight == tuple(min(p - r, m) for r in range(p))
    assert [r.peak_inflight for r in one.per_rank] == [min(p - r, m) for r in range(p)]
    gp = make_schedule("gpipe", p, m)
    assert simulate(gp, uniform_costs(gp, F, B)).stage_peak_inflight == (m,) * p
    for k in (2, 3):
        if k > m:  # a group larger than m is refused (it would run as gpipe)
            continue
        kf = make_schedule("kfkb", p, m, k=k)
        assert simulate(kf, uniform_costs(kf, F, B)).stage_peak_inflight == tuple(min(k * (p - r), m) for r in range(p))


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "kfkb", "zb-h1"])
def test_peak_memory_is_peak_inflight_times_act_bytes(name: str) -> None:
    """With `act_bytes A` (and no static bytes), each rank's peak memory is its peak in-flight count times A."""
    schedule = make_schedule(name, 4, 7, k=2 if name == "kfkb" else 1)
    result = simulate(schedule, uniform_costs(schedule, F, B, comm=0.3, act_bytes=1000.0))
    for rank in result.per_rank:
        assert rank.peak_memory_bytes == rank.peak_inflight * 1000.0


def test_split_backward_keeps_a_microbatch_in_flight_until_its_w() -> None:
    """A microbatch whose I has run but not its W still counts as in flight."""
    schedule = Schedule.from_text([["0F0", "0F1", "0I0", "0I1", "0W0", "0W1"]])
    result = simulate(schedule, uniform_costs(schedule, F, B, act_bytes=10.0))
    assert result.per_rank[0].peak_inflight == 2
    assert result.per_rank[0].peak_memory_bytes == 20.0
    assert result.iteration_time == 2 * F + 2 * B


@pytest.mark.parametrize(
    ("name", "p", "m", "expected"),
    [("gpipe", 2, 4, 16.0), ("gpipe", 3, 4, 20.0), ("1f1b", 2, 4, 17.0), ("1f1b", 3, 4, 22.0)],
)
def test_transfer_time_matches_hand_derivation(name: str, p: int, m: int, expected: float) -> None:
    """f=1, b=2, c=0.5 per boundary (c <= f, b: no transfer ever queues); iteration times derived by hand.

    GPipe: F_i on rank k runs [(i+k)f + kc, (i+k+1)f + kc] (the input arrives
    exactly when the previous F ends), so the last rank's forwards end at
    L = (m+p-1)f + (p-1)c; backward mirrors it, B_i on rank p-1-j ending at
    L + (i+j+1)b + jc; rank 0's last B ends at (m+p-1)(f+b) + 2(p-1)c:
    p=2: 5*3 + 2*0.5 = 16; p=3: 6*3 + 4*0.5 = 20.

    1F1B, p=2, m=4 (rank 0: F0 F1 B0 F2 B1 F3 B2 B3; rank 1: F0 B0 F1 B1 F2 B2 F3 B3):
    r0 F0 [0,1] F1 [1,2]; r1 F0 [1.5,2.5] B0 [2.5,4.5] F1 [4.5,5.5] B1 [5.5,7.5];
    r0 B0 [5,7] (grad at 5) F2 [7,8] B1 [8,10] (grad at 8) F3 [10,11];
    r1 F2 [8.5,9.5] B2 [9.5,11.5] F3 [11.5,12.5] B3 [12.5,14.5];
    r0 B2 [12,14] (grad at 12) B3 [15,17] (grad at 15). Total 17 = (m+1)(f+b) + m*c.

    1F1B, p=3, m=4 (r0: F0 F1 F2 B0 F3 B1 B2 B3; r1: F0 F1 B0 F2 B1 F3 B2 B3; r2: F0 B0 F1 B1 F2 B2 F3 B3):
    r0 F0 [0,1] F1 [1,2] F2 [2,3]; r1 F0 [1.5,2.5] F1 [2.5,3.5]; r2 F0 [3,4] B0 [4,6] F1 [6,7] B1 [7,9];
    r1 B0 [6.5,8.5] F2 [8.5,9.5] B1 [9.5,11.5]; r0 B0 [9,11] F3 [11,12] B1 [12,14];
    r2 F2 [10,11] B2 [11,13]; r1 F3 [12.5,13.5] B2 [13.5,15.5]; r2 F3 [14,15] B3 [15,17];
    r1 B3 [17.5,19.5]; r0 B2 [16,18] B3 [20,22]. Total 22.
    """
    schedule = make_schedule(name, p, m)
    result = simulate(schedule, uniform_costs(schedule, 1.0, 2.0, comm=0.5))
    assert result.iteration_time == pytest.approx(expected)


def test_two_transfers_in_one_direction_queue_but_opposite_directions_do_not() -> None:
    """f=b=1, c=3 on p=2 1f1b: the second activation waits for the first; the gradient overlaps it on the reverse pair."""
    schedule = make_schedule("1f1b", 2, 2)
    result = simulate(schedule, uniform_costs(schedule, 1.0, 1.0, comm=3.0))
    spans = {(t.kind, t.microbatch): (t.start_ms, t.end_ms) for t in result.transfers}
    assert spans[("act", 0)] == (1.0, 4.0)
    assert spans[("act", 1)] == (4.0, 7.0)  # requested at 2, queued behind act 0 on pair 0->1
    assert spans[("grad", 0)] == (6.0, 9.0)  # r1 F0 [4,5] B0 [5,6]; pair 1->0 is free although act 1 is in flight
    assert spans[("grad", 1)] == (9.0, 12.0)  # r1 F1 [7,8] B1 [8,9]
    compute = {(c.rank, c.op, c.microbatch): (c.start_ms, c.end_ms) for c in result.compute}
    assert compute[(0, "B", 0)] == (9.0, 10.0)
    assert compute[(0, "B", 1)] == (12.0, 13.0)
    assert result.iteration_time == 13.0


def _nic_costs(nic: bool) -> Costs:
    """Three stages; boundaries 0 (rank 0->1) and 1 (rank 1->2) both leave through one NIC when `nic`."""
    shared = ("nic:0:out",) if nic else ()
    forward = (
        (Flow(("pair:0->1", *shared), (0, 1), 0.0, 2.0),),
        (Flow(("pair:1->2", *shared), (1, 2), 0.0, 2.0),),
    )
    backward = ((Flow(("pair:1->0",), (1, 0), 0.0, 2.0),), (Flow(("pair:2->1",), (2, 1), 0.0, 2.0),))
    return Costs((StageCost(1.0, 1.0),) * 3, forward, backward)


def test_a_shared_nic_serializes_transfers_of_different_ranks_first_come_first_served() -> None:
    """gpipe p=3 m=2, f=b=1, each transfer 2 ms, both forward boundaries through one NIC; hand-derived.

    act0(mb0) [1,3]; act0(mb1) requested 2, queued -> [3,5]; r1 F0 [3,4];
    act1(mb0) requested 4, NIC busy -> [5,7]; r1 F1 [5,6]; act1(mb1) [7,9];
    r2 F0 [7,8] F1 [9,10] B0 [10,11] B1 [11,12]; grads 2->1 [11,13] [13,15];
    r1 B0 [13,14] B1 [15,16]; grads 1->0 [14,16] [16,18]; r0 B0 [16,17] B1 [18,19].
    Without the NIC act1(mb0) goes at 4 and the iteration is shorter.
    """
    schedule = make_schedule("gpipe", 3, 2)
    shared = simulate(schedule, _nic_costs(True))
    assert shared.iteration_time == 19.0
    act1 = [(t.start_ms, t.end_ms) for t in shared.transfers if t.src_stage == 1 and t.kind == "act"]
    assert act1 == [(5.0, 7.0), (7.0, 9.0)]
    assert simulate(schedule, _nic_costs(False)).iteration_time < 19.0


def test_a_transfer_of_several_flows_ends_with_its_slowest_flow() -> None:
    """Two flows of one transfer on a common resource run one after the other; the transfer ends with the second."""
    flows = (Flow(("pair:0->1", "nic"), (0, 1), 0.0, 2.0), Flow(("pair:0->1b", "nic"), (0, 1), 0.5, 1.0))
    costs = Costs((StageCost(1.0, 1.0),) * 2, (flows,), ((),))
    schedule = make_schedule("gpipe", 2, 1)
    result = simulate(schedule, costs)
    assert [(t.start_ms, t.end_ms) for t in result.transfers] == [(1.0, 4.5)]
    assert result.iteration_time == 4.5 + 1.0 + 1.0 + 1.0


def test_allreduce_and_optimizer_extend_the_iteration() -> None:
    """The iteration ends at the latest (last backward of a stage + its all-reduce + optimizer)."""
    schedule = make_schedule("gpipe", 2, 2)  # no transfers: stage 1's last B ends at 5, stage 0's at 6
    base = (StageCost(1.0, 1.0), StageCost(1.0, 1.0))
    assert simulate(schedule, Costs(base, ((),), ((),))).iteration_time == 6.0
    tail0 = (StageCost(1.0, 1.0, allreduce_ms=2.0, optimizer_ms=1.0), base[1])
    stepped = simulate(schedule, Costs(tail0, ((),), ((),)))
    assert stepped.iteration_time == 9.0
    # the optimizer step is rank 0's work: busy 4 + 1, and the bubble counts it as work too
    assert [r.busy for r in stepped.per_rank] == [5.0, 4.0]
    assert stepped.bubble_fraction == 1.0 - 9.0 / (2 * 9.0)
    tail1 = (base[0], StageCost(1.0, 1.0, allreduce_ms=5.0))
    result = simulate(schedule, Costs(tail1, ((),), ((),)))
    assert result.iteration_time == 10.0
    assert result.per_rank[0].idle == 10.0 - 4.0


def test_cyclic_orders_raise_deadlock_error_with_the_waiting_grid_quickly() -> None:
    """Rank 0 wants a gradient before sending microbatch 1; rank 1 wants microbatch 1 first: DeadlockError, no hang."""
    schedule = Schedule.from_text([["0F0", "0B0", "0F1", "0B1"], ["1F1", "1B1", "1F0", "1B0"]])
    began = time.perf_counter()
    with pytest.raises(DeadlockError, match=r"rank 0: step 1 \[0F0 >0B0<\] waits for 1B/I0 from rank 1"):
        simulate(schedule, uniform_costs(schedule, F, B))
    with pytest.raises(DeadlockError, match=r"rank 1: step 0 \[ >1F1<\] waits for 0F1 from rank 0"):
        simulate_in_time_order(schedule, uniform_costs(schedule, F, B))
    assert time.perf_counter() - began < 1.0


def test_a_backward_before_its_forward_deadlocks_instead_of_running() -> None:
    """A last-stage B placed before its own F waits forever (reported), rather than running on nothing."""
    schedule = Schedule.from_text([["0F0", "0B0"], ["1B0", "1F0"]])
    with pytest.raises(DeadlockError, match="cannot finish"):
        simulate(schedule, uniform_costs(schedule, F, B))


def test_bad_costs_raise_cost_error_naming_field_and_value() -> None:
    """Negative, NaN or wrongly sized costs, or costs for another stage count, raise CostError."""
    schedule = make_schedule("1f1b", 3, 4)
    with pytest.raises(CostError, match=r"fwd must be a finite number >= 0, got -1"):
        uniform_costs(schedule, -1.0, B)
    with pytest.raises(CostError, match=r"comm\[1\] must be a finite number >= 0, got nan"):
        uniform_costs(schedule, F, B, comm=[0.1, float("nan")])
    with pytest.raises(CostError, match=r"comm must have 2 values \(one per stage boundary\), got 3"):
        uniform_costs(schedule, F, B, comm=[0.1, 0.2, 0.3])
    with pytest.raises(CostError, match=r"act_bytes must have 3 values \(one per stage\), got 2"):
        uniform_costs(schedule, F, B, act_bytes=[1, 2])
    with pytest.raises(CostError, match=r"bwd_input\[0\] must be a finite number >= 0, got inf"):
        uniform_costs(schedule, F, B, bwd_input=[float("inf"), 1, 1])
    other = make_schedule("1f1b", 2, 4)
    with pytest.raises(CostError, match=r"costs cover 2 stages but schedule '1f1b' has 3 stages"):
        simulate(schedule, uniform_costs(other, F, B))


def test_an_action_on_a_rank_that_does_not_hold_its_stage_raises_schedule_error() -> None:
    """The simulator refuses an action placed on the wrong rank, naming rank, position and action."""
    schedule = Schedule(make_schedule("gpipe", 2, 1).ranks, (0, 0), "moved")
    with pytest.raises(ScheduleError, match=r"rank 1, position 0, action 1F0: stage 1 belongs to rank 0"):
        simulate(schedule, uniform_costs(schedule, F, B))


def test_per_stage_costs_and_the_lower_bound() -> None:
    """Per-stage lists set each stage's times; the bound is the busiest rank or one microbatch's path."""
    schedule = make_schedule("1f1b", 3, 6)
    costs = uniform_costs(schedule, [1.0, 2.0, 1.0], [2.0, 4.0, 2.0], comm=[0.5, 0.25])
    result = simulate(schedule, costs)
    assert [r.busy for r in result.per_rank] == [18.0, 36.0, 18.0]
    assert result.lower_bound == lower_bound(schedule, costs) == 36.0
    assert result.efficiency == pytest.approx(36.0 / result.iteration_time)
    single = make_schedule("gpipe", 3, 1)
    path = uniform_costs(single, [1.0, 2.0, 1.0], [2.0, 4.0, 2.0], comm=[0.5, 0.25])
    assert lower_bound(single, path) == 1 + 2 + 1 + 2 + 4 + 2 + 2 * (0.5 + 0.25)
    assert simulate(single, path).iteration_time == lower_bound(single, path)


def test_record_false_gives_the_same_numbers_without_a_timeline() -> None:
    """record=False skips only the timeline."""
    schedule = make_schedule("zb-h1", 4, 8)
    costs = uniform_costs(schedule, F, B, comm=0.2, act_bytes=5.0)
    full, bare = simulate(schedule, costs), simulate(schedule, costs, record=False)
    assert bare.compute == () and bare.transfers == ()
    assert (bare.iteration_time, bare.per_rank, bare.lower_bound) == (full.iteration_time, full.per_rank, full.lower_bound)
    assert len(full.compute) == 4 * 8 * 3 and len(full.transfers) == 2 * 3 * 8


def test_timeline_spans_follow_rank_order_without_overlap() -> None:
    """Each rank's compute spans come in its schedule order and never overlap; transfers start after their producer."""
    schedule = make_schedule("interleaved-1f1b", 4, 8, chunks=2)
    result = simulate(schedule, uniform_costs(schedule, 0.5, 1.0, comm=0.1))
    for rank, actions in enumerate(schedule.ranks):
        spans = [c for c in result.compute if c.rank == rank]
        assert [f"{c.stage}{c.op}{c.microbatch}" for c in spans] == [str(a) for a in actions]
        assert all(a.end_ms <= b.start_ms for a, b in pairwise(spans))
    ends = {(c.stage, c.op, c.microbatch): c.end_ms for c in result.compute}
    for t in result.transfers:
        assert t.start_ms >= ends[(t.src_stage, "F" if t.kind == "act" else "B", t.microbatch)]


schedules = st.sampled_from(["gpipe", "1f1b", "kfkb", "zb-h1", "interleaved-1f1b"])


@given(
    name=schedules,
    p=st.integers(1, 5),
    mult=st.integers(1, 3),
    k=st.integers(1, 3),
    chunks=st.integers(1, 3),
    data=st.data(),
)
def test_dataflow_and_time_order_loops_agree_and_respect_the_lower_bound(
    name: str, p: int, mult: int, k: int, chunks: int, data: st.DataObject
) -> None:
    """On random per-stage costs and traces both event loops give the same result, never below the lower bound."""
    k, chunks = (min(k, p * mult) if name == "kfkb" else 1), (chunks if name == "interleaved-1f1b" else 1)
    schedule = make_schedule(name, p, p * mult, k=k, chunks=chunks)
    stages = schedule.num_stages
    times = st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0, 1.5, 3.0]), min_size=stages, max_size=stages)
    costs = uniform_costs(
        schedule,
        data.draw(times),
        data.draw(times),
        comm=data.draw(st.lists(st.sampled_from([0.0, 0.1, 0.75, 2.0]), min_size=stages - 1, max_size=stages - 1)),
        act_bytes=data.draw(times),
    )
    steps = data.draw(
        st.lists(
            st.fixed_dictionaries(
                {
                    "t_ms": st.sampled_from([0.0, 0.5, 2.0, 7.0]),
                    "link": st.one_of(st.just("all"), st.sampled_from([[0, 1], [1, 0], [1, 2], [2, 1]])),
                    "factor": st.sampled_from([0.25, 0.5, 2.0]),
                }
            ),
            max_size=3,
        )
    )
    trace = bandwidth_trace_from_json(sorted(steps, key=lambda s: s["t_ms"])) if steps else None
    fast = simulate(schedule, costs, trace)
    assert fast == simulate_in_time_order(schedule, costs, trace)
    assert fast.lower_bound <= fast.iteration_time * (1 + 1e-12)


def test_same_inputs_give_identical_results() -> None:
    """Two runs of the same simulation are equal, timeline included."""
    schedule = make_schedule("kfkb", 4, 12, k=2)
    costs = uniform_costs(schedule, [1.0, 1.5, 1.0, 0.5], 2.0, comm=[0.3, 1.2, 0.1])
    assert simulate(schedule, costs) == simulate(schedule, costs)


def test_an_optimizer_step_in_the_schedule_runs_on_the_rank_and_leaves_the_tail() -> None:
    """A U action takes optimizer_ms on its rank; the stage's tail after its last backward is then the all-reduce only."""
    costs = Costs((StageCost(1.0, 2.0, allreduce_ms=1.0, optimizer_ms=0.5),), (), ())
    with_u = simulate(Schedule.from_text([["0F0", "0B0", "0U0"]]), costs)
    assert with_u.iteration_time == 4.0  # B ends at 3; U [3, 3.5]; all-reduce ends at 4
    assert with_u.per_rank[0].busy == 3.5
    assert simulate(Schedule.from_text([["0F0", "0B0"]]), costs).iteration_time == 4.5
