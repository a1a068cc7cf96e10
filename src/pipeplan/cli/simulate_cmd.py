"""The `pipeplan simulate` command: simulate a named schedule with synthetic costs, or a plan file."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from pipeplan.cli.flags import OPTIMIZER_HELP, PBS_HELP, SCALING_HELP, parse_numbers, refuse_sizes_for_file
from pipeplan.core.errors import CostError, PlanError, ScheduleError
from pipeplan.schedules.registry import ASYNCHRONOUS, GENERATOR_NAMES, SCHEDULES, TABLE
from pipeplan.viz.json_print import print_json

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
    from pipeplan.presets.resolve import load_schedule
    from pipeplan.sim import simulate, uniform_costs
    from pipeplan.sim.trace import BandwidthTrace

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
        from pipeplan.sim.engine.iterations import simulate_iterations

        run = simulate_iterations(schedule, costs, trace if isinstance(trace, BandwidthTrace) else None, iterations)
    return simulate(schedule, costs, trace=trace, record=record), title, None, run


def simulate_plan_file(
    plan_path: str,
    profile: str | None,
    cluster: str | None,
    trace: object,
    record: bool,
    scaling: str,
    optimizer: str,
    check_memory: bool = True,
    profile_batch_size: int | None = None,
    remedy: str = "--ignore-memory simulates it anyway",
    iterations: int | None = None,
) -> tuple[SimResult, IterationRun | None]:
    """Read a plan file with its profile and cluster, and simulate it under the cost model of `scaling` and `optimizer`.

    Without --profile or --cluster, the names the plan file records are used.
    This is every check of a plan against its profile and cluster (layers,
    devices, replicas, schedule, memory): `train --plan` runs it too, before
    any process starts; `remedy` ends the memory error's message. With
    `iterations`, also the run of that many iterations on the trace's clock.

    Raises:
        PlanError: naming the plan file; also when the plan needs more memory than a device has (unless not
            `check_memory`).
    """
    from pipeplan import api
    from pipeplan.presets.resolve import load_plan, load_profile
    from pipeplan.sim.cost.layers import check_optimizer, check_scaling
    from pipeplan.sim.cost.model import CostModel
    from pipeplan.sim.trace import BandwidthTrace

    plan, names = load_plan(plan_path, profile, profile_batch_size)
    if record:
        facts = TABLE.get(plan.schedule)
        per = 3 if facts is not None and facts.split_backward else 2
        check_timeline(per * len(plan.stages) * plan.microbatches, f"plan {plan_path}")
    profile = profile or names.get("profile") or None
    cluster = cluster or names.get("cluster") or None
    missing = [flag for flag, value in (("--profile", profile), ("--cluster", cluster)) if value is None]
    if missing:
        raise PlanError(f"simulate --plan {plan_path} also needs {' and '.join(missing)} (a file path or a built-in name)")
    assert profile is not None and cluster is not None
    model_profile, machines = load_profile(profile, profile_batch_size), api.load_cluster(cluster)
    check_scaling(scaling)  # named as flags, before the API names them as arguments
    check_optimizer(optimizer)
    if isinstance(trace, BandwidthTrace):
        trace.check_devices(machines.num_devices, f"cluster {cluster}")
    try:
        result = api.simulate(plan, model_profile, machines, batch_scaling=scaling, optimizer=optimizer,
                              bandwidth_trace=trace, record=record, check_memory=check_memory)  # fmt: skip
    except api.PlanDoesNotFit as exc:
        raise PlanError(f"plan {plan_path} does not fit: {exc}; {remedy}") from None
    except PlanError as exc:
        raise PlanError(f"{plan_path}: {exc}") from None
    run = None
    if iterations is not None:
        from pipeplan.schedules.plan_schedule import plan_schedule
        from pipeplan.sim.cost.plan_costs import plan_costs
        from pipeplan.sim.engine.iterations import simulate_iterations

        bandwidth = trace if isinstance(trace, BandwidthTrace) else None
        model = CostModel.build(model_profile, machines, scaling, optimizer)
        run = simulate_iterations(plan_schedule(plan), plan_costs(plan, model, bandwidth), bandwidth, iterations)
    return result, run


def simulate(
    name: str | None = typer.Argument(
        None,
        help=f"Schedule: {', '.join(n + (' (asynchronous)' if n in ASYNCHRONOUS else '') for n in SCHEDULES)}, or a "
        "schedule .csv/.json file (omit with --plan).",
    ),
    stages: int | None = typer.Option(None, "--stages", "-p", help="Pipeline ranks p."),
    microbatches: int | None = typer.Option(None, "--microbatches", "-m", help="Microbatches m per iteration."),
    minibatches: int | None = typer.Option(
        None, "--minibatches", help="pipemare: minibatches of m microbatches streamed without a flush [max(8, 4 ceil(p/m) + 4)]."
    ),
    fwd: str | None = typer.Option(None, "--fwd", help="Forward ms per microbatch: one number or one per stage [1]."),
    bwd: str | None = typer.Option(None, "--bwd", help="Backward ms per microbatch: one number or one per stage [2]."),
    comm: str | None = typer.Option(None, "--comm", help="Transfer ms: one number or one per stage boundary [0]."),
    act_bytes: str | None = typer.Option(None, "--act-bytes", help="Saved bytes per microbatch per stage, e.g. 64M, 64Mi [0]."),
    bwd_input: str | None = typer.Option(None, "--bwd-input", help="I (backward for input) ms, zero-bubble [bwd/2]."),
    bwd_weight: str | None = typer.Option(None, "--bwd-weight", help="W (backward for weights) ms, zero-bubble [bwd/2]."),
    k: int = typer.Option(1, "--k", help="Group size k for kfkb."),
    chunks: int = typer.Option(1, "--chunks", "-v", help="Chunks v per rank for interleaved-1f1b."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    trace_out: str | None = typer.Option(None, "--trace", help="Write a Perfetto/Chrome trace JSON here."),
    png_out: str | None = typer.Option(None, "--png", help="Write a timeline PNG here."),
    bandwidth_trace: str | None = typer.Option(None, "--bandwidth-trace", help="Bandwidth trace JSON (link factors over time)."),
    plan: str | None = typer.Option(None, "--plan", help="Simulate this plan file instead of a named schedule."),
    profile: str | None = typer.Option(None, "--profile", help="Model profile (path or built-in name) for --plan."),
    cluster: str | None = typer.Option(None, "--cluster", help="Cluster (path or built-in name) for --plan."),
    batch_scaling: str | None = typer.Option(None, "--batch-scaling", help=SCALING_HELP + " With --plan; default auto."),
    optimizer: str | None = typer.Option(None, "--optimizer", help=OPTIMIZER_HELP + " With --plan; default adam."),
    ignore_memory: bool = typer.Option(False, "--ignore-memory", help="With --plan: simulate a plan that does not fit too."),
    profile_batch_size: int | None = typer.Option(None, "--profile-batch-size", help=PBS_HELP + " With --plan."),
    iterations: int | None = typer.Option(
        None, "--iterations", help="Also run N iterations back to back on the trace's clock: per-iteration times and peak memory."
    ),
) -> None:
    """Simulate one training iteration; print times, bubble and per-rank memory."""
    costs_text = {
        "--fwd": fwd,
        "--bwd": bwd,
        "--comm": comm,
        "--act-bytes": act_bytes,
        "--bwd-input": bwd_input,
        "--bwd-weight": bwd_weight,
    }
    from pipeplan.cli.outputs import IMAGE_SUFFIXES, Output, check_outputs, plan_inputs

    inputs = {"NAME": name, "--bandwidth-trace": bandwidth_trace, **plan_inputs(plan, profile, cluster)}
    check_outputs([Output("--trace", trace_out), Output("--png", png_out, IMAGE_SUFFIXES)], inputs)
    if iterations is not None and iterations < 1:
        raise CostError(f"--iterations must be an integer >= 1, got {iterations}")
    if iterations is not None and name in ASYNCHRONOUS:
        raise ScheduleError("--iterations does not apply to pipemare (it streams minibatches without a flush)")
    trace = None
    if bandwidth_trace is not None:
        from pipeplan.sim.trace import read_bandwidth_trace

        trace = read_bandwidth_trace(bandwidth_trace)
    record = trace_out is not None or png_out is not None
    steady = None
    if plan is not None:
        given = [flag for flag, value in costs_text.items() if value is not None]
        given += [flag for flag, value in (("--stages", stages), ("--microbatches", microbatches)) if value is not None]
        given += [flag for flag, value in (("--k", k != 1), ("--chunks", chunks != 1)) if value]
        if name is not None:
            raise PlanError(f"simulate takes a schedule NAME or --plan, not both (got {name!r} and --plan {plan})")
        if given:
            raise PlanError(f"{given[0]} does not apply to --plan (the plan file sets stages, microbatches and costs)")
        result, run = simulate_plan_file(plan, profile, cluster, trace, record, batch_scaling or "auto", optimizer or "adam",
                                         check_memory=not ignore_memory, profile_batch_size=profile_batch_size,
                                         iterations=iterations)  # fmt: skip
        if minibatches is not None:
            raise PlanError("--minibatches does not apply to --plan (it sets pipemare's minibatches)")
        title = f"plan {plan} ({result.schedule_name})"
    else:
        if name is None:
            raise ScheduleError(f"simulate needs a schedule NAME ({GENERATOR_NAMES}) or --plan FILE")
        for flag, value in (("--profile", profile), ("--cluster", cluster), ("--batch-scaling", batch_scaling),
                            ("--optimizer", optimizer), ("--ignore-memory", ignore_memory or None),
                            ("--profile-batch-size", profile_batch_size)):  # fmt: skip
            if value is not None:
                raise PlanError(f"{flag} applies only with --plan")
        refuse_sizes_for_file(name, stages, microbatches, k, chunks)
        result, title, steady, run = simulate_named(
            name, stages, microbatches, costs_text, k, chunks, trace, record, minibatches, iterations
        )
    report(result, title, as_json, trace_out, png_out, steady, run)


def report(
    result: SimResult,
    title: str,
    as_json: bool,
    trace_out: str | None,
    png_out: str | None,
    steady: SteadyState | None = None,
    run: IterationRun | None = None,
) -> None:
    """Print the result (table or JSON) and write the requested trace and PNG (each module imported only when used)."""
    if as_json:
        extra = {"pipemare": steady.to_json()} if steady is not None else {}
        print_json(result.to_json() | extra | ({"iterations": run.to_json()} if run is not None else {}))
    else:
        from pipeplan.viz.tables import METRICS_NOTE, print_tables, rank_table, summary_table

        print_tables(summary_table(result, title), rank_table(result))
        typer.echo(METRICS_NOTE)
        if steady is not None:
            typer.echo(
                f"pipemare steady state: utilization {steady.utilization:.1%} over {steady.start_ms:.1f}-{steady.end_ms:.1f} ms; "
                f"delays (optimizer steps, stage 0 first) {list(steady.delays)}; weight copies per stage "
                f"{list(steady.weight_copies)} (weight stashing would keep {list(steady.stashed_weight_copies)})"
            )
        if run is not None:
            times = run.iteration_ms
            typer.echo(
                f"{len(times)} iterations on the trace's clock: {run.total_ms:.6g} ms in all, per iteration mean "
                f"{sum(times) / len(times):.6g} ms (min {min(times):.6g}, max {max(times):.6g}); peak memory "
                f"{max(run.peak_bytes):.6g} bytes (--json lists each)"
            )
    # With --json, stdout holds exactly the JSON object; file notes go to stderr.
    if trace_out is not None:
        from pipeplan.viz.perfetto import write_trace

        write_trace(result, trace_out)
        typer.echo(f"wrote Perfetto trace {trace_out} (open in ui.perfetto.dev)", err=as_json)
    if png_out is not None:
        from pipeplan.viz.gantt import render_gantt

        render_gantt(result, png_out, title=title)
        typer.echo(f"wrote timeline {png_out}", err=as_json)


def register(app: typer.Typer) -> None:
    """Add `simulate` to app."""
    app.command("simulate")(simulate)
