"""simulate NAME: a generated (or read) schedule simulated with the synthetic costs of simulate's flags."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeplan.cli.flags import parse_numbers
from pipeplan.core.errors import CostError, ScheduleError
from pipeplan.schedules.registry import ASYNCHRONOUS

if TYPE_CHECKING:
    from pipeplan.core.schedule import Schedule
    from pipeplan.sim.engine.iterations import IterationRun
    from pipeplan.sim.result import SimResult
    from pipeplan.sim.steady import SteadyState

DEFAULTS = {"--fwd": "1", "--bwd": "2", "--comm": "0", "--act-bytes": "0"}
"""Synthetic costs when a flag is not given: F = 1 ms, B = 2 ms, no transfer time, no activation memory."""


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


def check_timeline(actions: int, what: str, hint: str = "leave out --png and --trace") -> None:
    """Refuse a timeline (--png, --trace, pipemare's steady state) of more actions than core.limits.TIMELINE_ACTIONS,
    before the simulation."""
    from pipeplan.core.errors import ScheduleTooLargeError
    from pipeplan.core.limits import TIMELINE_ACTIONS

    if not TIMELINE_ACTIONS.allows(actions):
        raise ScheduleTooLargeError(f"{TIMELINE_ACTIONS.message(f'the timeline of {what}', actions)}; {hint}")


def check_iterations(what: str, iterations: int, events: int, trace: object) -> None:
    """Refuse `--iterations` of a schedule of `events` per iteration under `trace` when its simulation would cost more
    than core.limits allows (core.work), before any is simulated."""
    from pipeplan.core.bandwidth_trace import BandwidthTrace
    from pipeplan.core.errors import ScheduleTooLargeError
    from pipeplan.core.work import check_iterations as check
    from pipeplan.sim.engine.iterations import trace_changes

    changes = trace_changes(trace if isinstance(trace, BandwidthTrace) else None)
    check(f"simulating {what}", "--iterations", iterations, events, changes, ScheduleTooLargeError)


def simulate_named(
    name: str,
    stages: int | None,
    microbatches: int | None,
    costs_text: dict[str, str | None],
    k: int,
    chunks: int,
    trace: object,
    record: bool,
    minibatches: int | None = None,
    iterations: int | None = None,
) -> tuple[SimResult, str, SteadyState | None, IterationRun | None]:
    """Generate schedule `name` (or read the schedule file `name`) and simulate it with the synthetic costs of the
    flags in `costs_text`; return the result, its title (name, p, m and k or v when not 1), for pipemare its
    steady state, and with `iterations` the run of that many iterations on the trace's clock."""
    from pipeplan.core.bandwidth_trace import BandwidthTrace
    from pipeplan.presets.resolve import load_schedule
    from pipeplan.sim import simulate, uniform_costs

    asynchronous = name in ASYNCHRONOUS
    if minibatches is not None and not asynchronous:
        raise ScheduleError(f"--minibatches applies only to pipemare (schedule {name!r} covers one minibatch)")
    from pipeplan.schedules.registry import SCHEDULES, action_count

    if record and not asynchronous and name in SCHEDULES and stages and microbatches and stages > 0 and microbatches > 0:
        # counted before the schedule is generated (3,200,000 actions take seconds to make); files are counted below
        check_timeline(action_count(name, stages, microbatches, chunks), f"{name} with p={stages}, m={microbatches}")
    if asynchronous and stages and microbatches and stages > 0 and microbatches > 0 and (minibatches or 1) > 0:
        from pipeplan.schedules.pipemare import default_minibatches

        minis = minibatches or default_minibatches(stages, microbatches)
        what = f"pipemare with p={stages}, m={microbatches} x {minis} minibatches"
        check_timeline(
            (2 * microbatches + 1) * stages * minis, what, "use fewer --minibatches (its steady state needs the timeline)"
        )
    priced = iterations is not None and name in SCHEDULES and bool(stages and microbatches and stages > 0 and microbatches > 0)
    if priced:  # before the schedule is generated, its own size checks first; a schedule file is priced once read
        assert iterations is not None and stages is not None and microbatches is not None
        from pipeplan.schedules.registry import TABLE, check_schedule_options
        from pipeplan.schedules.sizes import check_schedule_size, check_sizes

        check_sizes(stages=stages, microbatches=microbatches, k=k, chunks=chunks)
        check_schedule_options(name, microbatches, k, chunks)
        actions = action_count(name, stages, microbatches, chunks)
        sizes = {"stages": stages, "microbatches": microbatches} | ({"chunks": chunks} if TABLE[name].takes_chunks else {})
        check_schedule_size(name, sizes, stages, actions)
        ranks = stages * (chunks if TABLE[name].takes_chunks else 1)
        events = actions + 2 * (ranks - 1) * microbatches
        check_iterations(f"{name} with p={stages}, m={microbatches}", iterations, events, trace)
    if asynchronous and minibatches is not None and stages is not None and microbatches is not None:
        from pipeplan.schedules.pipemare import pipemare

        schedule = pipemare(stages, microbatches, minibatches)
    else:
        schedule = load_schedule(name, stages, microbatches, k=k, chunks=chunks)
    if isinstance(trace, BandwidthTrace):
        trace.check_devices(schedule.num_ranks, f"{name} with p={schedule.num_ranks} (one device per rank)")
    if asynchronous:
        minis = schedule.num_microbatches // (microbatches or 1)
        what = f"pipemare with p={schedule.num_ranks}, m={microbatches} x {minis} minibatches"
        check_timeline(sum(map(len, schedule.ranks)), what, "use fewer --minibatches (its steady state needs the timeline)")
    elif record:
        check_timeline(sum(map(len, schedule.ranks)), f"{name} with p={schedule.num_ranks}, m={schedule.num_microbatches}")
    text = {flag: value if value is not None else DEFAULTS.get(flag) for flag, value in costs_text.items()}
    costs = uniform_costs(
        schedule,
        fwd=stage_values("--fwd", text["--fwd"], schedule),
        bwd=stage_values("--bwd", text["--bwd"], schedule),
        comm=stage_values("--comm", text["--comm"], schedule, per_boundary=True),
        act_bytes=stage_values("--act-bytes", text["--act-bytes"], schedule),
        bwd_input=stage_values("--bwd-input", text["--bwd-input"], schedule),
        bwd_weight=stage_values("--bwd-weight", text["--bwd-weight"], schedule),
    )
    if asynchronous:
        from pipeplan.sim.steady import steady_state

        assert microbatches is not None
        result = simulate(schedule, costs, trace=trace, record=True)
        minis = schedule.num_microbatches // microbatches
        title = f"pipemare, p={schedule.num_ranks}, m={microbatches} x {minis} minibatches"
        return result, title, steady_state(schedule, result, microbatches), None
    title = f"{schedule.name or name}, p={schedule.num_ranks}, m={schedule.num_microbatches}"
    title += (f", k={k}" if k != 1 else "") + (f", v={chunks}" if chunks != 1 else "")
    run = None
    if iterations is not None:
        from pipeplan.sim.engine.iterations import iteration_events, simulate_iterations

        if not priced:
            what = f"{name} with p={schedule.num_ranks}, m={schedule.num_microbatches}"
            check_iterations(what, iterations, iteration_events(schedule, costs), trace)
        run = simulate_iterations(schedule, costs, trace if isinstance(trace, BandwidthTrace) else None, iterations)
    return simulate(schedule, costs, trace=trace, record=record), title, None, run
