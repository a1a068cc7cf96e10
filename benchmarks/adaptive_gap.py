"""Where the controller loses to the oracle on one row of benchmarks/adaptive.py, and what knowing the present gives.

Usage: PYTHONPATH=src .venv/bin/python benchmarks/adaptive_gap.py [--profile dapple/xlnet-36] [--cluster pcie-4x4-10g]
       [--trace ferry-250ms] [--k-max 8] [--per-iteration]

The row is built as adaptive.py builds it (its plan, links, trace family and the seed of its job list). Printed:
  - the controller (ControllerConfig's defaults) and the oracle (runs.run_oracle), whole run and over a replayed
    log's span (adaptive.work_rate);
  - the greedy policy that knows the next iteration's network: each iteration the k that ends it first from where
    the last one ended. With switch_ms 0 it is the oracle (an iteration that starts later never ends earlier, so the
    earliest end of every iteration is the best start of the next): the oracle's gain is one iteration of look-ahead;
    and the same one iteration late (the k that was fastest for the iteration that just ended, known exactly);
  - the controller's regret per iteration: its iteration's time minus the fastest k's from the same start (summed
    inside the log's span and past it), with --per-iteration each iteration's k, time, best k and the decision;
  - policies that know the present exactly and nothing after it: every link's true factor `delay` ms before each
    boundary (delay 0: the rate at the boundary itself), or the factor at the boundary times a seeded exp(N(0,
    sigma)) per link, T(k) predicted at those constant rates (predict.Predictor, no trace), the smallest k within a
    band of the fastest kept as the controller's rule keeps it (band 0 and gain_threshold). An online controller
    measures only ended transfers, so these bound what a better estimate of "now" could reach.
Candidate k are 1..--k-max for the greedy and the present-known policies (the oracle and controller use every k
that fits; the oracle's k are printed to show they lie within).
"""

from __future__ import annotations

import argparse
import math
import random
from collections.abc import Callable, Mapping
from typing import Any

from adaptive import CLUSTERS, ITERATIONS, PROFILES, TRACES, cross_node_links, log_span_ms, make_trace, plan_instance, work_rate

Factors = Mapping[tuple[int, int], float]


def row_job(profile: str, cluster: str) -> tuple[int, int]:
    """(seed, microbatch size) of the instance in adaptive.py's job list (its seed is 7 + the job's index)."""
    pairs = [(p, b, c) for p, b in PROFILES for c in CLUSTERS]
    index = next(i for i, (p, _, c) in enumerate(pairs) if p == profile and c == cluster)
    return 7 + index, pairs[index][1]


def build_row(profile: str, cluster: str, name: str) -> tuple[Any, Any]:
    """(pipeline, trace) of adaptive.py's row: its instance, links and trace, seeded as its job list seeds it."""
    from adaptive_traces import FLIP_SLOW, held_out_trace
    from pipeplan.adapt.pipeline import PipelineModel
    from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace, TraceStep
    from pipeplan.schedules.kfkb import kfkb
    from pipeplan.sim.engine.simulator import simulate

    seed, batch = row_job(profile, cluster)
    request, result = plan_instance(profile, batch, cluster)
    idle = PipelineModel.from_plan(result.plan, request.model)
    links = cross_node_links(idle, request.model.cluster)
    if name in TRACES:
        trace = make_trace(name, result.iteration_time, links, seed, ITERATIONS)
    else:
        slowed = BandwidthTrace(tuple(TraceStep(0.0, link, FLIP_SLOW) for link in links))
        slow_ms = simulate(kfkb(idle.num_stages, idle.microbatches, 1), idle.costs, slowed, record=False).iteration_time
        trace = held_out_trace(name, result.iteration_time, slow_ms, links, seed, ITERATIONS)
    return PipelineModel.from_plan(result.plan, request.model, trace), trace


class Row:
    """One row's pipeline and trace with kFkB for k = 1..k_max: the true time of an iteration from any start."""

    def __init__(self, pipeline: Any, trace: Any, k_max: int) -> None:
        from pipeplan.adapt.predict import Predictor, fitting_ks
        from pipeplan.sim.engine.program import compile_schedule

        schedules, _ = fitting_ks(pipeline)
        self.pipeline, self.trace = pipeline, trace
        self.schedules = {k: s for k, s in schedules.items() if k <= k_max}
        self.programs = {k: compile_schedule(s) for k, s in self.schedules.items()}
        self.predictor = Predictor(pipeline, self.schedules)
        self._memo: dict[tuple[int, float], float] = {}

    def time(self, k: int, start_ms: float) -> float:
        """The true iteration ms of k started at start_ms under the trace."""
        from pipeplan.sim.engine.simulator import simulate

        key = (k, start_ms)
        if key not in self._memo:
            schedule, costs = self.schedules[k], self.pipeline.costs
            result = simulate(schedule, costs, self.trace, record=False, offset_ms=start_ms, program=self.programs[k])
            self._memo[key] = result.iteration_time
        return self._memo[key]

    def fastest(self, start_ms: float) -> tuple[int, float]:
        """The k that ends an iteration started at start_ms first, and its ms."""
        times = {k: self.time(k, start_ms) for k in self.schedules}
        k = min(times, key=lambda x: (times[x], x))
        return k, times[k]

    def factors_at(self, t_ms: float) -> dict[tuple[int, int], float]:
        """Every traffic link's true factor at t_ms."""
        return {link: self.trace.factor_at(link, t_ms) for link in self.pipeline.traffic_links}

    def greedy(self, first_k: int | None = None) -> Any:
        """Each iteration the k that ends it first from where the last one ended (the next iteration's network known);
        with first_k, one iteration late: first_k, then each iteration the k that would have ended the one before it
        first from that one's start (the last iteration's network known exactly once it ended, nothing after)."""
        from pipeplan.adapt.runs import PolicyRun

        t, starts, times, ks = 0.0, [], [], []
        for i in range(ITERATIONS):
            late = first_k is not None and i == 0
            k = first_k if late else self.fastest(t if first_k is None else starts[-1])[0]
            starts.append(t)
            times.append(self.time(k, t))
            ks.append(k)
            t += times[-1]
        return PolicyRun(tuple(starts), tuple(times), (0.0,) * len(ks), "greedy", tuple(ks))

    def run(self, first_k: int, choose: Callable[[float], Factors], band: float) -> Any:
        """A policy that starts with first_k and before each later iteration predicts T(k) at choose(boundary ms),
        keeping its k while within `band` of the fastest, else taking the smallest k within it."""
        from pipeplan.adapt.runs import PolicyRun

        t, k = 0.0, first_k
        starts, times, ks = [], [], []
        for i in range(ITERATIONS):
            if i > 0:
                predicted = self.predictor.times(choose(t))
                best = min(predicted.values())
                if predicted[k] > best * (1 + band):
                    k = min(x for x in predicted if predicted[x] <= best * (1 + band))
            starts.append(t)
            times.append(self.time(k, t))
            ks.append(k)
            t += times[-1]
        return PolicyRun(tuple(starts), tuple(times), (0.0,) * len(ks), "present", tuple(ks))


def main() -> None:
    """Print the row's gap, the greedy look-ahead policy, the regret and the present-known policies."""
    from pipeplan.adapt.controller import AdaptiveController, ControllerConfig
    from pipeplan.adapt.predict import fitting_ks
    from pipeplan.adapt.runs import run_controller, run_oracle

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="dapple/xlnet-36")
    parser.add_argument("--cluster", default="pcie-4x4-10g")
    parser.add_argument("--trace", default="ferry-250ms")
    parser.add_argument("--k-max", type=int, default=8)
    parser.add_argument("--per-iteration", action="store_true")
    args = parser.parse_args()
    pipeline, trace = build_row(args.profile, args.cluster, args.trace)
    config = ControllerConfig()
    span = log_span_ms(args.trace, trace)
    controlled = run_controller(AdaptiveController(pipeline, config), trace, ITERATIONS)
    ctl = controlled.run
    oracle = run_oracle(fitting_ks(pipeline)[0], pipeline, trace, ITERATIONS, config.switch_ms)

    def versus(run: Any) -> str:
        return f"{oracle.total_ms / run.total_ms:.4f} (over the log's span {work_rate(run, span) / work_rate(oracle, span):.4f})"

    print(f"{args.profile} {args.cluster} {args.trace}: log ends at {span} ms; oracle {oracle.total_ms:.0f} ms, k used "
          f"{sorted(set(oracle.k))}; controller {ctl.total_ms:.0f} ms, vs oracle {versus(ctl)}")  # fmt: skip
    row = Row(pipeline, trace, args.k_max)
    greedy = row.greedy()
    print(f"greedy with the next iteration's network known: {greedy.total_ms:.0f} ms, vs oracle {versus(greedy)}")
    late = row.greedy(ctl.k[0])
    print(
        f"one iteration late (each iteration the k fastest in the one before it): vs oracle {versus(late)}, "
        f"{late.switches} switches"
    )
    inside = past = 0.0
    for i, (start, ms, k) in enumerate(zip(ctl.start_ms, ctl.iteration_ms, ctl.k, strict=True)):
        best_k, best_ms = row.fastest(start) if k <= args.k_max else (k, ms)
        regret = ms - min(ms, best_ms)
        if span is None or start < span:
            inside += regret
        else:
            past += regret
        if args.per_iteration:
            reason = controlled.decisions[i].reason[:110] if i < len(controlled.decisions) else ""
            print(f"  {i:2d} start {start:9.0f} k={k:2d} {ms:8.0f} ms; best k={best_k:2d} {best_ms:8.0f} ms; "
                  f"regret {regret:6.0f} | oracle k={oracle.k[i]:2d} {oracle.iteration_ms[i]:8.0f} ms | {reason}")  # fmt: skip
    gap = ctl.total_ms - oracle.total_ms
    print(f"controller's regret (its iteration minus the fastest k's from the same start): {inside:.0f} ms in iterations "
          f"that start inside the log's span, {past:.0f} ms after it; whole-run gap {gap:.0f} ms")  # fmt: skip
    first = ctl.k[0]
    for band in (0.0, config.gain_threshold):
        for delay in (0.0, 125.0, 250.0, 500.0, 1000.0):
            run = row.run(first, lambda b, d=delay: row.factors_at(max(0.0, b - d)), band)
            print(
                f"true rates {delay:5.0f} ms before each boundary, band {band:.0%}: vs oracle {versus(run)}, "
                f"{run.switches} switches"
            )
        for sigma in (0.05, 0.1):
            ratios = []
            for seed in range(5):
                rng = random.Random(seed)

                def noisy(b: float, rng: random.Random = rng, sigma: float = sigma) -> Factors:
                    return {link: f * math.exp(rng.gauss(0.0, sigma)) for link, f in row.factors_at(b).items()}

                run = row.run(first, noisy, band)
                ratios.append(f"{oracle.total_ms / run.total_ms:.4f}")
            print(
                f"true rates at each boundary x exp(N(0, {sigma})) per link, band {band:.0%}, seeds 0-4: "
                f"vs oracle {' '.join(ratios)}"
            )


if __name__ == "__main__":
    main()
