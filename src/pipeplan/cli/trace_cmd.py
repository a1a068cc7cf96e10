"""The `pipeplan trace` commands: write bandwidth traces over many iterations (periodic, markov, replay)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace

trace_app = typer.Typer(
    name="trace",
    help="Write a bandwidth trace (link factors over a run's time) for simulate, adapt, plan and train.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

LINKS_HELP = (
    'Links the trace slows: "all", "inter-node" (every pair of devices on different nodes of --cluster), or a '
    "comma-separated list of a-b (device a to b) and a=b (both directions)."
)
CLUSTER_HELP = 'Cluster (path or built-in name) whose nodes "--links inter-node" reads.'


def _say(trace: BandwidthTrace, out: str) -> None:
    """The one-line summary of a written trace: its steps, its length, the links it names and its lowest factor."""
    links = trace.links()
    named = "all links" if not links else ", ".join(f"{a}->{b}" for a, b in links[:4])
    if len(links) > 4:
        named = f"{len(links)} links ({named}, ...)"
    lowest = min((s.factor for s in trace.steps), default=1.0)
    typer.echo(f"wrote {out}: {len(trace.steps)} steps over {trace.end_ms / 1000:g} s on {named}, lowest factor {lowest:.3g}")


@trace_app.command("periodic")
def periodic(
    period_ms: float = typer.Option(..., "--period-ms", help="Length of one period (ms)."),
    duty: float = typer.Option(..., "--duty", help="Fraction of each period the links are slowed, in (0, 1]."),
    factor: float = typer.Option(..., "--factor", help="Slowed rate as a fraction of nominal, > 0 (0.25: 4x slower)."),
    links: str = typer.Option("all", "--links", help=LINKS_HELP),
    cluster: str | None = typer.Option(None, "--cluster", help=CLUSTER_HELP),
    duration_ms: float = typer.Option(..., "--duration-ms", help="Trace length (ms); nominal rate after it."),
    start_ms: float = typer.Option(0.0, "--start-ms", help="When the first period begins (ms)."),
    out: str = typer.Option(..., "--out", help="Trace JSON file to write."),
) -> None:
    """Preemption that repeats: each period begins with duty x period at the slowed factor."""
    from pipeplan.api.network_traces import periodic_trace  # not at the top: `pipeplan --help` imports no numpy
    from pipeplan.cli.declared_files import check_files

    check_files()
    _say(periodic_trace(period_ms, duty, factor, duration_ms, links=links, cluster=cluster, start_ms=start_ms, out=out), out)


@trace_app.command("markov")
def markov(
    seed: int = typer.Option(..., "--seed", help="Random seed (same seed, same trace)."),
    mean_slow_ms: float = typer.Option(..., "--mean-slow-ms", help="Mean length of a slowed burst (ms, exponential)."),
    mean_fast_ms: float = typer.Option(..., "--mean-fast-ms", help="Mean time at nominal rate between bursts (ms)."),
    factor_range: str = typer.Option(..., "--factor-range", help="LOW,HIGH: each burst's factor is uniform in it."),
    links: str = typer.Option("all", "--links", help=LINKS_HELP),
    cluster: str | None = typer.Option(None, "--cluster", help=CLUSTER_HELP),
    duration_ms: float = typer.Option(..., "--duration-ms", help="Trace length (ms); nominal rate after it."),
    out: str = typer.Option(..., "--out", help="Trace JSON file to write."),
) -> None:
    """Seeded on/off preemption bursts (a two-state Markov process) with a random factor per burst."""
    from pipeplan.api.network_traces import markov_trace  # not at the top: `pipeplan --help` imports no numpy
    from pipeplan.cli.declared_files import check_files

    check_files()
    trace = markov_trace(seed, mean_slow_ms, mean_fast_ms, factor_range, duration_ms, links=links, cluster=cluster, out=out)
    _say(trace, out)


@trace_app.command("replay")
def replay(
    series: str = typer.Argument(..., help="CSV of a measured series: time_s,value (# comments name its source)."),
    nominal: float = typer.Option(..., "--nominal", help="The value that means nominal rate (same unit as the series)."),
    time_scale: float = typer.Option(1.0, "--time-scale", help="Trace seconds per series second (0.1: ten times faster)."),
    links: str = typer.Option("all", "--links", help=LINKS_HELP),
    cluster: str | None = typer.Option(None, "--cluster", help=CLUSTER_HELP),
    min_factor: float = typer.Option(0.05, "--min-factor", help="Lowest factor (a measured 0 would never deliver)."),
    max_factor: float = typer.Option(1.0, "--max-factor", help="Highest factor (1: a link never beats its nominal rate)."),
    out: str = typer.Option(..., "--out", help="Trace JSON file to write."),
) -> None:
    """A measured throughput series replayed as factors value / nominal, clipped to [min, max]."""
    from pipeplan.api.network_traces import replay_trace  # not at the top: `pipeplan --help` imports no numpy
    from pipeplan.cli.declared_files import check_files

    check_files()
    trace = replay_trace(series, nominal, time_scale=time_scale, links=links, cluster=cluster, min_factor=min_factor,
                         max_factor=max_factor, out=out)  # fmt: skip
    _say(trace, out)


def register(app: typer.Typer) -> None:
    """Add the `trace` command group to app."""
    app.add_typer(trace_app, name="trace")
