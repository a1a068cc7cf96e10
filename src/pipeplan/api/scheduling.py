"""Schedules through the API: a generated (or read) schedule (`pipeplan schedule`), and one simulated with synthetic
costs given as text (`pipeplan simulate NAME`: one number or one per stage, sizes with a byte suffix), each refused
before any work when its timeline or its iterations would cost more than core.limits allows."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeplan.core.errors import CostError, ScheduleError
from pipeplan.core.limits import MAX_BYTES, MAX_MS
from pipeplan.schedules.registry import ASYNCHRONOUS, GENERATOR_NAMES, PLANNABLE, SCHEDULES, names_text

if TYPE_CHECKING:
    from pipeplan.core.schedule import Schedule
    from pipeplan.sim.engine.iterations import IterationRun
    from pipeplan.sim.result import SimResult
    from pipeplan.sim.steady import SteadyState

SCHEDULE_NAMES = tuple(SCHEDULES)
"""Every schedule a generator makes (schedules.registry), in the table's order."""
ASYNCHRONOUS_NAMES = ASYNCHRONOUS
"""The schedules that stream minibatches without a flush (pipemare)."""
GENERATORS_TEXT = GENERATOR_NAMES
"""SCHEDULE_NAMES as one comma-separated line."""
PLANNABLE_TEXT = names_text(PLANNABLE)
"""The schedules a plan may run, as a sentence's list ('gpipe, 1f1b, ... or list')."""
TRAIN_SCHEDULES_TEXT = ", ".join(n + (": asynchronous" if n in ASYNCHRONOUS else "") for n in SCHEDULES)
"""Every schedule train runs, each asynchronous one marked, as help text."""

SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "ki": 2**10, "kib": 2**10, "mi": 2**20, "mib": 2**20, "gi": 2**30, "gib": 2**30, "ti": 2**40, "tib": 2**40,
}  # fmt: skip
"""Byte-size suffixes (case-insensitive): k/M/G/T are powers of 1000, Ki/Mi/Gi/Ti powers of 1024."""

DEFAULTS = {"--fwd": "1", "--bwd": "2", "--comm": "0", "--act-bytes": "0"}
"""Synthetic costs when a flag is not given: F = 1 ms, B = 2 ms, no transfer time, no activation memory."""

COST_FLAGS = ("--fwd", "--bwd", "--comm", "--act-bytes", "--bwd-input", "--bwd-weight")
"""The synthetic costs simulate_schedule takes, by their flags."""


def parse_size(part: str) -> float:
    """One byte count, optionally with a suffix of SIZE_UNITS: '64M' = 64e6, '1.5GiB' = 1.5 * 2**30.

    Raises:
        ValueError: not a number with a known suffix.
    """
    match = re.fullmatch(r"\s*([0-9.eE+\-]+?)\s*([A-Za-z]*)\s*", part)
    if match is None or match.group(2).lower() not in SIZE_UNITS:
        raise ValueError(part)
    return float(match.group(1)) * SIZE_UNITS[match.group(2).lower()]


def cut(text: str) -> str:
    """repr of a flag's text, cut to 60 characters (a 5,000-digit number stays a readable line)."""
    shown = repr(text)
    return shown if len(shown) <= 60 else f"{shown[:57]}... ({len(text):,} characters)"


def parse_numbers(flag: str, text: str | None, sizes: bool = False) -> list[float] | None:
    """Parse a flag value: one number or a comma-separated list, each finite, >= 0 and within its magnitude limit
    (core.limits: MAX_BYTES with `sizes`, else MAX_MS: so sums over every microbatch stay finite).

    With `sizes`, each number may carry a byte suffix (SIZE_UNITS: 64M, 1.5GiB).

    Raises:
        CostError: naming the flag and the bad value.
    """
    if text is None:
        return None
    values = []
    for part in text.split(","):
        try:
            value = parse_size(part) if sizes else float(part)
        except ValueError:
            kind = "a byte size (e.g. 64M, 1.5GiB) or a comma-separated list of sizes"
            if not sizes:
                kind = "a number or a comma-separated list of numbers"
            raise CostError(f"{flag} must be {kind}, got {cut(text)}") from None
        if math.isnan(value) or math.isinf(value) or value < 0:
            raise CostError(f"{flag} values must be finite and >= 0, got {cut(part.strip())}")
        (MAX_BYTES if sizes else MAX_MS).check(CostError, flag, value)
        values.append(value)
    return values


def stage_values(flag: str, text: str | None, schedule: Schedule, per_boundary: bool = False) -> float | list[float] | None:
    """A cost flag as uniform_costs takes it: one number for every stage, or one per stage (boundary).

    For a schedule with v > 1 chunks per rank (interleaved-1f1b), one number is
    the cost of a rank's full stage, so each of its v chunk-stages gets 1/v of
    it; a list gives one value per chunk-stage. `--comm` is never split: an
    activation crossing a chunk boundary is as large as one crossing a stage boundary.

    Raises:
        CostError: a bad number, or a list whose length is not the number of stages (boundaries).
    """
    values = parse_numbers(flag, text, sizes=flag == "--act-bytes")
    if values is None:
        return None
    if len(values) == 1:
        from pipeplan.sim.cost.synthetic import chunk_share

        return values[0] if per_boundary else chunk_share(values[0], schedule)
    want = schedule.num_stages - 1 if per_boundary else schedule.num_stages
    if len(values) != want:
        what = "stage boundary" if per_boundary else "stage"
        if schedule.num_stages > schedule.num_ranks:
            what += f"; {schedule.num_ranks} ranks x {schedule.num_stages // schedule.num_ranks} chunks"
        raise CostError(f"{flag} needs one number or {want} (one per {what}), got {len(values)}: {text!r}")
    return values


def check_timeline(actions: int, what: str, hint: str = "leave out --png and --timeline") -> None:
    """Refuse a timeline (--png, --timeline, pipemare's steady state) of more actions than core.limits.TIMELINE_ACTIONS,
    before the simulation."""
    from pipeplan.core.errors import ScheduleTooLargeError
    from pipeplan.core.limits import TIMELINE_ACTIONS

    if not TIMELINE_ACTIONS.allows(actions):
        raise ScheduleTooLargeError(f"{TIMELINE_ACTIONS.message(f'the timeline of {what}', actions)}; {hint}")


def check_iteration_count(iterations: int | None) -> None:
    """`--iterations`, when given, is at least 1 (simulate NAME and simulate --plan).

    Raises:
        CostError: naming --iterations and the value.
    """
    if iterations is not None and iterations < 1:
        raise CostError(f"--iterations must be an integer >= 1, got {iterations}")


def check_iterations(what: str, iterations: int, events: int, trace: object) -> None:
    """Refuse `--iterations` of a schedule of `events` per iteration under `trace` when its simulation would cost more
    than core.limits allows (core.work), before any is simulated."""
    from pipeplan.core.errors import ScheduleTooLargeError
    from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace
    from pipeplan.core.work import check_iterations as check
    from pipeplan.sim.engine.iterations import trace_changes

    changes = trace_changes(trace if isinstance(trace, BandwidthTrace) else None)
    check(f"simulating {what}", "--iterations", iterations, events, changes, ScheduleTooLargeError)


def schedule_of(name: str, stages: int | None, microbatches: int | None, k: int = 1, chunks: int = 1) -> Schedule:
    """Schedule `name` generated with its sizes, or the schedule file `name` read and validated (`pipeplan schedule`).

    Raises:
        ScheduleError: an unknown name, missing or bad sizes, a bad or missing file.
    """
    from pipeplan.presets.resolve import load_schedule

    return load_schedule(name, stages, microbatches, k=k, chunks=chunks)


@dataclass(frozen=True)
class ScheduleRun:
    """simulate_schedule's answer: the simulated iteration, its title (name, p, m, and k or v when not 1), for
    pipemare its steady state, with `iterations` the run of that many iterations on the trace's clock."""

    result: SimResult
    title: str
    steady: SteadyState | None = None
    run: IterationRun | None = None


def simulate_schedule(
    name: str,
    stages: int | None,
    microbatches: int | None,
    costs: Mapping[str, str | None],
    *,
    k: int = 1,
    chunks: int = 1,
    bandwidth_trace: str | None = None,
    record: bool = False,
    minibatches: int | None = None,
    iterations: int | None = None,
) -> ScheduleRun:
    """Generate schedule `name` (or read the schedule file `name`) and simulate it with the synthetic costs `costs`
    (COST_FLAGS to their text: one number or one per stage, DEFAULTS when None) under the bandwidth trace file
    `bandwidth_trace` (`pipeplan simulate NAME`).

    Raises:
        ScheduleError, ScheduleTooLargeError, CostError: naming the flag and the value, before any simulation.
    """
    from pipeplan.io.bandwidth_trace_json import read_bandwidth_trace

    check_iteration_count(iterations)
    if iterations is not None and name in ASYNCHRONOUS:
        raise ScheduleError("--iterations does not apply to pipemare (it streams minibatches without a flush)")
    trace = read_bandwidth_trace(bandwidth_trace) if bandwidth_trace is not None else None
    asynchronous = name in ASYNCHRONOUS
    if minibatches is not None and not asynchronous:
        raise ScheduleError(f"--minibatches applies only to pipemare (schedule {name!r} covers one minibatch)")
    from pipeplan.schedules.registry import action_count

    sized = bool(stages and microbatches and stages > 0 and microbatches > 0)
    if record and not asynchronous and name in SCHEDULES and sized:
        # counted before the schedule is generated (3,200,000 actions take seconds to make); files are counted below
        assert stages is not None and microbatches is not None
        check_timeline(action_count(name, stages, microbatches, chunks), f"{name} with p={stages}, m={microbatches}")
    if asynchronous and sized and (minibatches or 1) > 0:
        from pipeplan.schedules.pipemare import default_minibatches

        assert stages is not None and microbatches is not None
        minis = minibatches or default_minibatches(stages, microbatches)
        what = f"pipemare with p={stages}, m={microbatches} x {minis} minibatches"
        check_timeline(
            (2 * microbatches + 1) * stages * minis, what, "use fewer --minibatches (its steady state needs the timeline)"
        )
    priced = iterations is not None and name in SCHEDULES and sized
    if priced:  # before the schedule is generated, its own size checks first; a schedule file is priced once read
        assert iterations is not None and stages is not None and microbatches is not None
        _check_iterations_before(name, stages, microbatches, k, chunks, iterations, trace)
    if asynchronous and minibatches is not None and stages is not None and microbatches is not None:
        from pipeplan.schedules.pipemare import pipemare

        schedule = pipemare(stages, microbatches, minibatches)
    else:
        schedule = schedule_of(name, stages, microbatches, k=k, chunks=chunks)
    if trace is not None:
        trace.check_devices(schedule.num_ranks, f"{name} with p={schedule.num_ranks} (one device per rank)")
    if asynchronous:
        minis = schedule.num_microbatches // (microbatches or 1)
        what = f"pipemare with p={schedule.num_ranks}, m={microbatches} x {minis} minibatches"
        check_timeline(sum(map(len, schedule.ranks)), what, "use fewer --minibatches (its steady state needs the timeline)")
    elif record:
        check_timeline(sum(map(len, schedule.ranks)), f"{name} with p={schedule.num_ranks}, m={schedule.num_microbatches}")
    return _simulated(name, schedule, costs, k, chunks, trace, record, microbatches, iterations, priced)


def _check_iterations_before(
    name: str, stages: int, microbatches: int, k: int, chunks: int, iterations: int, trace: object
) -> None:
    """Price `iterations` of generator `name` from its sizes alone, its own size checks first."""
    from pipeplan.schedules.registry import TABLE, action_count, check_schedule_options
    from pipeplan.schedules.sizes import check_schedule_size, check_sizes

    check_sizes(stages=stages, microbatches=microbatches, k=k, chunks=chunks)
    check_schedule_options(name, microbatches, k, chunks)
    actions = action_count(name, stages, microbatches, chunks)
    sizes = {"stages": stages, "microbatches": microbatches} | ({"chunks": chunks} if TABLE[name].takes_chunks else {})
    check_schedule_size(name, sizes, stages, actions)
    ranks = stages * (chunks if TABLE[name].takes_chunks else 1)
    events = actions + 2 * (ranks - 1) * microbatches
    check_iterations(f"{name} with p={stages}, m={microbatches}", iterations, events, trace)


def _simulated(
    name: str,
    schedule: Schedule,
    costs: Mapping[str, str | None],
    k: int,
    chunks: int,
    trace: object,
    record: bool,
    microbatches: int | None,
    iterations: int | None,
    priced: bool,
) -> ScheduleRun:
    """`schedule` priced with the costs' text and simulated: pipemare with its steady state, any other once, and with
    `iterations` that many back to back on the trace's clock (priced first unless already)."""
    from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace
    from pipeplan.sim import simulate, uniform_costs

    text = {flag: costs.get(flag) if costs.get(flag) is not None else DEFAULTS.get(flag) for flag in COST_FLAGS}
    priced_costs = uniform_costs(
        schedule,
        fwd=stage_values("--fwd", text["--fwd"], schedule),
        bwd=stage_values("--bwd", text["--bwd"], schedule),
        comm=stage_values("--comm", text["--comm"], schedule, per_boundary=True),
        act_bytes=stage_values("--act-bytes", text["--act-bytes"], schedule),
        bwd_input=stage_values("--bwd-input", text["--bwd-input"], schedule),
        bwd_weight=stage_values("--bwd-weight", text["--bwd-weight"], schedule),
    )
    if name in ASYNCHRONOUS:
        from pipeplan.sim.steady import steady_state

        assert microbatches is not None
        result = simulate(schedule, priced_costs, trace=trace, record=True)
        minis = schedule.num_microbatches // microbatches
        title = f"pipemare, p={schedule.num_ranks}, m={microbatches} x {minis} minibatches"
        return ScheduleRun(result, title, steady_state(schedule, result, microbatches))
    title = f"{schedule.name or name}, p={schedule.num_ranks}, m={schedule.num_microbatches}"
    title += (f", k={k}" if k != 1 else "") + (f", v={chunks}" if chunks != 1 else "")
    run = None
    if iterations is not None:
        from pipeplan.sim.engine.iterations import iteration_events, simulate_iterations

        if not priced:
            what = f"{name} with p={schedule.num_ranks}, m={schedule.num_microbatches}"
            check_iterations(what, iterations, iteration_events(schedule, priced_costs), trace)
        run = simulate_iterations(schedule, priced_costs, trace if isinstance(trace, BandwidthTrace) else None, iterations)
    return ScheduleRun(simulate(schedule, priced_costs, trace=trace, record=record), title, None, run)
