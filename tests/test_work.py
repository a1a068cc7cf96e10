"""core.work: a many-iteration request priced from its sizes (checked against brute counts) and refused at the limit."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeplan.core.errors import PlanError
from pipeplan.core.limits import RUN_BYTES, SIMULATED_EVENTS
from pipeplan.core.work import (
    ITERATION_BYTES,
    ITERATION_EVENTS,
    Run,
    bytes_of,
    check_iterations,
    check_work,
    events_of,
    kfkb_events,
    plan_events,
)
from pipeplan.schedules import make_schedule
from pipeplan.schedules.kfkb import kfkb
from pipeplan.schedules.registry import action_count
from pipeplan.sim import simulate, uniform_costs
from pipeplan.sim.engine.iterations import iteration_events


def brute_events(name: str, p: int, m: int, k: int = 1) -> int:
    """Actions and transfers of one recorded simulation, counted one by one (comm > 0: every boundary moves)."""
    schedule = make_schedule(name, p, m, k=k)
    result = simulate(schedule, uniform_costs(schedule, 1.0, 2.0, comm=0.5), record=True)
    return len(result.compute) + len(result.transfers)


@given(st.sampled_from(["1f1b", "gpipe", "zb-h1"]), st.integers(1, 6), st.integers(1, 9))
@settings(max_examples=40, deadline=None)
def test_events_of_an_iteration_are_its_actions_and_transfers(name: str, p: int, m: int) -> None:
    """iteration_events, and simulate's pricing before generating (action_count + 2 (p - 1) m), equal a brute count."""
    schedule = make_schedule(name, p, m)
    costs = uniform_costs(schedule, 1.0, 2.0, comm=0.5)
    assert iteration_events(schedule, costs) == brute_events(name, p, m)
    assert action_count(name, p, m) + 2 * (p - 1) * m == brute_events(name, p, m)


@given(st.integers(1, 6), st.integers(1, 9), st.data())
@settings(max_examples=30, deadline=None)
def test_kfkb_events_hold_for_every_k(p: int, m: int, data: st.DataObject) -> None:
    """kfkb_events (what adapt prices every candidate k with) is the brute count of kFkB for any k."""
    k = data.draw(st.integers(1, m))
    assert kfkb_events(p, m) == brute_events("kfkb", p, m, k)
    schedule = kfkb(p, m, k)
    assert kfkb_events(p, m) == iteration_events(schedule, uniform_costs(schedule, 1.0, 2.0, comm=0.5))


def test_plan_events_bound_one_device_stages_exactly() -> None:
    """One device per stage: 2 actions per stage and microbatch, and a flow both ways counted per side (an upper
    bound: 2 x (1 + 1) per boundary against the 2 that move)."""
    assert plan_events([1, 1, 1], 4) == (2 * 3 + 2 * (2 + 2)) * 4
    assert plan_events([1, 1, 1], 4) >= brute_events("1f1b", 3, 4)
    assert plan_events([1], 5, 3) == 15


def test_a_run_simulates_at_most_twice_its_changes_plus_one() -> None:
    """simulated = min(iterations, 2 changes + 1); None changes: every iteration (a controller's run)."""
    assert Run(100, 10, 0).simulated == 1
    assert Run(100, 10, 3).simulated == 7
    assert Run(5, 10, 3).simulated == 5
    assert Run(100, 10, None).simulated == 100


def test_events_and_bytes_are_the_closed_form() -> None:
    """events = once + sum(simulated x events + iterations x (ITERATION_EVENTS + extra)); bytes: kept + working."""
    runs = [Run(1000, 48, 2), Run(1000, 48, None, 50.0, 900.0)]
    assert events_of(runs, 7.0) == 7 + 5 * 48 + 1000 * ITERATION_EVENTS + 1000 * 48 + 1000 * (ITERATION_EVENTS + 50)
    assert bytes_of(runs) == 1000 * ITERATION_BYTES + 1000 * 900.0 + 48 * 400.0


def largest_accepted(events: int, changes: int | None) -> int:
    """The most iterations the limits accept for one run, found by counting up from a closed-form guess."""
    n = int(SIMULATED_EVENTS.value // (ITERATION_EVENTS + (events if changes is None else 0))) + 2
    while not (
        SIMULATED_EVENTS.allows(events_of([Run(n, events, changes)])) and RUN_BYTES.allows(bytes_of([Run(n, events, changes)]))
    ):
        n -= 1
    return n


@pytest.mark.parametrize(("events", "changes"), [(48, 0), (48, None), (1_000, 40), (112, 1_000_000)])
def test_just_under_the_limit_passes_and_just_over_is_refused_naming_the_largest(events: int, changes: int | None) -> None:
    """N iterations (the largest accepted) pass; N + 1 are refused with `use --iterations N or fewer`."""
    n = largest_accepted(events, changes)
    check_iterations("simulating x", "--iterations", n, events, changes, PlanError)
    with pytest.raises(PlanError, match=rf"\(--iterations {n + 1:,}\) too large: .*; use --iterations {n:,} or fewer$"):
        check_iterations("simulating x", "--iterations", n + 1, events, changes, PlanError)


def test_memory_alone_can_refuse_and_says_bytes() -> None:
    """A run that keeps much per iteration is refused on RUN_BYTES even when its events fit."""
    with pytest.raises(PlanError, match=r"too large: [\d,]+ bytes, the limit is 2,147,483,648 bytes"):
        check_work("x", "--n", 100_000, lambda n: ([Run(n, 1, 0, 0.0, 1e5)], 0.0), PlanError)


def test_a_request_over_the_limit_at_one_iteration_says_so() -> None:
    """When even one iteration is over, the way out is a smaller schedule, not a count."""
    with pytest.raises(PlanError, match="even one iteration is over"):
        check_work("x", "--n", 3, lambda n: ([Run(n, 10**9, None)], 0.0), PlanError)
