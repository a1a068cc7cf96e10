"""The `pipeplan plan` command: find the fastest plan that fits, print it, optionally write the plan file."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import typer

from pipeplan.cli.common import OPTIMIZER_HELP, PBS_HELP, REPLICATION_HELP, SCALING_HELP, print_json
from pipeplan.core.errors import PlanError
from pipeplan.core.limits import OPTIMIZER_FACTOR, SAMPLES
from pipeplan.schedules.registry import PLANNABLE, names_text
from pipeplan.sim.cost.layers import check_optimizer, check_scaling

SCHEDULE_HELP = f"auto, {names_text(PLANNABLE)}."
"""--schedule of plan and compare: the schedules a plan may run (schedules.registry.TABLE)."""

if TYPE_CHECKING:
    from rich.table import Table

    from pipeplan.core.cluster import Cluster
    from pipeplan.core.profile import ModelProfile
    from pipeplan.planner.request import PlanResult
    from pipeplan.sim.cost.model import CostModel


def device_ranges(devices: Sequence[int]) -> str:
    """Device ids as compact ranges in their order: (0, 1, 2, 3, 8) -> '0-3,8'."""
    parts: list[str] = []
    start = prev = None
    for d in devices:
        if start is not None and prev is not None and d == prev + 1:
            prev = d
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = d
    if start is not None:
        parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(parts)


@contextmanager
def progress_display(enabled: bool) -> Iterator[Callable[[str, float], None] | None]:
    """A rich spinner on stderr showing the planner's current phase; yields the callback (None when disabled)."""
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    if not console.is_terminal:
        yield None
        return
    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console, transient=True
    ) as bar:
        task = bar.add_task("planning", total=1.0)

        def update(message: str, fraction: float) -> None:
            bar.update(task, description=message, completed=max(0.0, min(1.0, fraction)))

        yield update


def plan_json(result: PlanResult, profile_name: str, cluster_name: str) -> dict[str, Any]:
    """The `plan --json` object: the plan file's fields plus planner, iteration_time, memory_per_device, planning_seconds."""
    from pipeplan.io.plan_json import plan_to_json

    obj = plan_to_json(result.plan, profile_name, cluster_name)
    obj.update(
        planner=result.planner,
        iteration_time=result.iteration_time,
        memory_per_device=list(result.memory_per_device),
        planning_seconds=result.planning_seconds,
    )
    return obj


def stage_table(result: PlanResult, model: CostModel) -> Table:
    """One row per (chunk-)stage: layers, devices (pipeline replica 0), replicas, F/B, all-reduce and optimizer ms, memory."""
    from rich.table import Table

    from pipeplan.sim.cost.plan_costs import plan_costs
    from pipeplan.viz.tables import format_bytes, format_ms

    plan = result.plan
    costs = plan_costs(plan, model)
    table = Table(title="stages (devices of pipeline replica 0; replicas = per stage x pipelines)", title_justify="left")
    for header in ("stage", "rank", "layers", "devices", "replicas", "F ms", "B ms", "AR ms", "opt ms", "memory"):
        table.add_column(header, justify="right")
    for s, stage in enumerate(plan.stages):
        rank = s % plan.num_ranks
        cost = costs.stages[s]
        memory = max(result.memory_per_device[d] for d in plan.stages[rank].devices)
        layers = f"{stage.first_layer}-{stage.last_layer}" if stage.last_layer > stage.first_layer else str(stage.first_layer)
        table.add_row(
            str(s),
            str(rank),
            layers,
            device_ranges(plan.replica_devices(s, 0)),
            f"{plan.replicas_of(s)}x{plan.pipeline_replicas}",
            format_ms(cost.fwd_ms),
            format_ms(cost.bwd_ms),
            format_ms(cost.allreduce_ms),
            format_ms(cost.optimizer_ms),
            format_bytes(memory),
        )
    return table


def summary(result: PlanResult, profile: ModelProfile, cluster: Cluster, model: CostModel) -> Table:
    """Planner, schedule, batching, memory, iteration time, efficiency and planning time."""
    from rich.table import Table

    from pipeplan.viz.tables import format_bytes, format_ms

    plan, sim = result.plan, result.sim
    capacity = min(cluster.devices[d].memory_bytes for d in plan.all_devices)
    schedule = plan.schedule + (f" (k={plan.k})" if plan.schedule == "kfkb" else "")
    schedule += f" (v={plan.chunks})" if plan.chunks > 1 else ""
    table = Table(title=f"plan for {profile.name} on {cluster.name}", show_header=False, title_justify="left")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    rows = [
        ("planner", result.planner),
        ("schedule", schedule),
        ("pipeline replicas", str(plan.pipeline_replicas)),
        ("microbatches x size", f"{plan.microbatches} x {plan.microbatch_size} (global batch {plan.global_batch})"),
        ("devices used", f"{len(plan.all_devices)} of {cluster.num_devices}"),
        ("peak memory / smallest device", f"{format_bytes(max(result.memory_per_device))} / {format_bytes(capacity)}"),
        ("costs", f"batch scaling {model.layers.mode}, optimizer {model.optimizer}"),
        ("iteration time (ms)", format_ms(result.iteration_time)),
        ("lower bound (ms)", format_ms(sim.lower_bound)),
        ("efficiency", f"{sim.efficiency:.1%}"),
        ("bubble fraction", f"{sim.bubble_fraction:.1%}"),
        ("planning time (s)", f"{result.planning_seconds:.2f}"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table


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


def _check_samples(global_batch: int, microbatch_size: int | None) -> None:
    """--global-batch and --microbatch-size within core.limits.SAMPLES, named as flags (PlanRequest checks them too)."""
    for flag, value in (("--global-batch", global_batch), ("--microbatch-size", microbatch_size)):
        if value is not None:
            SAMPLES.check(PlanError, flag, value)


def plan(
    profile: str = typer.Option(..., "--profile", help="Model profile: a file path or a built-in name (e.g. dapple/bert-48)."),
    cluster: str = typer.Option(..., "--cluster", help="Cluster: a file path or a built-in name (e.g. v100-8x2-25g)."),
    global_batch: int = typer.Option(..., "--global-batch", help="Samples per iteration over all pipeline replicas."),
    microbatch_size: int | None = typer.Option(None, "--microbatch-size", help="Samples per microbatch [planner's choice]."),
    planner: str = typer.Option("pipeplan", "--planner", help="Planner: pipeplan, dapple, pipedream, balanced, exact."),
    schedule: str = typer.Option("auto", "--schedule", help=SCHEDULE_HELP),
    batch_scaling: str = typer.Option("auto", "--batch-scaling", help=SCALING_HELP),
    optimizer: str = typer.Option("adam", "--optimizer", help=OPTIMIZER_HELP),
    optimizer_factor: float | None = typer.Option(
        None, "--optimizer-factor", help="Optimizer state bytes per parameter byte [the optimizer's own: adam 2, sgd 0]."
    ),
    profile_batch_size: int | None = typer.Option(None, "--profile-batch-size", help=PBS_HELP),
    replication: str = typer.Option("any", "--replication", help=REPLICATION_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the plan and its timings as JSON."),
    out: str | None = typer.Option(None, "--out", help="Write the plan file (no timings: same inputs, same bytes)."),
    bandwidth_trace: str | None = typer.Option(
        None, "--bandwidth-trace", help="Choose among the finalists by expected time under this trace, the controller running."
    ),
    trace_iterations: int | None = typer.Option(
        None, "--trace-iterations", help="With --bandwidth-trace: iterations per run [enough to cover the trace, 10..200]."
    ),
) -> None:
    """Find the fastest plan that fits in memory: stages, devices, replicas, microbatches and schedule."""
    from pipeplan import api
    from pipeplan.cli.outputs import Output, check_outputs
    from pipeplan.viz.tables import METRICS_NOTE, print_tables

    check_outputs([Output("--out", out)], {"--profile": profile, "--cluster": cluster})
    _check_factor(optimizer_factor)
    _check_samples(global_batch, microbatch_size)
    if trace_iterations is not None and (bandwidth_trace is None or trace_iterations < 1):
        raise PlanError(f"--trace-iterations needs --bandwidth-trace and an integer >= 1, got {trace_iterations}")
    trace = None
    if bandwidth_trace is not None:
        from pipeplan.sim.trace import read_bandwidth_trace

        trace = read_bandwidth_trace(bandwidth_trace)
    model = _load_profile(profile, profile_batch_size)
    machines = api.load_cluster(cluster)
    check_scaling(batch_scaling)  # named as flags, before the API names them as arguments
    check_optimizer(optimizer)
    if trace is not None:
        trace.check_devices(machines.num_devices, f"cluster {cluster}")
    request = api.plan_request(model, machines, global_batch, microbatch_size=microbatch_size, schedule=schedule,
                               optimizer=optimizer, batch_scaling=batch_scaling, optimizer_factor=optimizer_factor,
                               replication=_check_replication(replication))  # fmt: skip
    with progress_display(not as_json) as progress:
        result = api.run_planner(planner, request, progress)
    scores = None
    if trace is not None:
        from pipeplan.cli.plan_trace import choose_under_trace, print_trace_report, trace_json

        idle = result
        result, scores = choose_under_trace(result, request, trace, trace_iterations)
    if as_json:
        obj = plan_json(result, profile, cluster)
        if scores is not None:
            obj["bandwidth_trace"] = trace_json(scores, idle)
        print_json(obj)
    else:
        print_tables(summary(result, model, request.cluster, request.model), stage_table(result, request.model))
        typer.echo(METRICS_NOTE)
        if scores is not None:
            print_trace_report(scores, idle)
    if out is not None:
        api.save_plan(result.plan, out, profile, cluster)
        typer.echo(f"wrote plan {out}", err=as_json)


def compare(
    profile: str = typer.Option(..., "--profile", help="Model profile: a file path or a built-in name (e.g. dapple/bert-48)."),
    cluster: str = typer.Option(..., "--cluster", help="Cluster: a file path or a built-in name (e.g. v100-8x2-25g)."),
    global_batch: int = typer.Option(..., "--global-batch", help="Samples per iteration over all pipeline replicas."),
    microbatch_size: int | None = typer.Option(None, "--microbatch-size", help="Samples per microbatch [each planner's choice]."),
    planners: str | None = typer.Option(None, "--planners", help="Comma-separated planners to run [all registered]."),
    schedule: str = typer.Option("auto", "--schedule", help=SCHEDULE_HELP),
    batch_scaling: str = typer.Option("auto", "--batch-scaling", help=SCALING_HELP),
    optimizer: str = typer.Option("adam", "--optimizer", help=OPTIMIZER_HELP),
    optimizer_factor: float | None = typer.Option(
        None, "--optimizer-factor", help="Optimizer state bytes per parameter byte [the optimizer's own: adam 2, sgd 0]."
    ),
    profile_batch_size: int | None = typer.Option(None, "--profile-batch-size", help=PBS_HELP),
    replication: str = typer.Option("any", "--replication", help=REPLICATION_HELP),
    as_json: bool = typer.Option(False, "--json", help='Print {"results": [one plan --json object per planner]}.'),
    png: str | None = typer.Option(None, "--png", help="Write the fastest plan's simulated timeline as a PNG."),
) -> None:
    """Run every planner on one problem and print their plans side by side, all scored by the same simulator."""
    from pipeplan.cli.outputs import IMAGE_SUFFIXES, Output, check_outputs

    check_outputs([Output("--png", png, IMAGE_SUFFIXES)], {"--profile": profile, "--cluster": cluster})
    run = run_comparison(profile, cluster, global_batch, microbatch_size, planners, schedule, batch_scaling, optimizer,
                         optimizer_factor, profile_batch_size, show_progress=not as_json, replication=replication)  # fmt: skip
    if as_json:
        print_json(run.to_json())
    else:
        run.print_table()
    if png is not None:
        run.draw_best(png)
        typer.echo(f"wrote {png}", err=as_json)


@dataclass
class Comparison:
    """Every planner's result on one problem (`compare`, and `demo`'s second step)."""

    profile: str
    cluster: str
    name: str
    request: Any
    rows: list[Any]

    def to_json(self) -> dict[str, Any]:
        """`compare --json`: one `plan --json` object per planner, or its error."""
        from pipeplan.planner.request import PlanResult

        return {
            "results": [
                plan_json(r, self.profile, self.cluster)
                if isinstance(r, PlanResult)
                else {"planner": r.planner, "error": r.error, "planning_seconds": r.planning_seconds}
                for r in self.rows
            ]
        }

    def print_table(self) -> None:
        """The side-by-side table, then each failure's reason."""
        from rich.table import Table

        from pipeplan.planner.compare import best_baseline, speedup
        from pipeplan.planner.request import PlanResult
        from pipeplan.viz.tables import format_bytes, format_ms, print_tables

        baseline = best_baseline(self.rows)
        table = Table(title=f"{self.name} on {self.cluster}, global batch {self.request.global_batch}", title_justify="left")
        for header in ("planner", "iteration ms", "speed-up", "peak memory", "planning s", "plan"):
            table.add_column(header, justify="left" if header in ("planner", "plan") else "right")
        failures = []
        for r in self.rows:
            if not isinstance(r, PlanResult):
                table.add_row(r.planner, "-", "-", "-", f"{r.planning_seconds:.2f}", "no plan (below)")
                failures.append(f"{r.planner}: {r.error}")
                continue
            p = r.plan
            ratio = speedup(r, baseline)
            shape = f"{p.schedule}{f' k={p.k}' if p.schedule == 'kfkb' else ''}{f' v={p.chunks}' if p.chunks > 1 else ''}"
            shape += f" {p.num_ranks}x{p.pipeline_replicas} m={p.microbatches}x{p.microbatch_size}"
            table.add_row(
                r.planner,
                format_ms(r.iteration_time),
                "-" if ratio is None else f"{ratio:.2f}x",
                format_bytes(max(r.memory_per_device)),
                f"{r.planning_seconds:.2f}",
                shape,
            )
        print_tables(table)
        typer.echo("speed-up: best baseline (dapple, pipedream, balanced) time / this time; plan: ranks x pipelines")
        for line in failures:
            typer.echo(line)

    def draw_best(self, png: str) -> None:
        """The fastest plan's simulated timeline as a PNG.

        Raises:
            PlanError: no planner found a plan.
        """
        from pipeplan.planner.compare import best_row
        from pipeplan.sim.plan_sim import simulate_plan
        from pipeplan.viz.gantt import render_gantt

        best = best_row(self.rows)
        if best is None:
            raise PlanError(f"no planner found a plan for {self.name} on {self.cluster}; nothing to draw in {png}")
        timeline = simulate_plan(best.plan, self.request.model, record=True)
        render_gantt(timeline, png, title=f"{best.planner}: {self.name} on {self.cluster}")


def run_comparison(
    profile: str,
    cluster: str,
    global_batch: int,
    microbatch_size: int | None,
    planners: str | None,
    schedule: str,
    batch_scaling: str,
    optimizer: str,
    optimizer_factor: float | None,
    profile_batch_size: int | None,
    show_progress: bool,
    replication: str = "any",
) -> Comparison:
    """Load the problem and run the planners through pipeplan.api.compare (checked flags; a bad one is a PlanError
    naming it)."""
    from pipeplan import api
    from pipeplan.planner.compare import planner_names

    _check_factor(optimizer_factor)
    _check_samples(global_batch, microbatch_size)
    _check_replication(replication)
    try:
        names = planner_names([n.strip() for n in planners.split(",") if n.strip()] if planners is not None else None)
    except PlanError as exc:
        raise PlanError(f"--planners {planners!r}: {exc}") from None
    model = _load_profile(profile, profile_batch_size)
    api.load_cluster(cluster)  # a bad --cluster is reported before a bad --batch-scaling, as before
    check_scaling(batch_scaling)  # named as flags, before the API names them as arguments
    check_optimizer(optimizer)
    with progress_display(show_progress) as progress:
        run = api.compare(model, cluster, global_batch, planners=names, progress=progress, microbatch_size=microbatch_size,
                          schedule=schedule, optimizer=optimizer, batch_scaling=batch_scaling,
                          optimizer_factor=optimizer_factor, replication=replication)  # fmt: skip
    return Comparison(profile, cluster, model.name, run.request, run.rows)


def _load_profile(profile: str, profile_batch_size: int | None) -> ModelProfile:
    """--profile read with --profile-batch-size (a graph.txt file's batch); pipeplan.api.load_profile takes values too."""
    from pipeplan.presets.resolve import load_profile

    return load_profile(profile, profile_batch_size)


def register(app: typer.Typer) -> None:
    """Add `plan` to app."""
    app.command("plan")(plan)
    app.command("compare")(compare)
