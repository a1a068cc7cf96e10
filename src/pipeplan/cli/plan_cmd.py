"""The `pipeplan plan` and `pipeplan compare` commands: check the flags, run the planner(s), print through viz."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import typer

from pipeplan.cli.flags import MEMORY_BUDGET_HELP, OPTIMIZER_HELP, PBS_HELP, REPLICATION_HELP, SCALING_HELP, parse_budget
from pipeplan.core.errors import PlanError
from pipeplan.core.limits import OPTIMIZER_FACTOR, SAMPLES
from pipeplan.schedules.registry import PLANNABLE, names_text, no_k_to_adapt
from pipeplan.viz.json_print import print_json
from pipeplan.viz.progress import progress_display

if TYPE_CHECKING:
    from pipeplan.planner.bound.plan_bound import PlanBound
    from pipeplan.planner.compare import Comparison

BOUND_HELP = "Also compute the proven lower bound of the plan's class and the time over it (seconds; minutes on 1,000+ GPUs)."
"""--bound of plan and compare (planner.bound.plan_bound)."""
SCHEDULE_HELP = f"auto, {names_text(PLANNABLE)}."
"""--schedule of plan and compare: the schedules a plan may run (schedules.registry.TABLE)."""

# The options plan and compare share (one declaration each; typer reads them, never changes them).
PROFILE = typer.Option(..., "--profile", help="Model profile: a file path or a built-in name (e.g. dapple/bert-48).")
CLUSTER = typer.Option(..., "--cluster", help="Cluster: a file path or a built-in name (e.g. v100-8x2-25g).")
GLOBAL_BATCH = typer.Option(..., "--global-batch", help="Samples per iteration over all pipeline replicas.")
SCHEDULE = typer.Option("auto", "--schedule", help=SCHEDULE_HELP)
BATCH_SCALING = typer.Option("auto", "--batch-scaling", help=SCALING_HELP)
OPTIMIZER = typer.Option("adam", "--optimizer", help=OPTIMIZER_HELP)
PROFILE_BATCH_SIZE = typer.Option(None, "--profile-batch-size", help=PBS_HELP)
REPLICATION = typer.Option("any", "--replication", help=REPLICATION_HELP)
BOUND = typer.Option(False, "--bound", help=BOUND_HELP)
OPTIMIZER_FACTOR_OPTION = typer.Option(
    None, "--optimizer-factor", help="Optimizer state bytes per parameter byte [the optimizer's own: adam 2, sgd 0]."
)


def _check_replication(replication: str) -> str:
    """--replication is one of REPLICATION_CHOICES."""
    from pipeplan.planner.request import REPLICATION_CHOICES

    if replication not in REPLICATION_CHOICES:
        raise PlanError(f"--replication must be one of {', '.join(REPLICATION_CHOICES)}, got {replication!r}")
    return replication


def _check_factor(factor: float | None) -> None:
    """--optimizer-factor, when given, is a finite number >= 0."""
    if factor is not None and not (math.isfinite(factor) and factor >= 0):
        raise PlanError(f"--optimizer-factor must be a finite number >= 0 (state bytes per parameter byte), got {factor}")
    if factor is not None:
        OPTIMIZER_FACTOR.check(PlanError, "--optimizer-factor", factor)


def _check_adaptive(adaptive: bool, schedule: str, memory_budget: str | None, trace: bool) -> float | None:
    """--adaptive and --memory-budget, before planning: --adaptive needs a schedule with a k (auto plans kfkb), and a
    budget needs --adaptive or --bandwidth-trace (what writes an adaptive setting). Returns the budget in bytes.

    Raises:
        PlanError: --adaptive with a schedule that has no k (schedules.registry.no_k_to_adapt), a budget for no
            adaptive setting.
        AdaptError: a budget that is not a byte size > 0.
    """
    budget = parse_budget("--memory-budget", memory_budget)
    refusal = no_k_to_adapt(schedule) if adaptive and schedule != "auto" else None
    if refusal is not None:
        raise PlanError(refusal)
    if budget is not None and not (adaptive or trace):
        raise PlanError(
            f"--memory-budget {memory_budget} bounds an adaptive setting's k; give --adaptive (or --bandwidth-trace) too"
        )
    return budget


def _check_samples(global_batch: int, microbatch_size: int | None) -> None:
    """--global-batch and --microbatch-size within core.limits.SAMPLES, named as flags (PlanRequest checks them too)."""
    for flag, value in (("--global-batch", global_batch), ("--microbatch-size", microbatch_size)):
        if value is not None:
            SAMPLES.check(PlanError, flag, value)


def plan(
    profile: str = PROFILE,
    cluster: str = CLUSTER,
    global_batch: int = GLOBAL_BATCH,
    microbatch_size: int | None = typer.Option(None, "--microbatch-size", help="Samples per microbatch [planner's choice]."),
    planner: str = typer.Option("pipeplan", "--planner", help="Planner: pipeplan, dapple, pipedream, balanced, exact."),
    schedule: str = SCHEDULE,
    batch_scaling: str = BATCH_SCALING,
    optimizer: str = OPTIMIZER,
    optimizer_factor: float | None = OPTIMIZER_FACTOR_OPTION,
    profile_batch_size: int | None = PROFILE_BATCH_SIZE,
    replication: str = REPLICATION,
    as_json: bool = typer.Option(False, "--json", help="Print the plan and its timings as JSON."),
    out: str | None = typer.Option(None, "--out", help="Write the plan file (no timings: same inputs, same bytes)."),
    bandwidth_trace: str | None = typer.Option(
        None, "--bandwidth-trace", help="Choose among the finalists by expected time under this trace, the controller running."
    ),
    trace_iterations: int | None = typer.Option(
        None, "--trace-iterations", help="With --bandwidth-trace: iterations per run [enough to cover the trace, 10..200]."
    ),
    bound: bool = BOUND,
    adaptive: bool = typer.Option(
        False, "--adaptive", help="Plan kfkb and write its adaptive setting: the start k, the k within the budget, the budget."
    ),
    memory_budget: str | None = typer.Option(None, "--memory-budget", help=MEMORY_BUDGET_HELP),
) -> None:
    """Find the fastest plan that fits in memory: stages, devices, replicas, microbatches and schedule."""
    from pipeplan.cli.outputs import check_files
    from pipeplan.io.plan_json import write_plan
    from pipeplan.planner.registry import run_planner
    from pipeplan.planner.request import PlanRequest
    from pipeplan.presets.resolve import load_cluster, load_profile
    from pipeplan.viz.plan_tables import plan_summary, stage_table
    from pipeplan.viz.tables import METRICS_NOTE, print_tables

    check_files()
    _check_factor(optimizer_factor)
    _check_samples(global_batch, microbatch_size)
    if trace_iterations is not None and (bandwidth_trace is None or trace_iterations < 1):
        raise PlanError(f"--trace-iterations needs --bandwidth-trace and an integer >= 1, got {trace_iterations}")
    budget = _check_adaptive(adaptive, schedule, memory_budget, bandwidth_trace is not None)
    trace = None
    if bandwidth_trace is not None:
        from pipeplan.io.bandwidth_trace_json import read_bandwidth_trace

        trace = read_bandwidth_trace(bandwidth_trace)
        if trace_iterations is not None:  # the smallest finalists priced before planning; the real ones after it
            from pipeplan.planner.search.trace_aware import check_rescoring

            check_rescoring(None, trace, trace_iterations, "--trace-iterations")
    model = load_profile(profile, profile_batch_size)
    machines = load_cluster(cluster)
    if trace is not None:
        trace.check_devices(machines.num_devices, f"cluster {cluster}")
    request = PlanRequest(model, machines, global_batch, microbatch_size, "kfkb" if adaptive else schedule, optimizer=optimizer,
                          batch_scaling=batch_scaling, optimizer_factor=optimizer_factor,
                          replication=_check_replication(replication))  # fmt: skip
    with progress_display(not as_json) as progress:
        result = run_planner(planner, request, progress)
    scores = None
    if trace is not None:
        from pipeplan.planner.search.trace_aware import choose_under_trace, trace_json

        idle = result
        result, scores = choose_under_trace(result, request, trace, trace_iterations, budget)
    if adaptive or (trace is not None and schedule in ("auto", "kfkb")):
        from pipeplan.planner.adaptive_plan import adaptive_plan, as_kfkb

        if adaptive or as_kfkb(result.plan) is not None:  # a budget below the plan's 1F1B peak: refused, nothing written
            result = adaptive_plan(result, request, budget)
    measured = None
    if bound:
        from pipeplan.planner.bound.plan_bound import Bounds

        measured = Bounds(request).of(result.plan, result.iteration_time)
    if as_json:
        obj = result.to_json(profile, cluster, model)
        if scores is not None:
            obj["bandwidth_trace"] = trace_json(scores, idle)
        if measured is not None:
            obj["lower_bound"] = measured.to_json()
        print_json(obj)
    else:
        print_tables(plan_summary(result, model, request.cluster, request.model), stage_table(result))
        typer.echo(METRICS_NOTE)
        if result.plan.adaptive is not None:
            from pipeplan.viz.plan_tables import adaptive_line

            typer.echo(adaptive_line(result.plan))
        if scores is not None:
            from pipeplan.viz.plan_tables import trace_table, trace_verdict

            print_tables(trace_table(scores))
            typer.echo(trace_verdict(scores, idle))
        if measured is not None:
            from pipeplan.viz.plan_tables import bound_line

            typer.echo(bound_line(measured))
    if out is not None:
        write_plan(result.plan, out, profile, cluster, profile=model)
        typer.echo(f"wrote plan {out}", err=as_json)


def compare(
    profile: str = PROFILE,
    cluster: str = CLUSTER,
    global_batch: int = GLOBAL_BATCH,
    microbatch_size: int | None = typer.Option(None, "--microbatch-size", help="Samples per microbatch [each planner's choice]."),
    planners: str | None = typer.Option(None, "--planners", help="Comma-separated planners to run [all registered]."),
    schedule: str = SCHEDULE,
    batch_scaling: str = BATCH_SCALING,
    optimizer: str = OPTIMIZER,
    optimizer_factor: float | None = OPTIMIZER_FACTOR_OPTION,
    profile_batch_size: int | None = PROFILE_BATCH_SIZE,
    replication: str = REPLICATION,
    as_json: bool = typer.Option(False, "--json", help='Print {"results": [one plan --json object per planner]}.'),
    png: str | None = typer.Option(None, "--png", help="Write the fastest plan's simulated timeline as a PNG."),
    bound: bool = BOUND,
) -> None:
    """Run every planner on one problem and print their plans side by side, all scored by the same simulator."""
    from pipeplan.cli.outputs import check_files
    from pipeplan.planner.compare import run_comparison

    check_files()
    _check_factor(optimizer_factor)
    _check_samples(global_batch, microbatch_size)
    _check_replication(replication)
    names = _planner_list(planners)
    with progress_display(not as_json) as progress:
        run = run_comparison(profile, cluster, global_batch, names, progress, microbatch_size=microbatch_size,
                             schedule=schedule, batch_scaling=batch_scaling, optimizer=optimizer,
                             optimizer_factor=optimizer_factor, profile_batch_size=profile_batch_size,
                             replication=replication)  # fmt: skip
    measured = None
    if bound:
        from pipeplan.planner.bound.plan_bound import Bounds
        from pipeplan.planner.request import PlanResult

        bounds = Bounds(run.request)
        measured = {r.planner: bounds.of(r.plan, r.iteration_time) for r in run.rows if isinstance(r, PlanResult)}
    if as_json:
        obj = run.to_json()
        if measured is not None:
            for entry in obj["results"]:
                if entry["planner"] in measured:
                    entry["lower_bound"] = measured[entry["planner"]].to_json()
        print_json(obj)
    else:
        print_comparison(run, measured)
    if png is not None:
        draw_best(run, png)
        typer.echo(f"wrote {png}", err=as_json)


def _planner_list(planners: str | None) -> list[str] | None:
    """--planners as names (None: all registered), checked against the registry.

    Raises:
        PlanError: naming --planners and the bad value.
    """
    from pipeplan.planner.compare import planner_names

    try:
        return planner_names([n.strip() for n in planners.split(",") if n.strip()] if planners is not None else None)
    except PlanError as exc:
        raise PlanError(f"--planners {planners!r}: {exc}") from None


def print_comparison(run: Comparison, measured: dict[str, PlanBound] | None = None) -> None:
    """The side-by-side table (with each plan over its class's bound when measured), its notes, each failure's reason."""
    from pipeplan.viz.plan_tables import BOUND_NOTE, SPEEDUP_NOTE, failure_lines, planners_table
    from pipeplan.viz.tables import print_tables

    title = f"{run.name} on {run.cluster}, global batch {run.request.global_batch}"
    print_tables(planners_table(title, run.rows, measured))
    typer.echo(SPEEDUP_NOTE)
    if measured:
        typer.echo(BOUND_NOTE.format(bounds=", ".join(sorted({f"{b.of} {b.bound.ms:.2f} ms" for b in measured.values()}))))
    for line in failure_lines(run.rows):
        typer.echo(line)


def draw_best(run: Comparison, png: str) -> None:
    """The fastest plan's simulated timeline (recorded by its planner) as a PNG.

    Raises:
        PlanError: no planner found a plan.
    """
    from pipeplan.planner.compare import best_row
    from pipeplan.viz.gantt import render_gantt

    best = best_row(run.rows)
    if best is None:
        raise PlanError(f"no planner found a plan for {run.name} on {run.cluster}; nothing to draw in {png}")
    render_gantt(best.sim, png, title=f"{best.planner}: {run.name} on {run.cluster}")


def register(app: typer.Typer) -> None:
    """Add `plan` to app."""
    app.command("plan")(plan)
    app.command("compare")(compare)
