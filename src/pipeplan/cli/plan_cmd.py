"""The `pipeplan plan` and `pipeplan compare` commands: check the flags, run the planner(s), print through viz."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from pipeplan.api.scheduling import PLANNABLE_TEXT
from pipeplan.cli.flags import MEMORY_BUDGET_HELP, OPTIMIZER_HELP, PBS_HELP, REPLICATION_HELP, SCALING_HELP, parse_budget
from pipeplan.core.errors import PlanError
from pipeplan.viz.json_print import print_json
from pipeplan.viz.progress import progress_display

if TYPE_CHECKING:
    from pipeplan.api.planning import Comparison, PlanBound, PlanResult

BOUND_HELP = "Also compute the proven lower bound of the plan's class and the time over it (seconds; minutes on 1,000+ GPUs)."
"""--bound of plan and compare (planner.bound.plan_bound)."""
SCHEDULE_HELP = f"auto, {PLANNABLE_TEXT}."
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
TIME_BUDGET_HELP = (
    "Seconds of planning per planner run: pipeplan's search returns the best plan found in them and says how far it "
    "got; 0 or none: no limit [50]."
)
"""--time-budget of plan and compare (planner.time_budget; compare: each planner run has its own)."""
TIME_BUDGET = typer.Option(None, "--time-budget", help=TIME_BUDGET_HELP)
TENSOR_PARALLEL = typer.Option(
    None,
    "--tensor-parallel",
    help="Force every stage's tensor-parallel degree t (it must divide the heads and hidden size) [the planner's "
    "choice; pipeplan and megatron only].",
)
ZERO = typer.Option(
    None, "--zero", help="Force the ZeRO stage: 0 none, 1 optimizer state, 2 and gradients [the planner's choice]."
)
SEQUENCE_PARALLEL = typer.Option(
    "auto",
    "--sequence-parallel",
    help="Sequence parallelism on stages with tp > 1: auto (the faster by the cost model, off on ties), on, off "
    "[auto; pipeplan and exact].",
)
OPTIMIZER_FACTOR_OPTION = typer.Option(
    None, "--optimizer-factor", help="Optimizer state bytes per parameter byte [the optimizer's own: adam 2, sgd 0]."
)


FLAGS = {
    "global_batch": "--global-batch", "microbatch_size": "--microbatch-size", "batch_scaling": "--batch-scaling",
    "optimizer": "--optimizer", "optimizer_factor": "--optimizer-factor", "replication": "--replication",
    "profile_batch_size": "--profile-batch-size", "trace_iterations": "--trace-iterations",
    "bandwidth_trace": "--bandwidth-trace", "adaptive": "--adaptive", "time_budget_s": "--time-budget",
    "tensor_parallel": "--tensor-parallel", "zero": "--zero", "sequence_parallel": "--sequence-parallel",
}  # fmt: skip
"""How plan's and compare's refusals name the API's arguments (api.arguments.check's labels); the schedule keeps
its argument's name, as PlanRequest has always said it."""


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
    time_budget: str | None = TIME_BUDGET,
    tensor_parallel: int | None = TENSOR_PARALLEL,
    zero: int | None = ZERO,
    sequence_parallel: str = SEQUENCE_PARALLEL,
) -> None:
    """Find the fastest plan that fits in memory: stages, devices, replicas, microbatches and schedule."""
    from pipeplan.cli.declared_files import check_files

    check_files()
    budget = parse_budget("--memory-budget", memory_budget)
    labels = FLAGS | {"memory_budget": f"--memory-budget {memory_budget}"}
    from pipeplan.api.planning import RequestOptions, plan_outcome

    options = RequestOptions(microbatch_size, schedule, batch_scaling, optimizer, optimizer_factor, replication,
                             profile_batch_size, labels, time_budget_seconds(time_budget), tensor_parallel, zero,
                             sequence_parallel)  # fmt: skip
    with progress_display(not as_json) as progress:
        outcome = plan_outcome(profile, cluster, global_batch, options, planner=planner, progress=progress,
                               bandwidth_trace=bandwidth_trace, trace_iterations=trace_iterations, adaptive=adaptive,
                               memory_budget=budget, bound=bound)  # fmt: skip
    result, request, scores, measured = outcome.result, outcome.request, outcome.trace_scores, outcome.bound
    model = request.profile
    if as_json:
        print_json(outcome.to_json(profile, cluster))
    else:
        # The tables (and rich's) load only when printed: --json never needs them (process start-up, issue 36).
        from pipeplan.viz.plan_tables import budget_line, plan_summary, stage_table
        from pipeplan.viz.tables import METRICS_NOTE, print_tables

        print_tables(plan_summary(result, model, request.cluster, request.model), stage_table(result))
        typer.echo(METRICS_NOTE)
        if result.plan.adaptive is not None:
            from pipeplan.viz.plan_tables import adaptive_line

            typer.echo(adaptive_line(result.plan))
        if scores is not None:
            from pipeplan.viz.plan_tables import trace_table, trace_verdict

            print_tables(trace_table(scores))
            assert outcome.idle is not None
            typer.echo(trace_verdict(scores, outcome.idle))
        if measured is not None:
            from pipeplan.viz.plan_tables import bound_line

            typer.echo(bound_line(measured))
        if (line := budget_line(result)) is not None:
            typer.echo(line)
        if "tensor" in result.extra:
            from pipeplan.viz.plan_tables import tensor_line

            typer.echo(tensor_line(result))
        for note in result.extra.get("notes", []):
            typer.echo(f"note: {note}")
    if out is not None:
        from pipeplan.io.plan_json import write_plan

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
    time_budget: str | None = TIME_BUDGET,
) -> None:
    """Run every planner on one problem and print their plans side by side, all scored by the same simulator."""
    from pipeplan.cli.declared_files import check_files

    check_files()
    names = [n.strip() for n in planners.split(",") if n.strip()] if planners is not None else None
    labels = FLAGS | {"planners": f"--planners {planners!r}"}
    from pipeplan.api.planning import RequestOptions, compare_outcome

    options = RequestOptions(microbatch_size, schedule, batch_scaling, optimizer, optimizer_factor, replication,
                             profile_batch_size, labels, time_budget_seconds(time_budget))  # fmt: skip
    with progress_display(not as_json) as progress:
        outcome = compare_outcome(profile, cluster, global_batch, options, planners=names, progress=progress, bound=bound)
    run, measured = outcome.comparison, outcome.bounds
    if as_json:
        print_json(outcome.to_json())
    else:
        print_comparison(run, measured)
    if png is not None:
        draw_best(run, outcome.best, png)
        typer.echo(f"wrote {png}", err=as_json)


def print_comparison(run: Comparison, measured: dict[str, PlanBound] | None = None) -> None:
    """The side-by-side table (with each plan over its class's bound when measured), its notes, each failure's reason."""
    from pipeplan.viz.plan_tables import BOUND_NOTE, SPEEDUP_NOTE, budget_line, failure_lines, planners_table
    from pipeplan.viz.tables import print_tables

    title = f"{run.name} on {run.cluster}, global batch {run.request.global_batch}"
    print_tables(planners_table(title, run.rows, measured))
    typer.echo(SPEEDUP_NOTE)
    if measured:
        typer.echo(BOUND_NOTE.format(bounds=", ".join(sorted({f"{b.of} {b.bound.ms:.2f} ms" for b in measured.values()}))))
    for line in failure_lines(run.rows):
        typer.echo(line)
    for row in run.rows:
        if (line := budget_line(row)) is not None:
            typer.echo(line)


def time_budget_seconds(text: str | None) -> float | str | None:
    """--time-budget as the API takes it: the default when not given, None for `none`, else the number (a text that
    is none is handed on as it is, for the API's one check to refuse by the flag's name)."""
    from pipeplan.api.planning import DEFAULT_TIME_BUDGET_S

    if text is None:
        return DEFAULT_TIME_BUDGET_S
    if text.strip().lower() == "none":
        return None
    try:
        return float(text)
    except ValueError:
        return text


def draw_best(run: Comparison, best: PlanResult | None, png: str) -> None:
    """The fastest plan's (`best`) simulated timeline (recorded by its planner) as a PNG.

    Raises:
        PlanError: no planner found a plan.
    """
    from pipeplan.viz.gantt import render_gantt

    if best is None:
        raise PlanError(f"no planner found a plan for {run.name} on {run.cluster}; nothing to draw in {png}")
    render_gantt(best.sim, png, title=f"{best.planner}: {run.name} on {run.cluster}")


def register(app: typer.Typer) -> None:
    """Add `plan` to app."""
    app.command("plan")(plan)
    app.command("compare")(compare)
