"""Schedule validation: completeness, per-rank order and an acyclic dependency graph."""

from __future__ import annotations

from collections import Counter

from pipeplan.core.errors import ScheduleError
from pipeplan.core.schedule import Action, Schedule


def dependency(action: Action, num_stages: int) -> tuple[int, str, int] | None:
    """The cross-stage action `action` waits for, as (stage, ops, microbatch), or None.

    F of stage s needs F of stage s-1; B or I of stage s needs the B or I of
    stage s+1 (the gradient). Same-stage order (F before B, I before W) is the
    rank's own order and is checked separately.
    """
    if action.op == "F" and action.stage > 0:
        return (action.stage - 1, "F", action.microbatch)
    if action.op in "BI" and action.stage < num_stages - 1:
        return (action.stage + 1, "BI", action.microbatch)
    return None


def waiting_grid(schedule: Schedule, positions: list[int]) -> str:
    """Describe, one line per rank, the action each rank is blocked on and what it waits for."""
    lines = []
    for rank, actions in enumerate(schedule.ranks):
        pos = positions[rank]
        if pos >= len(actions):
            lines.append(f"  rank {rank}: finished ({len(actions)} actions)")
            continue
        action = actions[pos]
        dep = dependency(action, schedule.num_stages)
        if dep is None:
            wait = "nothing (runnable)"
        else:
            wait = f"{dep[0]}{dep[1][0] if dep[1] == 'F' else 'B/I'}{dep[2]} from rank {schedule.stage_to_rank[dep[0]]}"
        done_part = " ".join(str(a) for a in actions[max(0, pos - 3) : pos])
        lines.append(f"  rank {rank}: step {pos} [{done_part} >{action}<] waits for {wait}")
    return "\n".join(lines)


def _provides(action: Action) -> tuple[int, str, int] | None:
    """The dependency key an action satisfies once it has run (see `dependency`); None for W and U."""
    if action.op == "F":
        return (action.stage, "F", action.microbatch)
    if action.op in "BI":
        return (action.stage, "BI", action.microbatch)
    return None


def find_deadlock(schedule: Schedule) -> str | None:
    """Run the schedule with unit durations; return the waiting grid if it gets stuck, else None.

    Linear in the number of actions: a rank that blocks parks on the one key it
    waits for and is woken when an action provides that key, so no rank is
    visited twice at the same position.
    """
    num_stages = schedule.num_stages
    positions = [0] * schedule.num_ranks
    provided: set[tuple[int, str, int]] = set()
    parked: dict[tuple[int, str, int], list[int]] = {}
    runnable = list(range(schedule.num_ranks - 1, -1, -1))
    while runnable:
        rank = runnable.pop()
        actions = schedule.ranks[rank]
        pos = positions[rank]
        while pos < len(actions):
            action = actions[pos]
            dep = dependency(action, num_stages)
            if dep is not None and dep not in provided:
                parked.setdefault(dep, []).append(rank)
                break
            key = _provides(action)
            if key is not None and key not in provided:
                provided.add(key)
                runnable.extend(parked.pop(key, ()))
            pos += 1
        positions[rank] = pos
    if all(positions[rank] == len(actions) for rank, actions in enumerate(schedule.ranks)):
        return None
    return waiting_grid(schedule, positions)


def validate(schedule: Schedule) -> Schedule:
    """Check a schedule and return it unchanged.

    Checks that every action's stage lives on its rank, each (stage,
    microbatch) has one F and either one B or one I and one W, each rank runs
    F before B/I and I before W of the same microbatch, and the dependency
    graph is acyclic.

    Raises:
        ScheduleError: naming the first violation (rank, position, action).
    """
    num_stages = schedule.num_stages
    stage_to_rank = schedule.stage_to_rank
    seen: Counter[tuple[int, str, int]] = Counter()
    for rank, actions in enumerate(schedule.ranks):
        for pos, action in enumerate(actions):
            stage, op, mb = action.stage, action.op, action.microbatch
            problem = None
            if stage >= num_stages:
                problem = f"stage {stage} does not exist (stages 0..{num_stages - 1})"
            elif stage_to_rank[stage] != rank:
                problem = f"stage {stage} belongs to rank {stage_to_rank[stage]}"
            elif op != "U" and (stage, op, mb) in seen:
                problem = "duplicate action"
            elif op in "BI" and (stage, "F", mb) not in seen:
                problem = f"backward before the forward {stage}F{mb}"
            elif op == "W" and (stage, "I", mb) not in seen:
                problem = f"weight backward before {stage}I{mb}"
            if problem is not None:
                raise ScheduleError(f"rank {rank}, position {pos}, action {action}: {problem}")
            seen[(stage, op, mb)] += 1
    _check_complete(schedule, seen)
    grid = find_deadlock(schedule)
    if grid is not None:
        raise ScheduleError(f"schedule {schedule.name!r} has a dependency cycle; blocked ranks:\n{grid}")
    return schedule


def _check_complete(schedule: Schedule, seen: Counter[tuple[int, str, int]]) -> None:
    microbatches = schedule.num_microbatches
    for stage in range(schedule.num_stages):
        rank = schedule.stage_to_rank[stage]
        for mb in range(microbatches):
            has_b, has_i, has_w = seen[(stage, "B", mb)], seen[(stage, "I", mb)], seen[(stage, "W", mb)]
            if not seen[(stage, "F", mb)]:
                raise ScheduleError(f"rank {rank}: missing action {stage}F{mb}")
            if has_b and (has_i or has_w):
                raise ScheduleError(f"rank {rank}: {stage}B{mb} and a split backward (I/W) of the same microbatch")
            if not has_b and not (has_i and has_w):
                missing = f"{stage}B{mb}" if not (has_i or has_w) else f"{stage}{'W' if has_i else 'I'}{mb}"
                raise ScheduleError(f"rank {rank}: missing action {missing}")
