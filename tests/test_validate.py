"""Tests of the schedule language (core/schedule.py) and its validation (core/validate.py)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeplan.core.errors import ScheduleError
from pipeplan.core.schedule import Action, Schedule, infer_stage_to_rank
from pipeplan.core.validate import find_deadlock, validate


def sched(*rows: str, stage_to_rank: tuple[int, ...] | None = None, name: str = "t") -> Schedule:
    """A schedule from space-separated rows of text actions."""
    return Schedule.from_text([row.split() for row in rows], stage_to_rank, name)


def test_action_text_form_round_trips() -> None:
    """Action prints as {stage}{op}{microbatch} and parses back."""
    action = Action(12, "W", 305)
    assert str(action) == "12W305"
    assert Action.parse("12W305") == action
    assert Action.parse(" 2F0 ") == Action(2, "F", 0)


@pytest.mark.parametrize("text", ["", "F0", "2X0", "2F", "-1F0", "2f0", "2F0x", "1UNSHARD"])
def test_action_parse_rejects_malformed_text(text: str) -> None:
    """Text that is not stage, op in FBIWU, microbatch is rejected with the text quoted."""
    with pytest.raises(ScheduleError, match=rf"not an action: {text!r}"):
        Action.parse(text)


@pytest.mark.parametrize(
    ("stage", "op", "microbatch", "message"),
    [
        (-1, "F", 0, "action stage must be an integer >= 0, got -1"),
        (True, "F", 0, "action stage must be an integer >= 0, got True"),
        (0, "X", 0, "action op must be one of F, B, I, W, U, got 'X'"),
        (0, "F", 1.0, "action microbatch must be an integer >= 0, got 1.0"),
    ],
)
def test_action_rejects_bad_fields(stage: object, op: str, microbatch: object, message: str) -> None:
    """Action names the bad field and value."""
    with pytest.raises(ScheduleError, match=f"^{message}$"):
        Action(stage, op, microbatch)  # type: ignore[arg-type]


def test_schedule_rejects_bad_shapes() -> None:
    """Schedule needs tuples, at least one rank and stage, and stage_to_rank in range."""
    with pytest.raises(ScheduleError, match="tuple of tuples"):
        Schedule([(Action(0, "F", 0),)], (0,))  # type: ignore[arg-type]
    with pytest.raises(ScheduleError, match="at least one rank, got 0"):
        Schedule((), (0,))
    with pytest.raises(ScheduleError, match="at least one stage, got 0"):
        Schedule(((),), ())
    with pytest.raises(ScheduleError, match=r"stage_to_rank\[1\] must be a rank in 0..1, got 2"):
        Schedule(((), ()), (0, 2))


def test_schedule_properties() -> None:
    """Sizes, split_backward and stages_of describe the actions."""
    schedule = sched("0F0 2F0 0F1 2F1 2I0 2W0 2I1 2W1 0B0 0B1", "1F0 1F1 1B0 1B1", stage_to_rank=(0, 1, 0))
    assert (schedule.num_ranks, schedule.num_stages, schedule.num_microbatches) == (2, 3, 2)
    assert schedule.split_backward
    assert schedule.stages_of(0) == (0, 2)
    assert not sched("0F0 0B0").split_backward


def test_from_text_infers_stage_to_rank_and_skips_idle() -> None:
    """Each stage goes to the rank whose row holds it; empty and None cells are idle."""
    schedule = Schedule.from_text([["0F0", "", "0B0"], [None, "1F0", " ", "1B0"]])
    assert schedule.stage_to_rank == (0, 1)
    assert schedule.ranks[1] == (Action(1, "F", 0), Action(1, "B", 0))


def test_infer_stage_to_rank_errors() -> None:
    """A stage on two ranks, a skipped stage number, or no actions at all are rejected."""
    with pytest.raises(ScheduleError, match=r"stage 0 appears on rank 0 and on rank 1 \(position 0, action 0B0\)"):
        infer_stage_to_rank(((Action(0, "F", 0),), (Action(0, "B", 0),)))
    with pytest.raises(ScheduleError, match=r"stage 1 has no actions \(stages must be numbered 0..2\)"):
        infer_stage_to_rank(((Action(0, "F", 0), Action(2, "F", 0)),))
    with pytest.raises(ScheduleError, match="schedule has no actions"):
        infer_stage_to_rank(((),))


def test_validate_returns_the_schedule() -> None:
    """A valid schedule comes back unchanged, full or split backward."""
    full = sched("0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1")
    split = sched("0F0 0F1 0I0 0I1 0W1 0W0", "1F0 1I0 1F1 1I1 1W0 1W1")
    assert validate(full) is full
    assert validate(split) is split


def test_validate_catches_missing_action() -> None:
    """A (stage, microbatch) without its backward is reported with the missing action."""
    with pytest.raises(ScheduleError, match=r"^rank 1: missing action 1B1$"):
        validate(sched("0F0 0F1 0B0 0B1", "1F0 1B0 1F1"))
    with pytest.raises(ScheduleError, match=r"^rank 0: missing action 0F1$"):
        validate(sched("0F0 0B0", "1F0 1B0 1F1 1B1"))


def test_validate_catches_missing_half_of_split_backward() -> None:
    """An I without its W (or the reverse) is reported as the missing half."""
    with pytest.raises(ScheduleError, match=r"^rank 0: missing action 0W0$"):
        validate(sched("0F0 0I0"))


def test_validate_catches_mixed_full_and_split_backward() -> None:
    """B and I/W of the same microbatch are rejected."""
    with pytest.raises(ScheduleError, match=r"rank 0: 0B0 and a split backward \(I/W\) of the same microbatch"):
        validate(sched("0F0 0I0 0W0 0B0"))


def test_validate_catches_duplicate() -> None:
    """A repeated action is reported with rank, position and action."""
    with pytest.raises(ScheduleError, match=r"^rank 1, position 2, action 1F0: duplicate action$"):
        validate(sched("0F0 0B0", "1F0 1B0 1F0"))


def test_validate_catches_backward_before_forward() -> None:
    """B before its F on the same rank is rejected."""
    with pytest.raises(ScheduleError, match=r"^rank 0, position 1, action 0B1: backward before the forward 0F1$"):
        validate(sched("0F0 0B1 0F1 0B0"))


def test_validate_catches_input_backward_before_forward() -> None:
    """I before its F is rejected like B."""
    with pytest.raises(ScheduleError, match=r"^rank 0, position 0, action 0I0: backward before the forward 0F0$"):
        validate(sched("0I0 0F0 0W0"))


def test_validate_catches_weight_before_input() -> None:
    """W before its I is rejected."""
    with pytest.raises(ScheduleError, match=r"^rank 0, position 1, action 0W0: weight backward before 0I0$"):
        validate(sched("0F0 0W0 0I0"))


def test_validate_catches_stage_on_wrong_rank() -> None:
    """An action on a rank that does not hold its stage is rejected."""
    schedule = Schedule(((Action(0, "F", 0), Action(1, "F", 0)), (Action(1, "B", 0), Action(0, "B", 0))), (0, 1))
    with pytest.raises(ScheduleError, match=r"^rank 0, position 1, action 1F0: stage 1 belongs to rank 1$"):
        validate(schedule)


def test_validate_catches_stage_out_of_range() -> None:
    """An action on a stage beyond stage_to_rank is rejected."""
    schedule = Schedule(((Action(0, "F", 0), Action(3, "F", 0)),), (0,))
    with pytest.raises(ScheduleError, match=r"position 1, action 3F0: stage 3 does not exist \(stages 0..0\)"):
        validate(schedule)


def test_validate_catches_cycle() -> None:
    """Rank 0 waiting for a backward that waits for a forward rank 0 has not run yet is a cycle; the grid names it."""
    # rank 0 runs 0B0 (needs 1B0) before 0F1; rank 1 runs 1F1 (needs 0F1) before 1B0.
    schedule = sched("0F0 0B0 0F1 0B1", "1F0 1F1 1B0 1B1", name="cyclic")
    with pytest.raises(ScheduleError, match="schedule 'cyclic' has a dependency cycle") as info:
        validate(schedule)
    lines = str(info.value).splitlines()
    assert lines[1] == "  rank 0: step 1 [0F0 >0B0<] waits for 1B/I0 from rank 1"
    assert lines[2] == "  rank 1: step 1 [1F0 >1F1<] waits for 0F1 from rank 0"


def test_find_deadlock_none_for_a_valid_schedule() -> None:
    """A schedule that can finish has no deadlock grid."""
    assert find_deadlock(sched("0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1")) is None


def test_find_deadlock_reports_finished_ranks() -> None:
    """A rank with nothing left to run shows as finished in the grid."""
    schedule = Schedule.from_text([["0F0", "0B0", "0F1", "0B1"], ["1F0", "1F1", "1B0", "1B1"], []], (0, 1))
    grid = find_deadlock(schedule)
    assert grid is not None
    assert grid.splitlines()[2] == "  rank 2: finished (0 actions)"


def _reference_blocked(schedule: Schedule) -> list[int]:
    """Positions where each rank stops, by the plain fixed point (sweep every rank until nothing moves)."""
    positions = [0] * schedule.num_ranks
    done: set[tuple[int, str, int]] = set()
    moved = True
    while moved:
        moved = False
        for rank, actions in enumerate(schedule.ranks):
            while positions[rank] < len(actions):
                action = actions[positions[rank]]
                if action.op == "F" and action.stage > 0 and (action.stage - 1, "F", action.microbatch) not in done:
                    break
                if action.op in "BI" and action.stage < schedule.num_stages - 1:
                    nxt = action.stage + 1
                    if (nxt, "B", action.microbatch) not in done and (nxt, "I", action.microbatch) not in done:
                        break
                done.add((action.stage, action.op, action.microbatch))
                positions[rank] += 1
                moved = True
    return positions


@given(st.integers(1, 4), st.integers(1, 5), st.randoms(use_true_random=False), st.booleans())
@settings(max_examples=200, deadline=None)
def test_find_deadlock_agrees_with_the_plain_fixed_point(stages: int, microbatches: int, rng: random.Random, split: bool) -> None:
    """Random per-rank orders (F before its backward, I before W): the parked search finds a deadlock exactly when
    sweeping every rank to a fixed point gets stuck, and reports the same blocked positions."""
    rows: list[list[str]] = []
    for stage in range(stages):
        ops = ["F"] + (["I", "W"] if split and stage % 2 else ["B"])
        queues = [[f"{stage}{op}{mb}" for op in ops] for mb in range(microbatches)]
        row: list[str] = []
        while any(queues):
            queue = rng.choice([q for q in queues if q])
            row.append(queue.pop(0))
        rows.append(row)
    schedule = sched(*(" ".join(row) for row in rows))
    expected = _reference_blocked(schedule)
    grid = find_deadlock(schedule)
    finished = all(pos == len(actions) for pos, actions in zip(expected, schedule.ranks, strict=True))
    assert (grid is None) == finished
    if grid is not None:
        for rank, line in enumerate(grid.splitlines()):
            if expected[rank] < len(schedule.ranks[rank]):
                assert line.startswith(f"  rank {rank}: step {expected[rank]} ")


def test_find_deadlock_is_linear_in_actions(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 32-stage, 256-microbatch 1F1B: each action's dependency is looked up at most twice (once when its rank
    parks on it, once when woken), so the search is linear in the actions (counted, not timed)."""
    import importlib

    from pipeplan.schedules import make_schedule

    validate_module = importlib.import_module("pipeplan.core.validate")

    schedule = make_schedule("1f1b", stages=32, microbatches=256)
    calls = 0
    real = validate_module.dependency

    def counted(action: Action, num_stages: int) -> tuple[int, str, int] | None:
        nonlocal calls
        calls += 1
        return real(action, num_stages)

    monkeypatch.setattr(validate_module, "dependency", counted)
    assert find_deadlock(schedule) is None
    actions = sum(len(row) for row in schedule.ranks)
    assert actions <= calls <= 2 * actions
