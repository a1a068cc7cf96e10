"""A schedule compiled for the event loop: per-rank instruction tuples and its cost-independent statistics."""

from __future__ import annotations

from dataclasses import dataclass

from pipeplan.core.errors import ScheduleError
from pipeplan.core.schedule import Action, Schedule

OP_INDEX = {"F": 0, "B": 1, "I": 2, "W": 3, "U": 4}
"""Column of an op in the duration table: duration of (stage, op) = durations[stage * 5 + OP_INDEX[op]]."""

ALWAYS_READY = -1
"""Dependency slot of actions that wait for nothing: the last cell of the ready table, always 0.0."""

NO_SLOT = -2
"""`out`, `own` or `consumer` field that is unused."""

Instr = tuple[int, int, int, int, int, int, int, Action]
"""(duration column, dependency slot, out slot, boundary transfer, consumer rank, own slot, last-backward stage, action).

Slots index the ready table: 3 * (microbatch * stages + stage) + j with j = 0
for "F may start" (input delivered), 1 for "B/I may start" (gradient
delivered, or own F done on the last stage), 2 for "W may start" (own I done).
`out` is the slot this action's completion fills (after the transfer on
`boundary transfer`: b for the activation of boundary b, stages-1+b for its
gradient; -1 none), `consumer` the rank that may wait on it (this rank for the last stage's F); `own` a same-rank slot
filled at completion; `last-backward stage` is the stage whose last backward
this is (or -1).
"""


@dataclass(frozen=True, slots=True)
class Program:
    """The compiled schedule. Memory peaks and op counts depend only on the per-rank order, so they are computed here.

    In-flight (stage, microbatch) pairs change at an F's start (+1) and at a
    B's or W's end (-1); since a rank runs its actions one after another, the
    count over time follows the rank's order exactly.
    """

    schedule: Schedule
    num_stages: int
    num_microbatches: int
    code: tuple[list[Instr], ...]
    columns: tuple[dict[int, int], ...]
    peak_inflight: tuple[int, ...]
    stage_peak_inflight: tuple[int, ...]
    stages_with_u: frozenset[int]
    split_stages: frozenset[int]


def compile_schedule(schedule: Schedule) -> Program:
    """Encode `schedule` for the event loop.

    Raises:
        ScheduleError: an action's stage does not exist or belongs to another rank.
    """
    stages = schedule.num_stages
    s2r = schedule.stage_to_rank
    last = stages - 1
    ops = OP_INDEX
    code: list[list[Instr]] = []
    columns: list[dict[int, int]] = []
    last_backward: dict[int, tuple[int, int]] = {}
    max_mb = -1
    stage_count = [0] * stages
    stage_peak = [0] * stages
    rank_peak: list[int] = []
    with_u: set[int] = set()
    split: set[int] = set()
    for rank, actions in enumerate(schedule.ranks):
        instrs: list[Instr] = []
        column_counts: dict[int, int] = {}
        inflight = peak = 0
        for pos, action in enumerate(actions):
            s = action.stage
            op = action.op
            mb = action.microbatch
            if s > last or s2r[s] != rank:
                owner = f"belongs to rank {s2r[s]}" if s <= last else f"does not exist (stages 0..{last})"
                raise ScheduleError(f"rank {rank}, position {pos}, action {action}: stage {s} {owner}")
            if mb > max_mb:
                max_mb = mb
            base = 3 * (mb * stages + s)
            column = s * 5 + ops[op]
            column_counts[column] = column_counts.get(column, 0) + 1
            lb = -1
            if op == "F":
                inflight += 1
                if inflight > peak:
                    peak = inflight
                count = stage_count[s] + 1
                stage_count[s] = count
                if count > stage_peak[s]:
                    stage_peak[s] = count
                if s < last:
                    instr = (column, base if s else ALWAYS_READY, base + 3, s, s2r[s + 1], NO_SLOT, lb, action)
                else:
                    instr = (column, base if s else ALWAYS_READY, base + 1, -1, rank, NO_SLOT, lb, action)
            elif op == "B" or op == "I":
                if op == "B":
                    inflight -= 1
                    stage_count[s] -= 1
                    last_backward[s] = (rank, pos)
                else:
                    split.add(s)
                own = base + 2 if op == "I" else NO_SLOT
                if s > 0:
                    instr = (column, base + 1, base - 2, last + s - 1, s2r[s - 1], own, lb, action)
                else:
                    instr = (column, base + 1, NO_SLOT, -1, NO_SLOT, own, lb, action)
            elif op == "W":
                inflight -= 1
                stage_count[s] -= 1
                last_backward[s] = (rank, pos)
                instr = (column, base + 2, NO_SLOT, -1, NO_SLOT, NO_SLOT, lb, action)
            else:
                with_u.add(s)
                instr = (column, ALWAYS_READY, NO_SLOT, -1, NO_SLOT, NO_SLOT, lb, action)
            instrs.append(instr)
        code.append(instrs)
        columns.append(column_counts)
        rank_peak.append(peak)
    for s, (rank, pos) in last_backward.items():
        instr = code[rank][pos]
        code[rank][pos] = (*instr[:6], s, instr[7])
    return Program(
        schedule,
        stages,
        max_mb + 1,
        tuple(code),
        tuple(columns),
        tuple(rank_peak),
        tuple(stage_peak),
        frozenset(with_u),
        frozenset(split),
    )


def peak_saved_bytes(program: Program, rank: int, saved: tuple[float, ...]) -> float:
    """Max over time of the saved bytes of the in-flight microbatches on `rank` (per-stage `saved` bytes)."""
    stages = program.schedule.stages_of(rank)
    if len({saved[s] for s in stages}) <= 1:
        return program.peak_inflight[rank] * (saved[stages[0]] if stages else 0.0)
    held = peak = 0.0
    for instr in program.code[rank]:
        action = instr[7]
        if action.op == "F":
            held += saved[action.stage]
            peak = max(peak, held)
        elif action.op in "BW":
            held -= saved[action.stage]
    return peak
