"""The `adapt --png` figure: link bandwidth, k and iteration time against time, for the controller and fixed 1F1B."""

from __future__ import annotations

import math

import matplotlib

from pipeplan.core.units import ms_to_s

matplotlib.use("Agg")

import matplotlib.pyplot as plt

from pipeplan.adapt.fixed_baselines import AdaptComparison
from pipeplan.adapt.pipeline import PipelineModel
from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace

COLORS = {"adaptive": "#0072B2", "1f1b": "#D55E00", "oracle": "#009E73"}
"""Okabe-Ito colours, as the timeline uses."""


def _bandwidth_steps(trace: BandwidthTrace, pipeline: PipelineModel, end_ms: float) -> dict[str, tuple[list[float], list[float]]]:
    """Per link the trace changes (or all, as one line when only "all" steps exist): step points in (s, GB/s); the
    transfers' links and the all-reduce rings' (PipelineModel.traffic_links) whose nominal rate is known."""
    lines: dict[str, tuple[list[float], list[float]]] = {}
    links = [
        link
        for link in pipeline.traffic_links
        if trace.affects(link) and (link in pipeline.flows or math.isfinite(pipeline.nominal_gb_per_s(link)))
    ]
    seen: set[tuple[tuple[float, ...], tuple[float, ...]]] = set()
    for link in links:
        times, factors = trace.segments(link)
        nominal = pipeline.nominal_gb_per_s(link)
        if (times, factors) in seen and len(lines) >= 1:
            continue  # both directions of a boundary usually move alike: draw one
        seen.add((times, factors))
        xs = [ms_to_s(t) for t in times if t <= end_ms] + [ms_to_s(end_ms)]
        ys = [f * nominal for t, f in zip(times, factors, strict=True) if t <= end_ms]
        lines[f"{link[0]}->{link[1]}"] = (xs, [*ys, ys[-1]])
    return lines


def render_adapt(comparison: AdaptComparison, pipeline: PipelineModel, trace: BandwidthTrace, path: str, title: str = "") -> None:
    """Write a three-panel PNG: bandwidth of the links the trace slows, k per iteration, iteration ms per iteration."""
    runs = {name: comparison.policies[name] for name in ("adaptive", "1f1b", "oracle") if name in comparison.policies}
    end_ms = max(run.total_ms for run in runs.values())
    fig, (bandwidth, ks, times) = plt.subplots(3, 1, figsize=(10, 7.5), sharex=True, height_ratios=(1.2, 1, 1.4))
    for label, (xs, ys) in _bandwidth_steps(trace, pipeline, end_ms).items():
        bandwidth.step(xs, ys, where="post", label=f"link {label}", linewidth=1.2)
    bandwidth.set_ylabel("GB/s")
    bandwidth.set_ylim(bottom=0)
    bandwidth.legend(loc="upper right", fontsize=8)
    bandwidth.set_title(title or "adaptive k under a bandwidth trace", fontsize=10, loc="left")
    for name, run in runs.items():
        starts = [ms_to_s(t) for t in run.start_ms]
        edges = [*starts, ms_to_s(run.total_ms)]
        style = {"color": COLORS[name], "label": name, "linewidth": 1.4 if name != "oracle" else 1.0}
        if name == "oracle":
            style["linestyle"] = ":"
        ks.step(edges, [*run.k, run.k[-1]], where="post", **style)
        times.plot(starts, run.iteration_ms, marker=".", markersize=4, **style)
    ks.set_ylabel("k")
    ks.set_ylim(bottom=0)
    ks.legend(loc="upper right", fontsize=8)
    times.set_ylabel("iteration ms")
    times.set_xlabel("time (s, the trace's clock)")
    times.set_ylim(bottom=0)
    times.legend(loc="upper right", fontsize=8)
    for axis in (bandwidth, ks, times):
        axis.grid(alpha=0.3)
    fig.tight_layout()
    from pipeplan.io.atomic import atomic_output
    from pipeplan.io.file_kinds import PNG

    try:
        with atomic_output(path, binary=True, kind=PNG) as handle:
            fig.savefig(handle, format="png", dpi=110)
    finally:
        plt.close(fig)
