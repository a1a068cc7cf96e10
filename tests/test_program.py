"""The compiled-schedule cache (sim.engine.program.program_for): reuse, and its bound in actions."""

from __future__ import annotations

import pytest

from pipeplan.core.schedule import Schedule
from pipeplan.schedules import make_schedule
from pipeplan.sim import simulate, uniform_costs
from pipeplan.sim.engine import program
from pipeplan.sim.engine.program import compile_schedule, forget_programs, program_for


def test_a_schedule_simulated_again_is_not_compiled_again() -> None:
    forget_programs()
    schedule = make_schedule("kfkb", 4, 12, k=2)
    first = program_for(schedule)
    assert first == compile_schedule(schedule)
    for other in range(2, 40):  # more schedules than PROGRAM_CACHE_MIN, far fewer actions than the bound
        program_for(make_schedule("1f1b", 4, other))
    assert program_for(schedule) is first


def test_the_cache_keeps_the_most_recently_used_within_its_action_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """With room for 100 actions: 1F1B p=2 m=10 has 40; the fourth schedule drops the least recently used one."""
    forget_programs()
    monkeypatch.setattr(program, "PROGRAM_CACHE_ACTIONS", 100)
    monkeypatch.setattr(program, "PROGRAM_CACHE_MIN", 1)
    one = make_schedule("1f1b", 2, 10)  # make_schedule remembers its schedules: copies are other objects
    a, b, c = (Schedule(one.ranks, one.stage_to_rank, one.name) for _ in range(3))
    first_a, first_b = program_for(a), program_for(b)
    assert program_for(a) is first_a  # a is now the most recently used: b goes first
    program_for(c)
    assert program_for(a) is first_a and program_for(b) is not first_b
    big = make_schedule("gpipe", 4, 30)  # 240 actions, over the bound alone: kept as the one minimum entry
    assert program_for(big) is program_for(big)
    assert program._PROGRAMS.actions == sum(len(code) for code in program_for(big).code)
    forget_programs()
    assert program._PROGRAMS.actions == 0


def test_a_cached_program_simulates_as_a_fresh_one() -> None:
    forget_programs()
    schedule = make_schedule("zb-h1", 3, 9)
    costs = uniform_costs(schedule, [1.0, 1.5, 0.7], 2.0, comm=[0.3, 1.2])
    cold = simulate(schedule, costs)
    assert simulate(schedule, costs) == cold == simulate(schedule, costs, program=compile_schedule(schedule))
