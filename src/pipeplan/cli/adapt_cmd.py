"""The `pipeplan adapt` command: the Ada-Grouper controller against fixed schedules and the oracle under a trace."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from pipeplan.cli.flags import MEMORY_BUDGET_HELP, OPTIMIZER_HELP, PBS_HELP, SCALING_HELP, parse_budget, plan_profile_and_cluster
from pipeplan.core.errors import AdaptError
from pipeplan.viz.json_print import print_json

if TYPE_CHECKING:
    from pipeplan.adapt.decision import ControllerConfig
    from pipeplan.adapt.fixed_baselines import AdaptComparison
    from pipeplan.adapt.pipeline import PipelineModel
    from pipeplan.core.plan import Plan
    from pipeplan.sim.trace import BandwidthTrace


FIXED_SHOWN = 6
"""Fixed-k rows the table prints when more k fit (the fastest ones)."""


def check_trace_links(trace: BandwidthTrace, pipeline: PipelineModel, devices: int, cluster: str) -> None:
    """A trace must name devices of the cluster, and some step must touch a link the plan's traffic uses (its
    transfers and its all-reduce rings, PipelineModel.traffic_links; a trace written for the whole cluster may name
    more; one that touches none of the plan's would change nothing).

    Raises:
        CostError: a device beyond the cluster.
        AdaptError: no step names "all" or a link of the plan, naming the plan's links.
    """
    trace.check_devices(devices, f"cluster {cluster}")
    used = set(pipeline.traffic_links)
    if trace.steps and not any(step.link is None or step.link in used for step in trace.steps):
        known = ", ".join(f"{a}-{b}" for a, b in pipeline.traffic_links) or "none: one stage"
        rings = " or its all-reduce rings" if len(used) > len(pipeline.flows) else ""
        raise AdaptError(
            f"bandwidth trace: no step names a link the plan's transfers{rings} use, so it would change nothing "
            f"(the plan's links: {known})"
        )


def controller_config(
    plan: Plan, path: str, pipeline: PipelineModel, given: float | None, base: ControllerConfig
) -> ControllerConfig:
    """`base` with the plan's adaptive setting: its memory budget, k_choices and start k (plan.k) when it has one;
    --memory-budget (`given`) overrides the budget, and then the k that fit it are the candidates and the best at
    nominal bandwidth starts. Without either, the default budget (adapt.budget.resolve_budget).

    Raises:
        AdaptError: a budget below 1F1B's peak, naming --memory-budget or the plan's field, the peak, stage and excess.
    """
    import dataclasses

    from pipeplan.adapt.budget import resolve_budget

    setting = plan.adaptive
    if given is not None or setting is None:
        budget = resolve_budget(pipeline, given, "--memory-budget")
        return dataclasses.replace(base, memory_budget_bytes=budget)
    budget = resolve_budget(pipeline, setting.memory_budget_bytes, f"plan {path} adaptive.memory_budget_bytes")
    return dataclasses.replace(base, memory_budget_bytes=budget, k_choices=setting.k_choices, initial_k=plan.k)


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
    from pipeplan.adapt.controller import ControllerConfig
    from pipeplan.adapt.fixed_baselines import compare_policies
    from pipeplan.adapt.pipeline import PipelineModel
    from pipeplan.cli.outputs import check_files
    from pipeplan.presets.resolve import load_cluster, load_plan, load_profile
    from pipeplan.sim.cost.memory import check_fits
    from pipeplan.sim.cost.model import CostModel
    from pipeplan.sim.trace import read_bandwidth_trace

    check_files()
    if iterations < 1:
        raise AdaptError(f"--iterations must be an integer >= 1, got {iterations}")
    given = parse_budget("--memory-budget", memory_budget)
    base = ControllerConfig(gain_threshold=gain_threshold, switch_ms=switch_ms)
    trace = read_bandwidth_trace(bandwidth_trace)
    the_plan, names = load_plan(plan, profile, profile_batch_size)
    profile, cluster = plan_profile_and_cluster(f"adapt --plan {plan}", profile, cluster, names)
    model = CostModel.build(load_profile(profile, profile_batch_size), load_cluster(cluster), batch_scaling, optimizer)
    pipeline = PipelineModel.from_plan(the_plan, model, trace)
    check_trace_links(trace, pipeline, model.cluster.num_devices, cluster)
    check_fits(the_plan, model)
    config = controller_config(the_plan, plan, pipeline, given, base)
    comparison = compare_policies(pipeline, trace, iterations, config, flag="--iterations")
    if as_json:
        print_json(comparison.to_json())
    else:
        print_report(comparison, plan, iterations)
    if png is not None:
        from pipeplan.viz.adapt_plot import render_adapt

        render_adapt(comparison, pipeline, trace, png, title=f"{plan} under {bandwidth_trace}")
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
