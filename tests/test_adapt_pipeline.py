"""adapt.pipeline and adapt.observation: the controller's model of a pipeline and what it observes."""

from __future__ import annotations

import pytest

from adapt_cases import bert_plan, numbers, replicated_plan
from pipeplan.adapt import IterationObservation, PipelineModel, Transfer
from pipeplan.core.errors import AdaptError
from pipeplan.presets.resolve import load_cluster, load_profile
from pipeplan.schedules import make_schedule
from pipeplan.sim import simulate, uniform_costs
from pipeplan.sim.cost.model import CostModel
from pipeplan.sim.cost.plan_costs import plan_costs


def test_from_measurements_prices_like_uniform_costs() -> None:
    """Per-stage numbers and a 1 GB/s link give the flows uniform_costs gives for the same transfer time."""
    pipeline = PipelineModel.from_measurements(**numbers(p=4, m=16))
    schedule = make_schedule("1f1b", 4, 16)
    reference = uniform_costs(schedule, 1.0, 2.0, comm=1.0, act_bytes=1e6)
    assert simulate(schedule, pipeline.costs).iteration_time == simulate(schedule, reference).iteration_time == 85.0
    assert pipeline.links == ((0, 1), (1, 2), (2, 3), (1, 0), (2, 1), (3, 2))
    assert pipeline.nominal_ms((1, 2), 1e6) == 1.0
    assert pipeline.nominal_gb_per_s((2, 1)) == pytest.approx(1.0)


def test_from_plan_keeps_the_simulators_costs_and_the_devices_memory() -> None:
    """A plan's pipeline model holds plan_costs unchanged, one link per device pair, and each stage's device memory."""
    plan, model = bert_plan()
    pipeline = PipelineModel.from_plan(plan, model)
    assert pipeline.costs == plan_costs(plan, model)
    assert pipeline.microbatches == plan.microbatches
    assert pipeline.memory_limit_bytes == tuple(float(model.cluster.devices[s.devices[0]].memory_bytes) for s in plan.stages)
    first = plan.stages[0].devices[0], plan.stages[1].devices[0]
    cut = model.layers.cut_bytes(plan.stages[0].last_layer, plan.microbatch_size)
    assert pipeline.link_bytes[first] == cut
    rate = model.cluster.require_link(*first)
    assert pipeline.nominal_ms(first, cut) == pytest.approx(cut / rate * 1000.0)


def test_from_plan_refuses_interleaved_and_asynchronous_plans() -> None:
    """Chunks and pipemare cannot be regrouped at an iteration boundary: AdaptError says why."""
    import dataclasses

    plan, model = bert_plan()
    chunked = tuple(dataclasses.replace(s, devices=plan.stages[i % 2].devices) for i, s in enumerate(plan.stages))
    with pytest.raises(AdaptError, match="interleaves v=2 chunks"):
        PipelineModel.from_plan(dataclasses.replace(plan, chunks=2, stages=chunked, schedule="interleaved-1f1b"), model)
    with pytest.raises(AdaptError, match="schedule 'pipemare' has no flush"):
        PipelineModel.from_plan(dataclasses.replace(plan, schedule="pipemare"), model)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"bwd_ms": [2.0] * 3}, r"bwd_ms needs 4 values \(one per stage, as fwd_ms\), got 3"),
        ({"boundary_links": [(0, 1)]}, r"boundary_links needs 3 values \(one per stage boundary\), got 1"),
        ({"bandwidth_gb_per_s": [1.0, 0.0, 1.0]}, r"bandwidth_gb_per_s\[1\] must be a finite number > 0, got 0.0"),
        ({"boundary_bytes": [1e6, float("nan"), 1e6]}, r"boundary_bytes\[1\] must be a finite number >= 0, got nan"),
        ({"boundary_links": [(0, 1), (1, 1), (2, 3)]}, r"boundary_links\[1\] must be two different device ids"),
        ({"fwd_ms": [1.0, -1.0, 1.0, 1.0]}, r"stage costs: fwd_ms must be a finite number >= 0, got -1.0"),
        ({"microbatches": 0}, r"microbatches must be an integer >= 1, got 0"),
    ],
)
def test_bad_numbers_raise_adapt_error_naming_them(change: dict[str, object], message: str) -> None:
    """Each inconsistent list or value is an AdaptError quoting the argument and value."""
    with pytest.raises(AdaptError, match=message):
        PipelineModel.from_measurements(**(numbers(p=4, m=16) | change))


def test_an_unknown_link_is_an_error_naming_the_known_ones() -> None:
    """Reading a transfer on a pair no boundary uses says which links exist."""
    pipeline = PipelineModel.from_measurements(**numbers(p=2, m=4))
    with pytest.raises(AdaptError, match=r"link \[0, 5\]: no stage boundary of this pipeline uses it \(links: 0->1, 1->0\)"):
        pipeline.nominal_ms((0, 5), 10.0)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Transfer((0, 0), 1.0, 0.0, 1.0), r"transfer link must be two different device ids"),
        (lambda: Transfer((0, 1), -1.0, 0.0, 1.0), r"transfer nbytes must be >= 0, got -1.0"),
        (lambda: Transfer((0, 1), 1.0, 2.0, 1.0), r"ends at 1.0 ms, before it starts at 2.0 ms"),
        (lambda: Transfer((0, 1), 1.0, float("nan"), 1.0), r"transfer start_ms must be a finite number, got nan"),
        (lambda: IterationObservation(0, 0, 1.0), r"observation k must be an integer >= 1, got 0"),
        (lambda: IterationObservation(0, 1, 0.0), r"observation iteration_ms must be > 0, got 0.0"),
        (lambda: IterationObservation(0, 1, 1.0, (1.0,), ()), r"has 1 stage_fwd_ms but 0 stage_bwd_ms values"),
        (lambda: IterationObservation(-1, 1, 1.0), r"observation index must be an integer >= 0, got -1"),
    ],
)
def test_bad_observations_raise_adapt_error(build: object, message: str) -> None:
    """A malformed transfer or observation fails at construction, naming the field and value."""
    with pytest.raises(AdaptError, match=message):
        build()  # type: ignore[operator]


def test_cost_model_of_the_shared_profiles_builds() -> None:
    """The plan fixture is a real shared profile on a preset cluster (the tests below rely on it)."""
    model = CostModel.build(load_profile("dapple/bert-48"), load_cluster("v100-8x2-25g"))
    assert model.profile.num_layers == 53


def test_ring_links_join_the_traffic_and_price_their_nominal_rate() -> None:
    """from_plan keeps each stage's ring (its devices in order, wrapping) and its gradient bytes; traffic_links lists
    the transfers' links then the rings'; a ring link's nominal rate is 2(n-1)/n x bytes over the all-reduce's work.
    from_measurements takes rings per stage and refuses a bad pair, pairs that do not close a ring, or a latency
    beyond the all-reduce."""
    plan, model = replicated_plan()
    pipeline = PipelineModel.from_plan(plan, model)
    assert pipeline.ring_links == tuple(((a, b), (b, a)) for a, b in ((4, 5), (6, 7), (8, 9), (10, 11)))
    assert pipeline.traffic_links == pipeline.links + tuple(link for ring in pipeline.ring_links for link in ring)
    cost = pipeline.costs.stages[0]
    params = model.layers.stage(range(0, 14), 2, 2, 1.0).param_bytes
    assert pipeline.nominal_gb_per_s((5, 4)) == pytest.approx(params / cost.allreduce_work_ms / 1e6)
    measured = PipelineModel.from_measurements(
        **numbers(p=2, m=4), allreduce_ms=[5.0, 0.0], allreduce_latency_ms=[1.0, 0.0], ring_links=[[(0, 5), (5, 0)], []],
        allreduce_bytes=[2e6, 0.0],
    )  # fmt: skip
    assert measured.ring_links == (((0, 5), (5, 0)), ())
    assert measured.nominal_gb_per_s((0, 5)) == pytest.approx(2e6 / 4.0 / 1e6)
    with pytest.raises(AdaptError, match=r"ring_links\[0\] must hold pairs of two different device ids, got \(3, 3\)"):
        PipelineModel.from_measurements(**numbers(p=2, m=4), ring_links=[[(3, 3)], []])
    with pytest.raises(AdaptError, match=r"ring_links\[1\] must form a ring .*got \[\[0, 5\], \[6, 0\]\]"):
        PipelineModel.from_measurements(**numbers(p=2, m=4), ring_links=[[], [(0, 5), (6, 0)]])
    with pytest.raises(AdaptError, match=r"allreduce_latency_ms 2\.0 exceeds allreduce_ms 1\.0"):
        PipelineModel.from_measurements(**numbers(p=2, m=4), allreduce_ms=[1.0, 0.0], allreduce_latency_ms=[2.0, 0.0])


def test_from_plan_refuses_a_tensor_parallel_or_sharded_plan() -> None:
    """A plan with a tp > 1 stage or zero > 0 is refused naming both, before any costs are priced."""
    import dataclasses

    from pipeplan.core.plan import Plan, Stage

    model = CostModel.build(load_profile("dapple/bert-48"), load_cluster("a100-8x2"))
    plan = Plan((Stage(0, 49, (0, 1), tp=2),), 1, 2, 2, "1f1b")
    for bad in (plan, dataclasses.replace(plan, stages=(Stage(0, 49, (0, 1)),), zero=1)):
        with pytest.raises(AdaptError, match=r"without tensor parallelism or sharding; this plan has tp \[\d\] and zero \d"):
            PipelineModel.from_plan(bad, model)
