"""Tests of the static schedule generators: validity for all sizes, exact orders, in-flight bounds, bad input."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeplan.core.errors import ScheduleError
from pipeplan.core.schedule import Action, Schedule
from pipeplan.core.validate import validate
from pipeplan.schedules import (
    SCHEDULES,
    gpipe,
    interleaved_one_f_one_b,
    kfkb,
    make_schedule,
    one_f_one_b,
    zero_bubble_h1,
)
from pipeplan.schedules.interleaved import interleaved_warmup
from pipeplan.schedules.pipemare import pipemare
from pipeplan.schedules.registry import ASYNCHRONOUS, warmup_forwards, warmup_group
from pipeplan.sim import simulate, uniform_costs

NAMES = ("gpipe", "1f1b", "kfkb", "interleaved-1f1b", "zb-h1")


@st.composite
def schedule_args(draw: st.DrawFn, names: tuple[str, ...] = NAMES) -> tuple[str, int, int, int, int]:
    """(name, p, m, k, v) with p <= 16, m <= 64, k <= min(8, m) for kfkb, v <= 4 for interleaved-1f1b (m a multiple
    of p there); k and v are 1 for the schedules that do not take them."""
    name = draw(st.sampled_from(names))
    stages = draw(st.integers(1, 16))
    # interleaved-1f1b needs m = p·j.
    microbatches = stages * draw(st.integers(1, 64 // stages)) if name == "interleaved-1f1b" else draw(st.integers(1, 64))
    k = draw(st.integers(1, min(8, microbatches))) if name == "kfkb" else 1
    chunks = draw(st.integers(1, 4)) if name == "interleaved-1f1b" else 1
    return name, stages, microbatches, k, chunks


def check_generated(schedule: Schedule, name: str, stages: int, microbatches: int, chunks: int) -> None:
    """The shared validator: validate() passes and the shape matches the request."""
    assert validate(schedule) is schedule
    assert schedule.name == name
    assert schedule.num_ranks == stages
    num_stages = stages * chunks if name == "interleaved-1f1b" else stages
    assert schedule.stage_to_rank == tuple(s % stages for s in range(num_stages))
    assert schedule.num_microbatches == microbatches
    ops_per_microbatch = 3 if name == "zb-h1" else 2
    for rank, actions in enumerate(schedule.ranks):
        assert len(actions) == ops_per_microbatch * microbatches * len(schedule.stages_of(rank))


@given(st.sampled_from((*NAMES, "pipemare")), st.integers(1, 8), st.integers(1, 16), st.integers(2, 6), st.integers(2, 4))
def test_a_k_or_chunks_a_schedule_does_not_take_is_refused(name: str, p: int, m: int, k: int, v: int) -> None:
    """k != 1 on anything but kfkb, v != 1 on anything but interleaved-1f1b: refused naming the value and the schedule."""
    if name != "kfkb":
        with pytest.raises(ScheduleError, match=rf"^k={k} applies only to kfkb; schedule '{name}' takes no k$"):
            make_schedule(name, p, m * p, k=k)
    if name != "interleaved-1f1b":
        with pytest.raises(ScheduleError, match=rf"^chunks={v} applies only to interleaved-1f1b; schedule '{name}'"):
            make_schedule(name, p, m * p, chunks=v)


@given(st.integers(1, 8), st.integers(1, 16), st.integers(1, 8))
def test_kfkb_refuses_a_group_larger_than_the_microbatches(p: int, m: int, extra: int) -> None:
    """kfkb with k > m would run as k = m (gpipe) under another label: refused; k = m is gpipe itself."""
    message = rf"kfkb with k={m + extra} > microbatches={m}: .* use k <= {m}, or the schedule gpipe"
    with pytest.raises(ScheduleError, match=message):
        make_schedule("kfkb", p, m, k=m + extra)
    assert make_schedule("kfkb", p, m, k=m).ranks == gpipe(p, m).ranks


def order_peak_inflight(actions: tuple[Action, ...]) -> int:
    """Most microbatches a rank holds: count at each F of started forwards minus finished B/W.

    Actions on one rank run one after another, so this is the peak under any durations.
    """
    count = peak = 0
    for action in actions:
        if action.op == "F":
            count += 1
            peak = max(peak, count)
        elif action.op in "BW":
            count -= 1
    return peak


def texts(schedule: Schedule) -> list[str]:
    """Each rank's actions as one space-separated line."""
    return [" ".join(rank) for rank in schedule.to_text()]


@given(schedule_args())
def test_every_generator_passes_validate(args: tuple[str, int, int, int, int]) -> None:
    """Every registered generator yields a valid schedule of the requested shape for p<=16, m<=64, k<=8, v<=4."""
    name, stages, microbatches, k, chunks = args
    schedule = make_schedule(name, stages, microbatches, k=k, chunks=chunks)
    check_generated(schedule, name, stages, microbatches, chunks)


@pytest.mark.parametrize("name", NAMES)
def test_largest_sizes_are_valid(name: str) -> None:
    """The largest sizes of the range (p=16, m=64, k=8 for kfkb, v=4 for interleaved-1f1b) give valid schedules."""
    k, chunks = (8 if name == "kfkb" else 1), (4 if name == "interleaved-1f1b" else 1)
    check_generated(make_schedule(name, 16, 64, k=k, chunks=chunks), name, 16, 64, chunks)


def test_registry_holds_every_generator() -> None:
    """SCHEDULES names the five synchronous generators and the asynchronous pipemare."""
    assert tuple(SCHEDULES) == (*NAMES, "pipemare")
    assert {"pipemare"} == ASYNCHRONOUS


@st.composite
def pipemare_args(draw: st.DrawFn) -> tuple[int, int, int, int]:
    """(p, m, minibatches n, synchronous minibatches w) with p <= 8, m <= 8, n <= 6, w <= n."""
    n = draw(st.integers(1, 6))
    return draw(st.integers(1, 8)), draw(st.integers(1, 8)), n, draw(st.integers(0, n))


@given(pipemare_args())
def test_pipemare_is_valid_and_steps_each_stage_after_each_minibatch(args: tuple[int, int, int, int]) -> None:
    """Every stage runs F and B of all n·m microbatches and one U per minibatch, right after the B of the
    minibatch's last microbatch; at most p - s microbatches are in flight on stage s (no flush needed)."""
    p, m, n, w = args
    schedule = pipemare(p, m, n, w)
    assert validate(schedule) is schedule and schedule.name == "pipemare"
    assert schedule.num_ranks == p and schedule.num_microbatches == n * m
    for stage, actions in enumerate(schedule.ranks):
        assert sorted(a.microbatch for a in actions if a.op == "F") == list(range(n * m))
        assert sorted(a.microbatch for a in actions if a.op == "B") == list(range(n * m))
        steps = [i for i, a in enumerate(actions) if a.op == "U"]
        assert [actions[i].microbatch for i in steps] == list(range(n))
        assert [actions[i - 1] for i in steps] == [Action(stage, "B", (t + 1) * m - 1) for t in range(n)]
        assert order_peak_inflight(actions) <= p - stage


def test_pipemare_order_streams_across_minibatches() -> None:
    """p = 2, m = 2, two minibatches: stage 0 never drains between them; with one synchronous minibatch it does."""
    assert texts(pipemare(2, 2, 2)) == ["0F0 0F1 0B0 0F2 0B1 0U0 0F3 0B2 0B3 0U1", "1F0 1B0 1F1 1B1 1U0 1F2 1B2 1F3 1B3 1U1"]
    assert texts(pipemare(2, 2, 2, 1))[0] == "0F0 0F1 0B0 0B1 0U0 0F2 0F3 0B2 0B3 0U1"


def test_pipemare_default_minibatches_leave_a_steady_window() -> None:
    """make_schedule covers max(8, 4·ceil(p/m) + 4) minibatches; bad sizes name the field."""
    assert make_schedule("pipemare", 4, 4).num_microbatches == 8 * 4
    assert make_schedule("pipemare", 8, 2).num_microbatches == 20 * 2
    with pytest.raises(ScheduleError, match=r"^minibatches must be an integer >= 1, got 0$"):
        pipemare(2, 2, 0)
    with pytest.raises(ScheduleError, match=r"sync_minibatches must be an integer in 0..3 \(the minibatches\), got 4"):
        pipemare(2, 2, 3, 4)


def test_generators_are_deterministic() -> None:
    """The same arguments give equal schedules."""
    for name in NAMES:
        k, chunks = (2 if name == "kfkb" else 1), (2 if name == "interleaved-1f1b" else 1)
        assert make_schedule(name, 4, 8, k=k, chunks=chunks) == make_schedule(name, 4, 8, k=k, chunks=chunks)


def test_gpipe_order() -> None:
    """GPipe runs every forward, then every backward."""
    assert texts(gpipe(2, 3)) == ["0F0 0F1 0F2 0B0 0B1 0B2", "1F0 1F1 1F2 1B0 1B1 1B2"]


def test_one_f_one_b_order() -> None:
    """1F1B stage r warms up with p-r forwards, then alternates B and F, then drains."""
    assert texts(one_f_one_b(3, 4)) == [
        "0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3",
        "1F0 1F1 1B0 1F2 1B1 1F3 1B2 1B3",
        "2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3",
    ]


def test_one_f_one_b_extra_warmup() -> None:
    """DAPPLE's variant warms stage i up with min(2(p-i)-1, m) forwards."""
    schedule = one_f_one_b(3, 8, extra_warmup=True)
    validate(schedule)
    for stage, actions in enumerate(schedule.ranks):
        first_b = next(i for i, a in enumerate(actions) if a.op == "B")
        assert first_b == min(2 * (3 - stage) - 1, 8)


def test_kfkb_order() -> None:
    """kFkB with k=2 alternates groups of two backwards and two forwards after a warm-up of 2(p-r)."""
    assert texts(kfkb(2, 6, 2)) == [
        "0F0 0F1 0F2 0F3 0B0 0B1 0F4 0F5 0B2 0B3 0B4 0B5",
        "1F0 1F1 1B0 1B1 1F2 1F3 1B2 1B3 1F4 1F5 1B4 1B5",
    ]


def test_kfkb_extremes_are_1f1b_and_gpipe() -> None:
    """kFkB with k=1 is 1F1B and with k>=m is GPipe."""
    assert kfkb(4, 8, 1).ranks == one_f_one_b(4, 8).ranks
    assert kfkb(4, 8, 8).ranks == gpipe(4, 8).ranks


def test_interleaved_order() -> None:
    """Megatron's order for p=2, m=4, v=2: rank 0 warms up with (v-1)p + 2(p-1) = 4 forwards, rank 1 with 2."""
    assert texts(interleaved_one_f_one_b(2, 4, 2)) == [
        "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3",
        "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3",
    ]


@given(st.integers(1, 8), st.integers(1, 8), st.integers(2, 4))
def test_interleaved_warmup_count(stages: int, groups: int, chunks: int) -> None:
    """Rank r runs min((v-1)p + 2(p-1-r), mv) forwards, plus the first steady-state one, before its first backward."""
    microbatches = stages * groups
    schedule = interleaved_one_f_one_b(stages, microbatches, chunks)
    for rank, actions in enumerate(schedule.ranks):
        warmup = min((chunks - 1) * stages + 2 * (stages - 1 - rank), microbatches * chunks)
        assert interleaved_warmup(rank, stages, microbatches, chunks) == warmup
        first_b = next(i for i, a in enumerate(actions) if a.op == "B")
        assert first_b == min(warmup + 1, microbatches * chunks)


def test_interleaved_places_stage_on_rank_s_mod_p() -> None:
    """Chunk-stage s runs on rank s mod p, and each rank holds v chunk-stages."""
    schedule = interleaved_one_f_one_b(3, 6, 4)
    assert schedule.num_stages == 12
    assert schedule.stage_to_rank == tuple(s % 3 for s in range(12))
    for rank, actions in enumerate(schedule.ranks):
        assert {a.stage for a in actions} == {rank, rank + 3, rank + 6, rank + 9}


@given(st.integers(1, 16), st.integers(1, 4))
def test_interleaved_with_one_chunk_is_1f1b(stages: int, groups: int) -> None:
    """interleaved-1f1b with v=1 has exactly 1F1B's order."""
    assert interleaved_one_f_one_b(stages, stages * groups, 1).ranks == one_f_one_b(stages, stages * groups).ranks


def test_interleaved_needs_m_multiple_of_p() -> None:
    """m not a multiple of p is rejected with both values named."""
    with pytest.raises(ScheduleError, match=r"multiple of stages \(p\), got m=6, p=4"):
        interleaved_one_f_one_b(4, 6, 2)
    with pytest.raises(ScheduleError, match="m=6, p=4"):
        make_schedule("interleaved-1f1b", 4, 6, chunks=2)


def test_zb_h1_order() -> None:
    """ZB-H1 for p=3, m=4: 1F1B's warm-up; rank r holds back r W passes and runs them at the tail."""
    assert texts(zero_bubble_h1(3, 4)) == [
        "0F0 0F1 0F2 0I0 0W0 0F3 0I1 0W1 0I2 0W2 0I3 0W3",
        "1F0 1F1 1I0 1F2 1I1 1W0 1F3 1I2 1W1 1I3 1W2 1W3",
        "2F0 2I0 2F1 2I1 2F2 2I2 2W0 2F3 2I3 2W1 2W2 2W3",
    ]


def test_zb_h1_splits_every_backward() -> None:
    """ZB-H1 uses I and W for every microbatch, never a full B."""
    schedule = zero_bubble_h1(4, 8)
    assert schedule.split_backward
    assert not any(a.op == "B" for rank in schedule.ranks for a in rank)


@given(schedule_args(("gpipe", "1f1b", "kfkb", "zb-h1")))
def test_peak_inflight_by_order(args: tuple[str, int, int, int, int]) -> None:
    """Peak in-flight per rank: gpipe m, 1f1b min(p-r, m), kfkb min(k(p-r), m), zb-h1 min(p, m) on every rank."""
    name, p, m, k, chunks = args
    schedule = make_schedule(name, p, m, k=k, chunks=chunks)
    expected = {
        "gpipe": [m] * p,
        "1f1b": [min(p - r, m) for r in range(p)],
        "kfkb": [min(k * (p - r), m) for r in range(p)],
        "zb-h1": [min(p, m)] * p,
    }[name]
    assert [order_peak_inflight(actions) for actions in schedule.ranks] == expected


@pytest.mark.parametrize("name", (*NAMES, "pipemare"))
@pytest.mark.parametrize(
    ("stages", "microbatches", "k", "chunks", "field"),
    [(0, 4, 1, 1, "stages"), (2, 0, 1, 1, "microbatches"), (2, 4, 0, 1, "k"), (2, 4, 1, 0, "chunks"), (-1, 4, 1, 1, "stages")],
)
def test_bad_sizes_are_rejected(name: str, stages: int, microbatches: int, k: int, chunks: int, field: str) -> None:
    """p, m, k or v below 1 raise ScheduleError naming the field and the value, for every schedule."""
    bad = {"stages": stages, "microbatches": microbatches, "k": k, "chunks": chunks}[field]
    with pytest.raises(ScheduleError, match=rf"^{field} must be an integer >= 1, got {bad}$"):
        make_schedule(name, stages, microbatches, k=k, chunks=chunks)


@pytest.mark.parametrize(
    "call",
    [
        lambda: gpipe(2.0, 4),  # type: ignore[arg-type]
        lambda: one_f_one_b(2, True),  # type: ignore[arg-type]
        lambda: kfkb(2, 4, "2"),  # type: ignore[arg-type]
        lambda: interleaved_one_f_one_b(2, 4, 1.5),  # type: ignore[arg-type]
        lambda: zero_bubble_h1(0, 4),
    ],
)
def test_generators_check_their_own_arguments(call: object) -> None:
    """Each generator rejects non-integer or non-positive sizes when called directly."""
    with pytest.raises(ScheduleError, match="must be an integer >= 1"):
        call()  # type: ignore[operator]


def test_unknown_schedule_name() -> None:
    """An unknown name is rejected with the known names listed."""
    with pytest.raises(
        ScheduleError, match=r"unknown schedule 'zb-h9'; choose one of gpipe, 1f1b, kfkb, interleaved-1f1b, zb-h1, pipemare"
    ):
        make_schedule("zb-h9", 2, 4)


# --- closed forms of the generators, checked in the simulator: uniform costs, no transfer time (was test_schedules_timing.py)

# Costs in ms that are exact in binary floating point, so sums compare tightly.
COSTS = st.sampled_from([0.25, 0.5, 1.0, 1.5, 2.0, 3.0])


@given(st.integers(1, 8), st.integers(1, 4), st.integers(1, 4), COSTS, COSTS)
def test_interleaved_iteration_time(stages: int, chunks: int, groups: int, fwd: float, bwd: float) -> None:
    """interleaved-1f1b with chunk costs f/v, b/v and m a multiple of p takes (m + (p-1)/v)(f+b)."""
    microbatches = stages * groups
    schedule = interleaved_one_f_one_b(stages, microbatches, chunks)
    result = simulate(schedule, uniform_costs(schedule, fwd / chunks, bwd / chunks), record=False)
    assert result.iteration_time == pytest.approx((microbatches + (stages - 1) / chunks) * (fwd + bwd))


def test_interleaved_beats_1f1b_by_the_chunk_factor() -> None:
    """For p=4, m=8, f=1, b=2 the bubble shrinks from 3·3 ms (1F1B) to 3·3/v ms with v=3."""
    plain = one_f_one_b(4, 8)
    chunked = interleaved_one_f_one_b(4, 8, 3)
    assert simulate(plain, uniform_costs(plain, 1.0, 2.0)).iteration_time == pytest.approx(33.0)
    assert simulate(chunked, uniform_costs(chunked, 1 / 3, 2 / 3)).iteration_time == pytest.approx(27.0)


@given(st.integers(1, 10), st.integers(0, 12), COSTS)
def test_zb_h1_idle_is_p_minus_1_times_f(stages: int, extra: int, unit: float) -> None:
    """With F = I = W and m >= p, every zb-h1 rank idles (p-1)(F+I-W) and every 1f1b rank (p-1)(F+I+W)."""
    microbatches = stages + extra
    zb = zero_bubble_h1(stages, microbatches)
    zb_result = simulate(zb, uniform_costs(zb, unit, 2 * unit, bwd_input=unit, bwd_weight=unit), record=False)
    ref = one_f_one_b(stages, microbatches)
    ref_result = simulate(ref, uniform_costs(ref, unit, 2 * unit), record=False)
    for rank in range(stages):
        assert zb_result.per_rank[rank].idle == pytest.approx((stages - 1) * (unit + unit - unit))
        assert ref_result.per_rank[rank].idle == pytest.approx((stages - 1) * (unit + 2 * unit))
    assert zb_result.iteration_time == pytest.approx(3 * unit * microbatches + (stages - 1) * unit)


@given(st.integers(1, 10), st.integers(0, 12))
def test_zb_h1_peak_inflight_not_above_1f1b(stages: int, extra: int) -> None:
    """zb-h1's peak in-flight, max over ranks, is p, the same as 1f1b's (an F starts to its W ends)."""
    microbatches = stages + extra
    zb = zero_bubble_h1(stages, microbatches)
    ref = one_f_one_b(stages, microbatches)
    zb_peak = max(r.peak_inflight for r in simulate(zb, uniform_costs(zb, 1.0, 2.0), record=False).per_rank)
    ref_peak = max(r.peak_inflight for r in simulate(ref, uniform_costs(ref, 1.0, 2.0), record=False).per_rank)
    assert zb_peak == ref_peak == stages


@given(st.integers(1, 8), st.integers(0, 12), COSTS, COSTS, COSTS)
def test_zb_h1_idle_with_unequal_costs(stages: int, extra: int, fwd: float, bwd_input: float, bwd_weight: float) -> None:
    """Also with W <= min(F, I), each zb-h1 rank idles exactly (p-1)(F+I-W) when m >= p."""
    bwd_weight = min(bwd_weight, fwd, bwd_input)
    microbatches = stages + extra
    zb = zero_bubble_h1(stages, microbatches)
    costs = uniform_costs(zb, fwd, bwd_input + bwd_weight, bwd_input=bwd_input, bwd_weight=bwd_weight)
    result = simulate(zb, costs, record=False)
    for stats in result.per_rank:
        assert stats.idle == pytest.approx((stages - 1) * (fwd + bwd_input - bwd_weight))


@given(st.integers(2, 8), st.integers(1, 7))
def test_zb_h1_with_fewer_microbatches_than_stages(stages: int, microbatches: int) -> None:
    """For m < p zb-h1 still finishes, holds at most m microbatches per rank, and is no slower than 1f1b."""
    microbatches = min(microbatches, stages - 1)
    zb = zero_bubble_h1(stages, microbatches)
    ref = one_f_one_b(stages, microbatches)
    zb_result = simulate(zb, uniform_costs(zb, 1.0, 2.0, bwd_input=1.0, bwd_weight=1.0), record=False)
    ref_result = simulate(ref, uniform_costs(ref, 1.0, 2.0), record=False)
    assert zb_result.iteration_time <= ref_result.iteration_time
    assert max(r.peak_inflight for r in zb_result.per_rank) == microbatches


@given(st.integers(1, 8), st.integers(1, 24), COSTS, COSTS)
def test_gpipe_and_1f1b_iteration_time(stages: int, microbatches: int, fwd: float, bwd: float) -> None:
    """gpipe and 1f1b take (m+p-1)(f+b) with uniform costs and no transfer time."""
    for schedule in (gpipe(stages, microbatches), one_f_one_b(stages, microbatches)):
        result = simulate(schedule, uniform_costs(schedule, fwd, bwd), record=False)
        assert result.iteration_time == pytest.approx((microbatches + stages - 1) * (fwd + bwd))


@given(st.integers(1, 8), st.integers(1, 24), st.integers(1, 8))
def test_peak_inflight_closed_forms(stages: int, microbatches: int, k: int) -> None:
    """Peak in-flight on stage r: gpipe m, 1f1b min(p-r, m), kfkb min(k(p-r), m)."""

    def peaks(schedule: Schedule) -> list[int]:
        return [r.peak_inflight for r in simulate(schedule, uniform_costs(schedule, 1.0, 2.0), record=False).per_rank]

    ranks = range(stages)
    assert peaks(gpipe(stages, microbatches)) == [microbatches] * stages
    assert peaks(one_f_one_b(stages, microbatches)) == [min(stages - r, microbatches) for r in ranks]
    assert peaks(kfkb(stages, microbatches, k)) == [min(k * (stages - r), microbatches) for r in ranks]


@given(
    st.sampled_from(["gpipe", "1f1b", "kfkb", "zb-h1"]),
    st.integers(min_value=1, max_value=6),
    st.integers(min_value=1, max_value=12),
    st.integers(min_value=1, max_value=12),
)
def test_warmup_forwards_count_the_forwards_before_each_first_backward(name: str, p: int, m: int, k: int) -> None:
    """registry.warmup_forwards (from warmup_group) is, on every rank of the generated schedule, the number of its
    forwards before its first backward (zb-h1: I), counted in the order itself."""
    k = min(k, m) if name == "kfkb" else 1
    counted = []
    for order in make_schedule(name, p, m, k=k).ranks:
        ops = [a.op for a in order]
        first = next(i for i, op in enumerate(ops) if op in ("B", "I"))
        counted.append(ops[:first].count("F"))
    assert warmup_forwards(name, p, m, k) == tuple(counted)
    assert warmup_group(name, m, k) == counted[-1]  # the last stage runs g forwards first


@pytest.mark.parametrize("name", ["interleaved-1f1b", "list", "pipemare"])
def test_a_schedule_without_one_warmup_group_is_refused(name: str) -> None:
    """Only gpipe, 1f1b, kfkb and zb-h1 have one warm-up group."""
    with pytest.raises(ScheduleError, match=name):
        warmup_group(name, 4)


def test_registry_facts_the_planners_read() -> None:
    """The facts planners read instead of comparing names: split backward, interleaving, the kFkB family, the plain one."""
    from pipeplan.schedules.registry import INTERLEAVED, ORDERED, PLAIN, TABLE, WARMUP_FAMILY, splits_backward

    assert [n for n in TABLE if splits_backward(n)] == ["zb-h1"]
    assert not splits_backward("auto")
    assert {"interleaved-1f1b"} == INTERLEAVED
    assert {"gpipe", "1f1b", "kfkb"} == WARMUP_FAMILY
    assert PLAIN == "1f1b"
    assert {"list"} == ORDERED
