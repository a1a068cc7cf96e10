"""sim.cost.shared and the simulator: a shared parameter split over stages costs one all-reduce per iteration.

The reference is the same model with the shared weight stripped from every holder but the first (the weight
counted once, nothing to exchange): a plan that keeps the holders on one stage must simulate exactly like it, a plan
that splits them must take exactly the priced all-reduce longer (closed form: 2(n-1)/n * bytes / bandwidth +
2(n-1) * latency over the holders' devices).
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from models import linear_model
from pipeplan.core.errors import PlanError
from pipeplan.core.hardware.cluster import Cluster, Device
from pipeplan.core.plan import Plan, Stage
from pipeplan.core.profile import LayerProfile, ModelProfile, SharedGroup
from pipeplan.sim.cost.memory import check_fits, memory_per_device
from pipeplan.sim.cost.plan_costs import plan_costs
from pipeplan.sim.plan_sim import simulate_plan

GB = 1e9
TIE = 100e6  # the tied weight's bytes


def tied(params: tuple[float, ...] = (TIE, 50e6, TIE + 4e6), members: tuple[int, ...] = (0, 2), tie: float = TIE) -> ModelProfile:
    """Embedding, block, head; the head's weight is the embedding's (each layer's param_bytes counts it)."""
    layers = tuple(LayerProfile(f"l{i}", 1.0 + i, 2.0 * (1 + i), 1e6, p) for i, p in enumerate(params))
    return ModelProfile("tied", 4, layers, shared_params=(SharedGroup("l0.weight", members, tie),))


def stripped(profile: ModelProfile) -> ModelProfile:
    """The reference: each group's bytes taken from every holder but its first, and no groups."""
    params = [layer.param_bytes for layer in profile.layers]
    for g in profile.shared_params:
        for u in g.layers[1:]:
            params[u] -= g.param_bytes
    layers = tuple(dataclasses.replace(layer, param_bytes=p) for layer, p in zip(profile.layers, params, strict=True))
    return dataclasses.replace(profile, layers=layers, shared_params=())


def cluster(n: int = 2, bandwidth: float = 10 * GB, latency: float = 1e-2) -> Cluster:
    """n devices of 80 GiB, two per node, every pair at `bandwidth` and `latency` (ms)."""
    devices = tuple(Device(i, "gpu", 80 * 2**30, 1.0, i // 2) for i in range(n))
    bw = tuple(tuple(0.0 if a == b else bandwidth for b in range(n)) for a in range(n))
    lat = tuple(tuple(0.0 if a == b else latency for b in range(n)) for a in range(n))
    return Cluster("flat", devices, bw, lat)


SPLIT = Plan((Stage(0, 1, (0,)), Stage(2, 2, (1,))), 1, 4, 2, "1f1b")
TOGETHER = Plan((Stage(0, 2, (0,)),), 1, 4, 2, "1f1b")
TOGETHER_DP = Plan((Stage(0, 2, (0, 1)),), 1, 4, 2, "1f1b")


def test_a_split_pair_prices_one_ring_all_reduce_of_the_weight_over_both_stages() -> None:
    """Layers 0 and 2 on devices 0 and 1: 2(2-1)/2 * 100 MB / 10 GB/s + 2 * 10 us = 10.02 ms, on stages (0, 1)."""
    costs = plan_costs(SPLIT, linear_model(tied(), cluster()))
    (x,) = costs.shared
    assert (x.name, x.stages, x.devices, x.param_bytes) == ("l0.weight", (0, 1), 2, TIE)
    assert x.exchange_ms == pytest.approx(TIE / (10 * GB) * 1000 + 2 * 1e-2, rel=1e-12)
    assert plan_costs(TOGETHER, linear_model(tied(), cluster())).shared == ()


def test_memory_holds_the_weight_once_per_stage_and_a_copy_on_each_holding_stage() -> None:
    """Adam (x4 per parameter byte): one stage holds (100 + 50 + 104 - 100) MB once; split, 150 MB and 104 MB."""
    model = linear_model(tied(), cluster())
    assert plan_costs(TOGETHER, model).stages[0].static_bytes == pytest.approx(4 * 154e6, rel=1e-15)
    split = plan_costs(SPLIT, model)
    assert [s.static_bytes for s in split.stages] == pytest.approx([4 * 150e6, 4 * 104e6], rel=1e-15)
    # the device peaks: static plus in-flight saved bytes, the same as the stripped model's but for the copy
    ref = memory_per_device(SPLIT, linear_model(stripped(tied()), cluster()))
    got = memory_per_device(SPLIT, model)
    assert got[0] == ref[0]
    assert got[1] - ref[1] == pytest.approx(4 * TIE, rel=1e-12)


def test_the_iteration_grows_by_exactly_the_exchange_when_split_and_not_at_all_when_together() -> None:
    """1F1B, 4 microbatches: split, the time is the reference's plus the priced all-reduce; on one stage (one device or
    data-parallel over two) it is the reference's to the last bit."""
    model, reference = linear_model(tied(), cluster()), linear_model(stripped(tied()), cluster())
    exchange = plan_costs(SPLIT, model).shared[0].exchange_ms
    split, base = simulate_plan(SPLIT, model), simulate_plan(SPLIT, reference)
    assert split.iteration_time - base.iteration_time == pytest.approx(exchange, rel=1e-12)
    (span,) = split.exchanges
    assert (span.name, span.stages) == ("l0.weight", (0, 1))
    assert span.end_ms - span.start_ms == pytest.approx(exchange, rel=1e-12)
    assert span.end_ms == split.iteration_time
    assert split.lower_bound <= split.iteration_time
    for plan in (TOGETHER, TOGETHER_DP):
        assert simulate_plan(plan, model).iteration_time == simulate_plan(plan, reference).iteration_time
        assert simulate_plan(plan, model).exchanges == ()


def test_simulate_json_reports_each_exchange() -> None:
    """`simulate --json` gains shared_exchanges (name, stages, start, end, exchange_ms) only when there is one."""
    model = linear_model(tied(), cluster())
    obj = simulate_plan(SPLIT, model).to_json()
    (entry,) = obj["shared_exchanges"]
    assert entry["name"] == "l0.weight" and entry["stages"] == [0, 1]
    assert entry["exchange_ms"] == pytest.approx(plan_costs(SPLIT, model).shared[0].exchange_ms, rel=1e-12)
    assert "shared_exchanges" not in simulate_plan(TOGETHER, model).to_json()


def test_replicated_holders_all_join_the_ring() -> None:
    """Stage 0 on devices (0, 1), stage 1 on (2, 3): one ring over all four, 2 * 3/4 * 100 MB / 10 GB/s + 6 * 10 us."""
    plan = Plan((Stage(0, 1, (0, 1)), Stage(2, 2, (2, 3))), 1, 4, 2, "1f1b")
    (x,) = plan_costs(plan, linear_model(tied(), cluster(4))).shared
    assert x.devices == 4
    assert x.exchange_ms == pytest.approx(2 * 3 / 4 * TIE / (10 * GB) * 1000 + 6 * 1e-2, rel=1e-12)


@st.composite
def instances(draw: st.DrawFn) -> tuple[ModelProfile, Plan]:
    """A 3-6 layer chain with integer param bytes, one group of 2-3 holders, a split into 1-4 stages of 1-2 replicas,
    GPipe or 1F1B with 1-4 microbatches."""
    n = draw(st.integers(3, 6))
    params = [draw(st.integers(1, 10**9)) for _ in range(n)]
    members = tuple(sorted(draw(st.sets(st.integers(0, n - 1), min_size=2, max_size=3))))
    tie = draw(st.integers(0, min(params[u] for u in members)))
    stages = draw(st.integers(1, min(n, 4)))
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), min_size=stages - 1, max_size=stages - 1)))
    bounds = [0, *cuts, n]
    plan_stages, device = [], 0
    for s in range(stages):
        r = draw(st.integers(1, 2))
        plan_stages.append(Stage(bounds[s], bounds[s + 1] - 1, tuple(range(device, device + r))))
        device += r
    plan = Plan(tuple(plan_stages), 1, draw(st.integers(1, 4)), 2, draw(st.sampled_from(["gpipe", "1f1b"])))
    layers = tuple(LayerProfile(f"l{i}", 1.0 + i % 3, 2.0 + i % 2, 1e6, float(p)) for i, p in enumerate(params))
    return ModelProfile("p", 2, layers, shared_params=(SharedGroup("w", members, float(tie)),)), plan


@given(instances())
def test_groups_never_make_an_iteration_faster_and_change_nothing_when_held_by_one_stage(
    instance: tuple[ModelProfile, Plan],
) -> None:
    """Against the weight counted once: the iteration is at least as long, and equal when one stage holds the group."""
    profile, plan = instance
    net = cluster(8)
    with_groups = simulate_plan(plan, linear_model(profile, net), record=False)
    reference = simulate_plan(plan, linear_model(stripped(profile), net), record=False)
    owners = {
        s
        for s, stage in enumerate(plan.stages)
        for u in profile.shared_params[0].layers
        if stage.first_layer <= u <= stage.last_layer
    }
    if len(owners) == 1:
        assert with_groups.iteration_time == reference.iteration_time
    else:
        assert with_groups.iteration_time >= reference.iteration_time
        assert len(with_groups.exchanges) == 1
    assert with_groups.lower_bound <= with_groups.iteration_time * (1 + 1e-12)


def test_a_stage_that_cannot_hold_its_copy_is_refused_naming_the_shared_weight() -> None:
    """A 1.5 GB tie (5.59 GiB with Adam) on 5.5 GiB devices: both holders overflow, stage 0 the most; check_fits
    names it and the weight it holds a copy of. A stage that overflows holding no copy gets no note."""
    devices = tuple(Device(i, "gpu", 5.5 * 2**30, 1.0, 0) for i in range(3))
    small = dataclasses.replace(cluster(3), devices=devices)
    big_tie = tied(params=(1.5e9, 50e6, 1.5e9 + 4e6), tie=1.5e9)
    note = r"\(shared parameters: 'l0.weight' takes 5.59 GiB on stages 0, 1, a copy each\)$"
    with pytest.raises(PlanError, match=r"^stage 0 needs 5.78 GiB on device 0 .*" + note):
        check_fits(SPLIT, linear_model(big_tie, small))
    big_block = tied(params=(1e8, 3e9, 1.04e8))
    three = Plan((Stage(0, 0, (0,)), Stage(1, 1, (1,)), Stage(2, 2, (2,))), 1, 4, 2, "1f1b")
    with pytest.raises(PlanError, match=r"^stage 1 needs 11.18 GiB on device 1 .*schedule 1f1b\)$"):
        check_fits(three, linear_model(big_block, small))
