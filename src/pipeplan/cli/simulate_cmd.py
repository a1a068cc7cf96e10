"""The `pipeplan simulate` command: a named schedule with synthetic costs (api.scheduling.simulate_schedule), or a plan
file (api.simulation.simulate_plan_file); print the result and write the timelines asked for."""

from __future__ import annotations

from typing import NamedTuple

import typer

from pipeplan.api.scheduling import ASYNCHRONOUS_NAMES, GENERATORS_TEXT, SCHEDULE_NAMES, ScheduleRun, simulate_schedule
from pipeplan.cli.flags import OPTIMIZER_HELP, PBS_HELP, SCALING_HELP, refuse_sizes_for_file
from pipeplan.core.errors import OutputError, PlanError, ScheduleError
from pipeplan.viz.json_print import print_json


class Timeline(NamedTuple):
    """Where --timeline (or its old name --trace, which still prints "trace") writes the Perfetto timeline."""

    path: str
    word: str


def simulate(
    name: str | None = typer.Argument(
        None,
        help=f"Schedule: {', '.join(n + (' (asynchronous)' if n in ASYNCHRONOUS_NAMES else '') for n in SCHEDULE_NAMES)}, or a "
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
    timeline_out: str | None = typer.Option(
        None, "--timeline", help="Write the timeline here as Perfetto/Chrome trace-event JSON (open in ui.perfetto.dev)."
    ),
    trace_out: str | None = typer.Option(None, "--trace", hidden=True, help="Deprecated: the old name of --timeline."),
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
    from pipeplan.cli.declared_files import check_files

    if timeline_out is not None and trace_out is not None:
        raise OutputError(
            f"--trace is the old name of --timeline; give one of them (got --timeline {timeline_out!r} and --trace {trace_out!r})"
        )
    check_files()
    timeline = Timeline(timeline_out, "timeline") if timeline_out is not None else None
    timeline = Timeline(trace_out, "trace") if trace_out is not None else timeline
    record = timeline is not None or png_out is not None
    if plan is not None:
        given = [flag for flag, value in costs_text.items() if value is not None]
        given += [flag for flag, value in (("--stages", stages), ("--microbatches", microbatches)) if value is not None]
        given += [flag for flag, value in (("--k", k != 1), ("--chunks", chunks != 1)) if value]
        if name is not None:
            raise PlanError(f"simulate takes a schedule NAME or --plan, not both (got {name!r} and --plan {plan})")
        if given:
            raise PlanError(f"{given[0]} does not apply to --plan (the plan file sets stages, microbatches and costs)")
        if minibatches is not None:
            raise PlanError("--minibatches does not apply to --plan (it sets pipemare's minibatches)")
        from pipeplan.api.simulation import simulate_plan_file

        result, run = simulate_plan_file(plan, profile, cluster, bandwidth_trace, record, batch_scaling or "auto",
                                         optimizer or "adam", check_memory=not ignore_memory,
                                         profile_batch_size=profile_batch_size, iterations=iterations)  # fmt: skip
        report(ScheduleRun(result, f"plan {plan} ({result.schedule_name})", None, run), as_json, timeline, png_out)
        return
    if name is None:
        raise ScheduleError(f"simulate needs a schedule NAME ({GENERATORS_TEXT}) or --plan FILE")
    for flag, value in (("--profile", profile), ("--cluster", cluster), ("--batch-scaling", batch_scaling),
                        ("--optimizer", optimizer), ("--ignore-memory", ignore_memory or None),
                        ("--profile-batch-size", profile_batch_size)):  # fmt: skip
        if value is not None:
            raise PlanError(f"{flag} applies only with --plan")
    refuse_sizes_for_file(name, stages, microbatches, k, chunks)
    simulated = simulate_schedule(name, stages, microbatches, costs_text, k=k, chunks=chunks, bandwidth_trace=bandwidth_trace,
                                  record=record, minibatches=minibatches, iterations=iterations)  # fmt: skip
    report(simulated, as_json, timeline, png_out)


def report(simulated: ScheduleRun, as_json: bool, timeline: Timeline | None, png_out: str | None) -> None:
    """Print the result (table or JSON) and write the requested Perfetto timeline and PNG (each module imported only
    when used)."""
    result, title, steady, run = simulated.result, simulated.title, simulated.steady, simulated.run
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
    if timeline is not None:
        from pipeplan.viz.perfetto import write_timeline

        write_timeline(result, timeline.path)
        typer.echo(f"wrote Perfetto {timeline.word} {timeline.path} (open in ui.perfetto.dev)", err=as_json)
    if png_out is not None:
        from pipeplan.viz.gantt import render_gantt

        render_gantt(result, png_out, title=title)
        typer.echo(f"wrote timeline {png_out}", err=as_json)


def register(app: typer.Typer) -> None:
    """Add `simulate` to app."""
    app.command("simulate")(simulate)
