"""A schedule compiled for the event loop: per-rank instruction tuples and its cost-independent statistics."""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass
from operator import itemgetter

from pipeplan.core.errors import ScheduleError
from pipeplan.core.schedule import Schedule
from pipeplan.sim.cost.held import peak_held

OP_INDEX = {"F": 0, "B": 1, "I": 2, "W": 3, "U": 4}
"""Column of an op in the duration table: duration of (stage, op) = durations[stage * 5 + OP_INDEX[op]]."""

ALWAYS_READY = -1
"""Dependency slot of actions that wait for nothing (U): the last cell of the ready table, always 0.0.

Stage 0's F slots are filled with 0.0 before the run (its input is the batch)."""

NO_SLOT = -2
"""An unused `out` or `consumer` field; also "waiting for nothing" in the loops."""

Instr = tuple[int, int, int, int, int, int, int, str, int]
"""(duration column, dependency slot, out slot, boundary transfer, consumer rank, extra, stage, op, microbatch).

Slots index the ready table: 3 * (microbatch * stages + stage) + j with j = 0
for "F may start" (input delivered), 1 for "B/I may start" (gradient
delivered, or own F done on the last stage), 2 for "W may start" (own I done).
`out` is the slot this action's completion fills (NO_SLOT: none), after the
transfer `boundary transfer` (b for the activation of boundary b, stages-1+b
for its gradient; -1: none); `consumer` is the rank that may wait on `out`.
`extra` is 0, or for an I: 1 + its W slot (filled at its end), or for the
last backward (B/W) of a stage s: -(s + 1).
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
    code: list[list[Instr]] = []
    columns: list[dict[int, int]] = []
    rank_peak: list[int] = []
    max_mb = -1
    for rank, actions in enumerate(schedule.ranks):
        instrs: list[Instr] = []
        add = instrs.append
        inflight = peak = 0
        for action in actions:
            s = action.stage
            op = action.op
            mb = action.microbatch
            if s > last or s2r[s] != rank:
                _misplaced(schedule, rank, len(instrs))
            base = 3 * (mb * stages + s)
            if op == "F":
                inflight += 1
                if inflight > peak:
                    peak = inflight
                if s < last:
                    add((s * 5, base, base + 3, s, s2r[s + 1], 0, s, op, mb))
                else:
                    add((s * 5, base, base + 1, -1, rank, 0, s, op, mb))
            elif op == "B":
                inflight -= 1
                if s:
                    add((s * 5 + 1, base + 1, base - 2, last + s - 1, s2r[s - 1], 0, s, op, mb))
                else:
                    add((s * 5 + 1, base + 1, NO_SLOT, -1, NO_SLOT, 0, s, op, mb))
            elif op == "I":
                if s:
                    add((s * 5 + 2, base + 1, base - 2, last + s - 1, s2r[s - 1], base + 3, s, op, mb))
                else:
                    add((s * 5 + 2, base + 1, NO_SLOT, -1, NO_SLOT, base + 3, s, op, mb))
            elif op == "W":
                inflight -= 1
                add((s * 5 + 3, base + 2, NO_SLOT, -1, NO_SLOT, 0, s, op, mb))
            else:
                add((s * 5 + 4, ALWAYS_READY, NO_SLOT, -1, NO_SLOT, 0, s, op, mb))
        code.append(instrs)
        columns.append(dict(Counter(map(itemgetter(0), instrs))))
        rank_peak.append(peak)
        if instrs:
            max_mb = max(max_mb, max(map(itemgetter(8), instrs)))
        _mark_last_backwards(instrs, len(schedule.stages_of(rank)))
    stage_peak = list(rank_peak[r] for r in s2r)
    for rank, instrs in enumerate(code):
        if len(schedule.stages_of(rank)) > 1:
            for s, peak in _stage_peaks(instrs).items():
                stage_peak[s] = peak
    used = {divmod(column, 5) for cols in columns for column in cols}
    op_stages = {op: frozenset(s for s, col in used if col == OP_INDEX[op]) for op in "IU"}
    return Program(
        schedule,
        stages,
        max_mb + 1,
        tuple(code),
        tuple(columns),
        tuple(rank_peak),
        tuple(stage_peak),
        op_stages["U"],
        op_stages["I"],
    )


PROGRAM_CACHE_ACTIONS = 600_000
"""The most actions the compiled schedules remembered by program_for hold together (about 100 MB of instructions):
a planner scores the same few hundred short schedules (one per p, m, k) under thousands of stage costs, and compiling
them again was a sixth of its simulation time. The last PROGRAM_CACHE_MIN are kept whatever their size."""
PROGRAM_CACHE_MIN = 4


class _ProgramCache:
    """Compiled schedules by the id of their (held, so still living) schedule, least recently used dropped first."""

    def __init__(self) -> None:
        self.programs: OrderedDict[int, Program] = OrderedDict()
        self.actions = 0

    def get(self, schedule: Schedule) -> Program:
        key = id(schedule)
        program = self.programs.get(key)
        if program is not None:  # it holds its schedule, so no other object has that id
            self.programs.move_to_end(key)
            return program
        program = compile_schedule(schedule)
        self.programs[key] = program
        self.actions += _actions(program)
        while len(self.programs) > PROGRAM_CACHE_MIN and self.actions > PROGRAM_CACHE_ACTIONS:
            self.actions -= _actions(self.programs.popitem(last=False)[1])
        return program

    def clear(self) -> None:
        self.programs.clear()
        self.actions = 0


_PROGRAMS = _ProgramCache()


def program_for(schedule: Schedule) -> Program:
    """The compiled form of `schedule`, reused while the same object is simulated again (planner searches): the most
    recently used ones are remembered, up to PROGRAM_CACHE_ACTIONS actions in all (at least PROGRAM_CACHE_MIN)."""
    return _PROGRAMS.get(schedule)


def forget_programs() -> None:
    """Drop every cached compiled schedule (benchmarks time cold runs with this)."""
    _PROGRAMS.clear()


def _actions(program: Program) -> int:
    return sum(map(len, program.code))


def _mark_last_backwards(instrs: list[Instr], stages_here: int) -> None:
    """Set `extra` = -(s + 1) on the last B or W of each stage s in one rank's order (scanning back, stopping early)."""
    seen: set[int] = set()
    for pos in range(len(instrs) - 1, -1, -1):
        instr = instrs[pos]
        if instr[7] in "BW" and instr[6] not in seen:
            seen.add(instr[6])
            instrs[pos] = (*instr[:5], -(instr[6] + 1), *instr[6:])
            if len(seen) == stages_here:
                return


def _misplaced(schedule: Schedule, rank: int, pos: int) -> None:
    action = schedule.ranks[rank][pos]
    s = action.stage
    last = schedule.num_stages - 1
    owner = f"belongs to rank {schedule.stage_to_rank[s]}" if s <= last else f"does not exist (stages 0..{last})"
    raise ScheduleError(f"rank {rank}, position {pos}, action {action}: stage {s} {owner}")


def _stage_peaks(instrs: list[Instr]) -> dict[int, int]:
    """Peak in-flight microbatches of each stage in one rank's order."""
    count: dict[int, int] = {}
    peak: dict[int, int] = {}
    for instr in instrs:
        s, op = instr[6], instr[7]
        if op == "F":
            count[s] = count.get(s, 0) + 1
            peak[s] = max(peak.get(s, 0), count[s])
        elif op in "BW":
            count[s] = count.get(s, 0) - 1
    return peak


def peak_saved_bytes(program: Program, rank: int, saved: tuple[float, ...]) -> float:
    """Max over time of the saved bytes of the in-flight microbatches on `rank` (per-stage `saved` bytes)."""
    stages = program.schedule.stages_of(rank)
    if len({saved[s] for s in stages}) <= 1:
        return program.peak_inflight[rank] * (saved[stages[0]] if stages else 0.0)
    return peak_held(((instr[6], instr[7]) for instr in program.code[rank]), saved)
