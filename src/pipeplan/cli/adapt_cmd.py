"""The `pipeplan adapt` command: the Ada-Grouper controller against fixed schedules and the oracle under a trace."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from pipeplan.cli.flags import MEMORY_BUDGET_HELP, OPTIMIZER_HELP, PBS_HELP, SCALING_HELP, parse_budget
from pipeplan.viz.json_print import print_json

if TYPE_CHECKING:
    from pipeplan.api.simulation import AdaptComparison


FIXED_SHOWN = 6
"""Fixed-k rows the table prints when more k fit (the fastest ones)."""


def adapt(
    plan: str = typer.Option(..., "--plan", help="Plan file whose stages the controller regroups."),
    bandwidth_trace: str = typer.Option(..., "--bandwidth-trace", help="Bandwidth trace JSON (pipeplan trace writes one)."),
    iterations: int = typer.Option(..., "--iterations", help="Iterations to run, back to back on the trace's clock."),
    profile: str | None = typer.Option(None, "--profile", help="Model profile (path or built-in) [the plan's]."),
    cluster: str | None = typer.Option(None, "--cluster", help="Cluster (path or built-in) [the plan's]."),
    switch_ms: float = typer.Option(0.0, "--switch-ms", help="What changing k costs at an iteration boundary (ms)."),
    gain_threshold: float = typer.Option(0.02, "--gain-threshold", help="Switch only for a predicted gain above this fraction."),
    batch_scaling: str = typer.Option("auto", "--batch-scaling", help=SCALING_HELP),
    optimizer: str = typer.Option("adam", "--optimizer", help=OPTIMIZER_HELP),
    profile_batch_size: int | None = typer.Option(None, "--profile-batch-size", help=PBS_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print every policy's run and every decision as JSON."),
    png: str | None = typer.Option(None, "--png", help="Plot bandwidth, k and iteration time against time (controller, 1F1B)."),
    memory_budget: str | None = typer.Option(None, "--memory-budget", help=MEMORY_BUDGET_HELP),
) -> None:
    """Run the adaptive controller, fixed 1F1B, GPipe, every fixed k and the oracle under one bandwidth trace."""
    from pipeplan.cli.declared_files import check_files

    check_files()
    given = parse_budget("--memory-budget", memory_budget)
    from pipeplan.api.simulation import adapt_policies

    ran = adapt_policies(plan, bandwidth_trace, iterations, profile=profile, cluster=cluster, switch_ms=switch_ms,
                         gain_threshold=gain_threshold, batch_scaling=batch_scaling, optimizer=optimizer,
                         profile_batch_size=profile_batch_size, memory_budget=given)  # fmt: skip
    comparison = ran.comparison
    if as_json:
        print_json(comparison.to_json())
    else:
        print_report(comparison, plan, iterations)
    if png is not None:
        from pipeplan.viz.adapt_plot import render_adapt

        render_adapt(comparison, ran.pipeline, ran.trace, png, title=f"{plan} under {bandwidth_trace}")
        typer.echo(f"wrote {png}", err=as_json)


def print_report(comparison: AdaptComparison, plan: str, iterations: int) -> None:
    """The policies side by side, the switches the controller made, and what its decisions cost."""
    from rich.table import Table

    from pipeplan.viz.tables import format_bytes, print_tables

    base = comparison.policies["1f1b"].total_ms
    table = Table(title=f"{plan}: {iterations} iterations under the trace", title_justify="left")
    table.add_column("policy", no_wrap=True, min_width=11)
    for header in ("total s", "mean iteration ms", "vs 1F1B", "k used", "switches", "peak memory"):
        table.add_column(header, justify="left" if header == "k used" else "right")
    fixed = sorted(comparison.fixed.items(), key=lambda item: (item[1].total_ms, item[0]))
    shown = sorted(k for k, _ in fixed[:FIXED_SHOWN]) if len(fixed) > FIXED_SHOWN + 1 else sorted(comparison.fixed)
    rows = list(comparison.policies.items()) + [(f"fixed k={k}", comparison.fixed[k]) for k in shown]
    for name, run in rows:
        used = sorted(set(run.k))
        k_text = ",".join(map(str, used)) if len(used) <= 6 else f"{used[0]}..{used[-1]} ({len(used)} values)"
        table.add_row(
            name,
            f"{run.total_ms / 1000:.3f}",
            f"{sum(run.iteration_ms) / len(run.iteration_ms):.1f}",
            f"{base / run.total_ms:.3f}x",
            k_text,
            str(run.switches),
            format_bytes(max(run.peak_bytes)),
        )
    print_tables(table)
    if len(shown) < len(fixed):
        typer.echo(f"fixed k: the {len(shown)} fastest of {len(fixed)} shown (--json lists every one)")
    typer.echo(
        f"k_max {comparison.k_max} (memory limit {format_bytes(comparison.memory_limit_bytes)} per device); best fixed k "
        f"in hindsight: k={comparison.policies['best_static'].k[0]}"
    )
    used = sorted({k for name in ("adaptive", "best_static", "oracle") for k in comparison.policies[name].k})
    peaks = comparison.peak_bytes_per_k
    budget = comparison.memory_budget_bytes
    within = "no memory budget" if budget is None else f"memory budget {format_bytes(budget)} per device"
    typer.echo(f"{within}; peak of each k used: " + ", ".join(f"k={k} {format_bytes(peaks[k])}" for k in used if k in peaks))
    for name, reason in comparison.not_run.items():
        typer.echo(f"{name} not run: {reason}")
    switches = [d for d in comparison.decisions if d.switched]
    slowest = max(comparison.decision_ms, default=0.0)
    noun = "switch" if len(switches) == 1 else "switches"
    typer.echo(
        f"controller: {len(switches)} {noun}; decision time mean {_mean(comparison.decision_ms):.2f} ms, "
        f"max {slowest:.2f} ms ({comparison.decision_share:.2%} of a mean iteration)"
    )
    for d in switches[:10]:
        typer.echo(f"  iteration {d.iteration}: {d.reason}")
    if len(switches) > 10:
        typer.echo(f"  ... {len(switches) - 10} more (--json lists every decision)")


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def register(app: typer.Typer) -> None:
    """Add `adapt` to app."""
    app.command("adapt")(adapt)
