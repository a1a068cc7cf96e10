"""benchmarks/adaptive.py's held-out trace families, and the wrong model and noisy measurements of its --perturbed mode.

Held-out families (never used to tune the controller's constants):
  replay-250ms  the Norway train log of the main set with one series sample per T/4 instead of per T;
  bus, ferry    two other logs of the same dataset (tests/data/norway_bus_1.csv, norway_ferry_10.csv), each against
                its own 90th percentile, at one series second per T (1 s per bin) and per T/4 (250 ms per bin);
  flip          adversarial: nominal and 0.05 in turn, each phase lasting a seeded uniform 1-2 iterations of 1F1B
                at that phase's rate (so a slowed phase spans 1-2 slowed iterations, not a fraction of one);
  drift         the rate falls geometrically from nominal to 0.1 over `iterations` idle T, in steps of T/4, then holds.
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
HELD_OUT = ("replay-250ms", "bus-1s", "bus-250ms", "ferry-1s", "ferry-250ms", "flip", "drift")
SERIES = {"train": "norway_train_1.csv", "bus": "norway_bus_1.csv", "ferry": "norway_ferry_10.csv"}
FLIP_SLOW = 0.05
DRIFT_FLOOR = 0.1


def series_trace(name: str, bin_ms: float, links: list[tuple[int, int]], nominal: float | None = None) -> Any:
    """The Norway log `name` (SERIES) replayed at one series second per bin_ms, against `nominal` Mbit/s (default:
    the log's 90th percentile), clipped to 0.05..1."""
    from pipeplan.io.series_csv import read_series
    from pipeplan.sim.trace_gen import replay_trace

    series = read_series(DATA / SERIES[name])
    if nominal is None:
        nominal = statistics.quantiles(series.values, n=10)[-1]
    return replay_trace(series.times_s, series.values, nominal, bin_ms / 1000.0, links)


def flip_trace(seed: int, fast_ms: float, slow_ms: float, duration_ms: float, links: list[tuple[int, int]]) -> Any:
    """Nominal and FLIP_SLOW in turn from nominal at 0, each phase uniform in 1-2 x its own iteration (fast_ms or
    slow_ms), seeded."""
    from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace, TraceStep

    rng = random.Random(seed)
    steps, t, slow = [], 0.0, False
    while t < duration_ms:
        t += rng.uniform(1.0, 2.0) * (slow_ms if slow else fast_ms)
        slow = not slow
        steps += [TraceStep(t, link, FLIP_SLOW if slow else 1.0) for link in links]
    return BandwidthTrace(tuple(steps))


def drift_trace(idle_ms: float, reach_ms: float, links: list[tuple[int, int]]) -> Any:
    """From nominal down to DRIFT_FLOOR geometrically over reach_ms, a step every idle_ms / 4, then held."""
    from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace, TraceStep

    bins = max(1, math.ceil(reach_ms / (idle_ms / 4)))
    steps = [TraceStep(i * reach_ms / bins, link, DRIFT_FLOOR ** (i / bins)) for i in range(1, bins + 1) for link in links]
    return BandwidthTrace(tuple(steps))


def held_out_trace(name: str, idle_ms: float, slow_ms: float, links: list[tuple[int, int]], seed: int, iterations: int) -> Any:
    """The held-out family `name` (module docstring) for a plan whose idle 1F1B iteration is idle_ms and whose 1F1B
    iteration with every link at FLIP_SLOW is slow_ms."""
    if name == "replay-250ms":
        from adaptive import NOMINAL_MBIT

        return series_trace("train", idle_ms / 4, links, NOMINAL_MBIT)
    if name == "flip":
        return flip_trace(seed, idle_ms, slow_ms, (idle_ms + slow_ms) * iterations, links)
    if name == "drift":
        return drift_trace(idle_ms, idle_ms * iterations, links)
    log, scale = name.split("-")
    return series_trace(log, idle_ms if scale == "1s" else idle_ms / 4, links)


def perturbed(pipeline: Any, seed: int, spread: float = 0.15) -> Any:
    """The pipeline as a wrong model of it: every stage's forward and backward ms and every link's nominal rate
    (its flows' wire time) scaled by a seeded uniform factor in 1 +- spread."""
    from pipeplan.sim.cost.types import Costs, Flow

    rng = random.Random(seed)
    stages = []
    for c in pipeline.costs.stages:
        f, b = rng.uniform(1 - spread, 1 + spread), rng.uniform(1 - spread, 1 + spread)
        stages.append(
            dataclasses.replace(
                c, fwd_ms=c.fwd_ms * f, bwd_ms=c.bwd_ms * b, bwd_input_ms=c.bwd_input_ms * b, bwd_weight_ms=c.bwd_weight_ms * b
            )
        )
    rate = {link: rng.uniform(1 - spread, 1 + spread) for link in sorted(pipeline.flows)}

    def scaled(flows: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(Flow(f.resources, f.link, f.latency_ms, f.work_ms / rate[f.link]) for f in flows)

    costs = pipeline.costs
    wrong = Costs(tuple(stages), tuple(map(scaled, costs.forward)), tuple(map(scaled, costs.backward)), costs.shared)
    return dataclasses.replace(pipeline, costs=wrong)


def noisy(seed: int, sigma: float = 0.1) -> Callable[[Any], Any]:
    """A seeded distortion of observations: every measured span (each transfer, each stage's mean forward and
    backward) times an independent lognormal factor exp(N(0, sigma)), the transfer's start kept."""
    from pipeplan.adapt.observation import Transfer

    rng = random.Random(seed)

    def distort(observation: Any) -> Any:
        def jitter(x: float) -> float:
            return x * math.exp(rng.gauss(0.0, sigma))

        transfers = tuple(
            Transfer(t.link, t.nbytes, t.start_ms, t.start_ms + jitter(t.end_ms - t.start_ms)) for t in observation.transfers
        )
        return dataclasses.replace(
            observation,
            stage_fwd_ms=tuple(map(jitter, observation.stage_fwd_ms)),
            stage_bwd_ms=tuple(map(jitter, observation.stage_bwd_ms)),
            transfers=transfers,
        )

    return distort
