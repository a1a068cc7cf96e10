"""Tests of the `list` schedule: valid orders, activation budgets, and where it beats 1F1B."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models import linear_model
from pipeplan.core.errors import PlanError
from pipeplan.core.hardware.cluster import Cluster, Device
from pipeplan.core.plan import Plan, Stage
from pipeplan.core.profile import LayerProfile, ModelProfile
from pipeplan.core.validate import validate
from pipeplan.planner.search.list_schedule import list_order, list_plan, memory_budgets
from pipeplan.schedules import make_schedule
from pipeplan.sim import simulate, uniform_costs
from pipeplan.sim.cost.plan_costs import plan_costs
from pipeplan.sim.plan_sim import simulate_plan


def one_f_one_b_and_list(p: int, m: int, fwd: object, bwd: object, comm: object, budgets: tuple[int, ...]) -> tuple[float, float]:
    """Simulated iteration times of 1F1B and of the list schedule under the same synthetic costs."""
    reference = make_schedule("1f1b", p, m)
    costs = uniform_costs(reference, fwd, bwd, comm)
    ordered = validate(list_order(costs, m, budgets))
    return simulate(reference, costs).iteration_time, simulate(ordered, costs).iteration_time


def test_list_equals_1f1b_on_uniform_stages() -> None:
    """Uniform F=1, B=2, no transfers, budgets p-s: (m+p-1)(F+B) like 1F1B."""
    t_1f1b, t_list = one_f_one_b_and_list(4, 8, 1.0, 2.0, 0.0, (4, 3, 2, 1))
    assert t_1f1b == pytest.approx((8 + 3) * 3)
    assert t_list == pytest.approx(t_1f1b)


def test_list_beats_1f1b_when_transfers_are_slow() -> None:
    """Transfers of 1.5 ms beside F=1, B=2: with room for 2(p-s)-1 microbatches the list schedule hides them.

    1F1B's strict alternation puts every transfer on the critical path (99 ms);
    the list schedule keeps extra forwards in flight and finishes in 66 ms.
    """
    t_1f1b, t_list = one_f_one_b_and_list(4, 16, 1.0, 2.0, 1.5, (7, 5, 3, 1))
    assert t_1f1b == pytest.approx(99.0)
    assert t_list == pytest.approx(66.0)
    assert t_list < 0.7 * t_1f1b


def test_list_beats_1f1b_on_uneven_stages() -> None:
    """A slow second stage and 0.5 ms transfers: the list schedule is faster than 1F1B (148 vs 153 ms)."""
    t_1f1b, t_list = one_f_one_b_and_list(4, 16, [1, 3, 1, 2], [2, 6, 2, 4], 0.5, (16, 16, 16, 16))
    assert t_list < t_1f1b
    assert (t_1f1b, t_list) == (pytest.approx(153.0), pytest.approx(148.0))


@settings(max_examples=40, deadline=None)
@given(
    p=st.integers(1, 5),
    m=st.integers(1, 10),
    data=st.data(),
)
def test_list_order_is_valid_and_respects_budgets(p: int, m: int, data: st.DataObject) -> None:
    """Any costs and budgets >= 1: a valid schedule whose per-stage in-flight count never exceeds the budget."""
    times = st.floats(0.0, 5.0, allow_nan=False)
    fwd = data.draw(st.lists(times, min_size=p, max_size=p))
    bwd = data.draw(st.lists(times, min_size=p, max_size=p))
    comm = data.draw(st.lists(times, min_size=p - 1, max_size=p - 1))
    budgets = tuple(data.draw(st.lists(st.integers(1, m + 1), min_size=p, max_size=p)))
    costs = uniform_costs(make_schedule("1f1b", p, m), fwd, bwd, comm)
    schedule = validate(list_order(costs, m, budgets))
    for s, actions in enumerate(schedule.ranks):
        held = peak = 0
        for action in actions:
            held += 1 if action.op == "F" else -1
            peak = max(peak, held)
        assert peak <= budgets[s]
        assert sorted(a.microbatch for a in actions if a.op == "F") == list(range(m))


def test_list_order_rejects_bad_budgets() -> None:
    """A zero budget or a wrong count is a PlanError naming the budgets."""
    costs = uniform_costs(make_schedule("1f1b", 2, 2), 1.0, 2.0)
    with pytest.raises(PlanError, match=r"one activation budget >= 1 per stage \(2\), got \(1, 0\)"):
        list_order(costs, 2, (1, 0))


def small_setup() -> tuple[ModelProfile, Cluster]:
    """4 layers of 1 GB parameters and 1 GB saved activations per sample; two 8 GiB devices, slow link."""
    layers = tuple(LayerProfile(f"l{i}", 1.0, 2.0, 1e6, 1e9, 1e9) for i in range(4))
    devices = tuple(Device(i, "gpu", 8 * 2**30) for i in range(2))
    slow = ((0.0, 1e8), (1e8, 0.0))
    return ModelProfile("m", 1, layers), Cluster("c", devices, slow, ((0.0, 0.0), (0.0, 0.0)))


def test_memory_budgets_from_free_memory() -> None:
    """Budget = floor((capacity - static) / saved per microbatch), capped at m."""
    profile, cluster = small_setup()
    plan = Plan((Stage(0, 1, (0,)), Stage(2, 3, (1,))), 1, 8, 1, "1f1b")
    costs = plan_costs(plan, linear_model(profile, cluster, optimizer_factor=0.0))
    # static 2 GB * 2 = 4e9 bytes; room 8 GiB - 4e9 = 4.59e9; saved 2e9 per microbatch -> 2
    assert memory_budgets(plan, costs, (8 * 2**30, 8 * 2**30)) == (2, 2)
    with pytest.raises(PlanError, match="stage 0 has room for 0 microbatches"):
        memory_budgets(plan, costs, (5e9, 8 * 2**30))


def test_list_plan_round_trips_through_the_simulator() -> None:
    """list_plan stores the order in the Plan; simulating the plan reproduces the order's time."""
    profile, cluster = small_setup()
    plan = Plan((Stage(0, 1, (0,)), Stage(2, 3, (1,))), 1, 6, 1, "1f1b")
    costs = plan_costs(plan, linear_model(profile, cluster, optimizer_factor=0.0))
    listed = list_plan(plan, costs, (3, 3))
    assert listed.schedule == "list" and listed.order is not None
    result = simulate_plan(listed, linear_model(profile, cluster, optimizer_factor=0.0))
    assert max(result.stage_peak_inflight) <= 3
    assert result.iteration_time <= simulate_plan(plan, linear_model(profile, cluster, optimizer_factor=0.0)).iteration_time
