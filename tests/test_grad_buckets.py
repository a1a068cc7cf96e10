"""Tests for sim.cost.grad_buckets and the simulator's bucketed all-reduce (DDP's overlap with the backward)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeplan.core.errors import CostError, PlanError
from pipeplan.core.plan import Plan, Stage
from pipeplan.io.bandwidth_trace_json import bandwidth_trace_from_json
from pipeplan.presets.resolve import load_cluster, load_profile
from pipeplan.schedules import make_schedule
from pipeplan.sim import Costs, StageCost, lower_bound, simulate, uniform_costs
from pipeplan.sim.cost.grad_buckets import DDP_BUCKET_BYTES, fill_buckets, ready_fractions
from pipeplan.sim.cost.link_model import ring_allreduce_parts
from pipeplan.sim.cost.model import CostModel
from pipeplan.sim.cost.plan_costs import plan_costs
from pipeplan.sim.cost.types import GradBucket
from pipeplan.sim.engine.iterations import allreduce_durations
from pipeplan.sim.engine.simulator import simulate_in_time_order


def test_buckets_fill_in_reverse_layer_order_until_the_cap_and_skip_layers_without_parameters() -> None:
    """Layers 4 and 3 reach the cap together, 2 carries it over alone, 1 holds nothing, 0 is the last bucket."""
    assert fill_buckets([10.0, 0.0, 30.0, 20.0, 5.0], 25.0) == [[4, 3], [2], [0]]
    assert fill_buckets([1.0, 1.0, 1.0], 100.0) == [[2, 1, 0]]
    assert fill_buckets([0.0, 0.0], 1.0) == []


def test_a_bucket_is_ready_when_the_backward_has_passed_its_lowest_layer() -> None:
    """The backward runs layers last to first: bucket [4, 3] is ready after layers 4 and 3, 9 of 15 ms."""
    assert ready_fractions([1.0, 2.0, 3.0, 4.0, 5.0], [[4, 3], [2], [0]]) == [9.0 / 15.0, 12.0 / 15.0, 1.0]
    assert ready_fractions([0.0, 0.0], [[1], [0]]) == [1.0, 1.0]


def _one_stage(buckets: tuple[GradBucket, ...], fwd: float, bwd: float, optimizer: float) -> Costs:
    total = sum(b.allreduce_ms for b in buckets)
    latency = sum(b.latency_ms for b in buckets)
    stage = StageCost(
        fwd, bwd, allreduce_ms=total, optimizer_ms=optimizer, allreduce_latency_ms=latency, allreduce_buckets=buckets
    )
    return Costs((stage,), (), ())


def test_one_stage_bucketed_allreduce_ends_at_the_closed_form() -> None:
    """m microbatches of f + b on one rank: bucket k starts at max(the last B's start + f_k b, bucket k-1's end);
    the iteration ends at the last bucket's end plus the optimizer step."""
    fwd, bwd, optimizer, m = 0.7, 1.3, 0.11, 3
    buckets = (GradBucket(0.2, 0.9, 0.05), GradBucket(0.45, 0.1, 0.05), GradBucket(1.0, 0.37, 0.05))
    result = simulate(make_schedule("1f1b", 1, m), _one_stage(buckets, fwd, bwd, optimizer))
    backward_end = 0.0
    for _ in range(m):
        backward_end = backward_end + fwd + bwd
    begin = backward_end - bwd
    end = begin
    expected_spans = []
    for b in buckets:
        start = max(begin + b.ready_fraction * bwd, end)
        end = start + b.allreduce_ms
        expected_spans.append((start, end))
    assert result.iteration_time == pytest.approx(end + optimizer, rel=1e-12, abs=1e-12)
    got = [t for c in result.collectives for t in (c.start_ms, c.end_ms)]
    assert got == pytest.approx([t for span in expected_spans for t in span], rel=1e-12, abs=1e-12)
    assert expected_spans[0][0] < backward_end  # the first bucket overlaps the backward
    assert allreduce_durations(result, 1)[0] == pytest.approx(end - expected_spans[0][0], rel=1e-12)
    # one stage on one rank: the bound is exact (busy time, then what of the chain runs past the backward)
    assert result.lower_bound == pytest.approx(result.iteration_time, rel=1e-12)


def test_buckets_hidden_by_the_backward_leave_only_the_last_one_past_it() -> None:
    """Short buckets ready early end inside the backward: the tail is the last bucket (ready at the end) alone."""
    fwd, bwd = 2.0, 4.0
    buckets = (GradBucket(0.25, 0.5), GradBucket(0.5, 0.5), GradBucket(1.0, 0.75))
    result = simulate(make_schedule("gpipe", 1, 2), _one_stage(buckets, fwd, bwd, 0.0))
    assert result.iteration_time == pytest.approx(2 * (fwd + bwd) + 0.75, rel=1e-12)
    unbucketed = simulate(make_schedule("gpipe", 1, 2), Costs((StageCost(fwd, bwd, allreduce_ms=1.75),), (), ()))
    assert unbucketed.iteration_time == pytest.approx(2 * (fwd + bwd) + 1.75, rel=1e-12)


def test_a_split_stage_starts_its_buckets_after_its_last_w() -> None:
    """On zero-bubble H1 with one stage the last task is W, which no gradient hook sees: every bucket is ready at
    W's end, and they run one after another from there."""
    fwd, bwd, weight = 1.0, 3.0, 1.0
    costs = Costs(
        (StageCost(fwd, bwd, bwd_input_ms=bwd - weight, bwd_weight_ms=weight, allreduce_ms=10.0,
                   allreduce_buckets=(GradBucket(0.0, 9.0), GradBucket(1.0, 1.0))),),
        (),
        (),
    )  # fmt: skip
    result = simulate(make_schedule("zb-h1", 1, 2), costs)
    busy = 2 * (fwd + bwd)
    assert result.collectives[0].start_ms == busy
    assert result.iteration_time == busy + 10.0
    assert result.lower_bound == result.iteration_time


def test_bad_buckets_are_refused() -> None:
    """A ready fraction outside [0, 1], a latency over the time, or buckets out of ready order: CostError."""
    with pytest.raises(CostError, match="ready_fraction must be in"):
        GradBucket(1.5, 1.0)
    with pytest.raises(CostError, match="exceeds its allreduce_ms"):
        GradBucket(0.5, 1.0, 2.0)
    with pytest.raises(CostError, match="non-decreasing ready_fraction"):
        StageCost(1.0, 1.0, allreduce_buckets=(GradBucket(0.8, 1.0), GradBucket(0.2, 1.0)))


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), "25MB", True])
def test_a_bad_bucket_size_is_refused(bad: object) -> None:
    """allreduce_bucket_bytes must be bytes > 0 or None: PlanError naming the option, the value and DDP's default."""
    profile, cluster = load_profile("pipedream/vgg16"), load_cluster("eth-v100-1x2")
    with pytest.raises(PlanError, match=rf"allreduce_bucket_bytes .*got {bad!r}.*{DDP_BUCKET_BYTES}"):
        CostModel.build(profile, cluster, allreduce_bucket_bytes=bad)  # type: ignore[arg-type]


def test_a_replicated_stage_is_priced_in_ddp_buckets_from_the_profile() -> None:
    """VGG-16 on 2 devices: every bucket is the ring formula of its layers' parameter bytes, they sum to the stage's,
    each holds at least the cap but its last layer's bytes, and its ready fraction is its layers' backward share."""
    profile, cluster = load_profile("pipedream/vgg16"), load_cluster("eth-v100-1x2")
    model = CostModel.build(profile, cluster, allreduce_bucket_bytes=DDP_BUCKET_BYTES)
    layers = profile.num_layers
    plan = Plan((Stage(0, layers - 1, (0, 1)),), 1, 1, 64, "1f1b")
    stage = plan_costs(plan, model).stages[0]
    assert plan_costs(plan, dataclasses.replace(model, allreduce_bucket_bytes=None)).stages[0].allreduce_buckets == ()
    params = [float(layer.param_bytes) for layer in profile.layers]
    bwd = [float(v) for v in model.layers.arrays(32.0).bwd]
    held = [i for i in range(layers) if params[i] > 0]
    buckets = stage.allreduce_buckets
    assert len(buckets) >= 2
    # rebuild the buckets by hand: reverse order, close at >= cap
    expected, current, size = [], [], 0.0
    for i in reversed(held):
        current.append(i)
        size += params[i]
        if size >= DDP_BUCKET_BYTES:
            expected.append(current)
            current, size = [], 0.0
    if current:
        expected.append(current)
    assert len(buckets) == len(expected)
    for bucket, members in zip(buckets, expected, strict=True):
        nbytes = sum(params[i] for i in members)
        total, latency = ring_allreduce_parts(cluster, (0, 1), nbytes)
        assert bucket.allreduce_ms == pytest.approx(total, rel=1e-12)
        assert bucket.latency_ms == pytest.approx(latency, rel=1e-12)
        lowest = min(members)
        share = 1.0 if lowest == 0 else sum(bwd[lowest:]) / sum(bwd)
        assert bucket.ready_fraction == pytest.approx(share, rel=1e-12)
    assert stage.allreduce_ms == pytest.approx(sum(b.allreduce_ms for b in buckets), rel=1e-12)


schedules = st.sampled_from(["gpipe", "1f1b", "zb-h1", "interleaved-1f1b"])
fractions = st.lists(st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0]), min_size=1, max_size=4).map(sorted)


@given(name=schedules, p=st.integers(1, 3), mult=st.integers(1, 3), data=st.data())
def test_bucketed_allreduces_respect_the_lower_bound_and_both_loops_agree(
    name: str, p: int, mult: int, data: st.DataObject
) -> None:
    """Random stages with random buckets (and a random trace on their rings): both event loops agree, and the lower
    bound never exceeds the simulated iteration."""
    chunks = 2 if name == "interleaved-1f1b" else 1
    schedule = make_schedule(name, p, p * mult, chunks=chunks)
    stages = schedule.num_stages
    times = st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0, 3.0]), min_size=stages, max_size=stages)
    base = uniform_costs(schedule, data.draw(times), data.draw(times), comm=0.1)
    with_buckets = []
    for c in base.stages:
        got = data.draw(fractions)
        rings = [(data.draw(st.sampled_from([0.0, 0.2, 1.0, 2.5])), data.draw(st.sampled_from([0.0, 0.0, 0.1]))) for _ in got]
        buckets = tuple(GradBucket(f, ms, min(latency, ms)) for f, (ms, latency) in zip((*got[:-1], 1.0), rings, strict=True))
        total = sum(b.allreduce_ms for b in buckets)
        with_buckets.append(
            dataclasses.replace(c, allreduce_ms=total, allreduce_ring=(0, 1), allreduce_buckets=buckets, optimizer_ms=0.1)
        )
    costs = dataclasses.replace(base, stages=tuple(with_buckets))
    steps = data.draw(
        st.lists(
            st.fixed_dictionaries(
                {
                    "t_ms": st.sampled_from([0.0, 0.5, 2.0, 7.0]),
                    "link": st.one_of(st.just("all"), st.sampled_from([[0, 1], [1, 0]])),
                    "factor": st.sampled_from([0.25, 0.5, 2.0]),
                }
            ),
            max_size=3,
        )
    )
    trace = bandwidth_trace_from_json(sorted(steps, key=lambda s: s["t_ms"])) if steps else None
    result = simulate(schedule, costs, trace)
    assert result == simulate_in_time_order(schedule, costs, trace)
    assert result.lower_bound <= result.iteration_time * (1 + 1e-12)
    assert lower_bound(schedule, costs, trace) == result.lower_bound
