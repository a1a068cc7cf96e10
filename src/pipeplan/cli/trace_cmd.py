"""The `pipeplan trace` commands: write bandwidth traces over many iterations (periodic, markov, replay)."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import typer

from pipeplan.core.errors import CostError

if TYPE_CHECKING:
    from pipeplan.sim.trace import BandwidthTrace, Link

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


def parse_links(text: str, cluster: str | None = None) -> list[Link] | None:
    """--links: None for "all", every cross-node pair of `cluster` for "inter-node", else the ordered device pairs
    ("a-b" one direction, "a=b" both), in the order given.

    Raises:
        CostError: naming the part that is not a-b or a=b with two different device ids, or "inter-node" without a
            cluster of several nodes.
    """
    if cluster is not None and text.strip() != "inter-node":
        raise CostError(f"--cluster applies only with --links inter-node, got --links {text!r}")
    if text.strip() == "all":
        return None
    if text.strip() == "inter-node":
        if cluster is None:
            raise CostError("--links inter-node needs --cluster (whose nodes it reads)")
        from pipeplan.presets.resolve import load_cluster

        devices = load_cluster(cluster).devices
        pairs = [(a.id, b.id) for a in devices for b in devices if a.node != b.node]
        if not pairs:
            raise CostError(f"--links inter-node: cluster {cluster!r} has one node, so no link between nodes")
        return pairs
    links: list[Link] = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*([-=])\s*(\d+)\s*", part)
        if match is None or match.group(1) == match.group(3):
            raise CostError(f'--links must be "all" or a list of a-b / a=b with two different device ids, got {part.strip()!r}')
        a, b = int(match.group(1)), int(match.group(3))
        links.append((a, b))
        if match.group(2) == "=":
            links.append((b, a))
    return list(dict.fromkeys(links))


def _write(trace: BandwidthTrace, out: str, generator: dict[str, Any]) -> None:
    """Write {"format", "generator", "steps"} to out (whole or not at all) and print a one-line summary."""
    from pipeplan.io.atomic import write_text_atomic
    from pipeplan.io.file_kinds import BANDWIDTH_TRACE

    obj = {"format": "pipeplan.bandwidth_trace/1", "generator": generator, "steps": trace.to_json()}
    write_text_atomic(out, json.dumps(obj, indent=1, sort_keys=True) + "\n", BANDWIDTH_TRACE)
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
    from pipeplan.cli.outputs import check_files  # not at the top: `pipeplan --help` imports no numpy
    from pipeplan.sim.trace_gen import periodic_trace

    check_files()
    pairs = parse_links(links, cluster)
    trace = periodic_trace(period_ms, duty, factor, duration_ms, pairs, start_ms)
    params = {"period_ms": period_ms, "duty": duty, "factor": factor, "links": links, "duration_ms": duration_ms}
    _write(trace, out, {"kind": "periodic", **params, "start_ms": start_ms})


def _range(text: str) -> tuple[float, float]:
    """--factor-range LOW,HIGH as two numbers (checked by the generator)."""
    try:
        low, high = (float(x) for x in text.split(","))
    except ValueError:
        raise CostError(f"--factor-range must be two numbers LOW,HIGH, got {text!r}") from None
    return low, high


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
    from pipeplan.cli.outputs import check_files  # not at the top: `pipeplan --help` imports no numpy
    from pipeplan.sim.trace_gen import markov_trace

    check_files()
    pairs = parse_links(links, cluster)
    low, high = _range(factor_range)
    trace = markov_trace(seed, mean_slow_ms, mean_fast_ms, (low, high), duration_ms, pairs)
    params = {"seed": seed, "mean_slow_ms": mean_slow_ms, "mean_fast_ms": mean_fast_ms, "factor_range": [low, high]}
    _write(trace, out, {"kind": "markov", **params, "links": links, "duration_ms": duration_ms})


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
    import os

    from pipeplan.cli.outputs import check_files  # not at the top: `pipeplan --help` imports no numpy
    from pipeplan.io.series_csv import read_series
    from pipeplan.sim.trace_gen import replay_trace

    check_files()
    pairs = parse_links(links, cluster)
    data = read_series(series)
    trace = replay_trace(data.times_s, data.values, nominal, time_scale, pairs, min_factor, max_factor, "--time-scale")
    params = {"series": os.path.basename(series), "source": list(data.comments), "nominal": nominal, "unit": data.value_name}
    clip = {"min_factor": min_factor, "max_factor": max_factor}
    _write(trace, out, {"kind": "replay", **params, "time_scale": time_scale, "links": links, **clip})


def register(app: typer.Typer) -> None:
    """Add the `trace` command group to app."""
    app.add_typer(trace_app, name="trace")
