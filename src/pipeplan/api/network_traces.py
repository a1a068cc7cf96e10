"""Bandwidth traces through the API (`pipeplan trace`): periodic preemption, seeded Markov bursts and a replayed
measured series, on the links a `links` text names, each written to `out` as a `pipeplan.bandwidth_trace/1` file
with how it was made.

The generators are sim.trace_gen's; the format is io.bandwidth_trace_json's. Every argument is checked before the
trace is built, in the command's order: the links (and their cluster), then the generator's own numbers.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any

from pipeplan.core.errors import CostError

if TYPE_CHECKING:
    from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace
    from pipeplan.core.hardware.links import Link


def trace_links(text: str, cluster: str | None = None) -> list[Link] | None:
    """`links`: None for "all", every cross-node pair of `cluster` for "inter-node", else the ordered device pairs
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


def factor_range(text: str) -> tuple[float, float]:
    """A factor range LOW,HIGH given as text (`--factor-range`), as two numbers (the generator checks them).

    Raises:
        CostError: not two numbers.
    """
    try:
        low, high = (float(x) for x in text.split(","))
    except ValueError:
        raise CostError(f"--factor-range must be two numbers LOW,HIGH, got {text!r}") from None
    return low, high


def periodic_trace(
    period_ms: float,
    duty: float,
    factor: float,
    duration_ms: float,
    *,
    links: str = "all",
    cluster: str | None = None,
    start_ms: float = 0.0,
    out: str | None = None,
) -> BandwidthTrace:
    """Preemption that repeats (`pipeplan trace periodic`): each period from start_ms on begins with duty x period_ms
    at `factor`; nominal from duration_ms on. With `out`, the trace is written there.

    Raises:
        CostError: a bad links text or number (sim.trace_gen.periodic_trace), naming it.
    """
    from pipeplan.sim.trace_gen import periodic_trace as generate

    pairs = trace_links(links, cluster)
    trace = generate(period_ms, duty, factor, duration_ms, pairs, start_ms)
    params = {"period_ms": period_ms, "duty": duty, "factor": factor, "links": links, "duration_ms": duration_ms}
    _write(trace, out, {"kind": "periodic", **params, "start_ms": start_ms})
    return trace


def markov_trace(
    seed: int,
    mean_slow_ms: float,
    mean_fast_ms: float,
    factors: str,
    duration_ms: float,
    *,
    links: str = "all",
    cluster: str | None = None,
    out: str | None = None,
) -> BandwidthTrace:
    """Seeded on/off bursts (`pipeplan trace markov`), each burst's factor uniform in `factors` ("LOW,HIGH"). With
    `out`, the trace is written there.

    Raises:
        CostError: a bad links text, range or number (sim.trace_gen.markov_trace), naming it.
    """
    from pipeplan.sim.trace_gen import markov_trace as generate

    pairs = trace_links(links, cluster)
    low, high = factor_range(factors)
    trace = generate(seed, mean_slow_ms, mean_fast_ms, (low, high), duration_ms, pairs)
    params = {"seed": seed, "mean_slow_ms": mean_slow_ms, "mean_fast_ms": mean_fast_ms, "factor_range": [low, high]}
    _write(trace, out, {"kind": "markov", **params, "links": links, "duration_ms": duration_ms})
    return trace


def replay_trace(
    series: str,
    nominal: float,
    *,
    time_scale: float = 1.0,
    links: str = "all",
    cluster: str | None = None,
    min_factor: float = 0.05,
    max_factor: float = 1.0,
    out: str | None = None,
) -> BandwidthTrace:
    """The measured series in the CSV file `series` replayed as factors value / nominal, clipped to [min_factor,
    max_factor] (`pipeplan trace replay`). With `out`, the trace is written there.

    Raises:
        CostError: a bad links text, series file or number (sim.trace_gen.replay_trace), naming it.
    """
    from pipeplan.io.series_csv import read_series
    from pipeplan.sim.trace_gen import replay_trace as generate

    pairs = trace_links(links, cluster)
    data = read_series(series)
    trace = generate(data.times_s, data.values, nominal, time_scale, pairs, min_factor, max_factor, "--time-scale")
    params = {"series": os.path.basename(series), "source": list(data.comments), "nominal": nominal, "unit": data.value_name}
    clip = {"min_factor": min_factor, "max_factor": max_factor}
    _write(trace, out, {"kind": "replay", **params, "time_scale": time_scale, "links": links, **clip})
    return trace


def _write(trace: BandwidthTrace, out: str | None, generator: dict[str, Any]) -> None:
    """The trace with how it was made to `out` (whole or not at all), when given."""
    if out is not None:
        from pipeplan.io.bandwidth_trace_json import write_bandwidth_trace

        write_bandwidth_trace(trace, out, generator)
