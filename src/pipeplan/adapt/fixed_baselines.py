"""`pipeplan adapt`: the controller against fixed 1F1B, GPipe, every fixed k, the best fixed k and the oracle."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pipeplan.adapt.controller import AdaptiveController, ControllerConfig, Decision
from pipeplan.adapt.observation import Link
from pipeplan.adapt.pipeline import PipelineModel
from pipeplan.adapt.predict import stage_peak_bytes
from pipeplan.adapt.runs import PolicyRun, run_controller, run_fixed, run_oracle
from pipeplan.core.errors import AdaptError
from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace
from pipeplan.core.work import Run, kfkb_events
from pipeplan.schedules.kfkb import kfkb

GIB = float(1 << 30)
POLICY_ORDER = ("adaptive", "1f1b", "gpipe", "best_static", "oracle")


@dataclass
class AdaptComparison:
    """Every policy's run under one trace, the controller's decisions and their cost.

    `policies`: adaptive, 1f1b, gpipe (when all m microbatches fit), best_static
    (the fixed k with the least total time) and oracle; `fixed[k]`: every
    fixed k that fits memory and the budget; `not_run`: policies left out, with the reason;
    `allreduce_nominal_ms` and `ring_links`: each stage's data-parallel all-reduce at nominal rate and its ring
    (what the JSON's all-reduce slowdown is measured against); `memory_budget_bytes`: the controller's budget
    (None: the devices' memory); `peak_bytes_per_k`: each candidate k's largest per-device peak.
    """

    policies: dict[str, PolicyRun]
    fixed: dict[int, PolicyRun]
    decisions: list[Decision]
    decision_ms: list[float]
    decision_cpu_ms: list[float]
    k_max: int
    memory_limit_bytes: float
    not_run: dict[str, str] = field(default_factory=dict)
    allreduce_nominal_ms: tuple[float, ...] = ()
    ring_links: tuple[tuple[Link, ...], ...] = ()
    memory_budget_bytes: float | None = None
    peak_bytes_per_k: dict[int, float] = field(default_factory=dict)
    """The largest per-device peak of each candidate k (the controller's `peak_bytes`)."""

    def speedup(self, name: str, over: str = "1f1b") -> float:
        """Total time of `over` / total time of `name` (above 1: `name` is faster)."""
        return self.policies[over].total_ms / self.policies[name].total_ms

    @property
    def decision_share(self) -> float:
        """The slowest decision's wall time over the mean iteration time of the controller's run."""
        run = self.policies["adaptive"]
        mean = sum(run.iteration_ms) / len(run.iteration_ms)
        return max(self.decision_ms, default=0.0) / mean

    def to_json(self, timing: bool = True) -> dict[str, Any]:
        """{"policies": {name: run}, "fixed_k": {k: run}, "decisions": [...], "k_max", "memory_limit_bytes",
        "memory_budget_bytes", "peak_bytes_per_k": {k: bytes}, "not_run", and with `timing` "controller":
        {decision_ms_mean, decision_ms_max, decision_share_max, decision_cpu_ms_mean}} (wall and CPU times of the
        controller's steps: they differ from run to run). Each run adds "allreduce" (allreduce_json: every stage
        with an all-reduce, its nominal, mean and longest ms over the run, mean / nominal) and each decision
        "ring_factors" (per such stage, the factor of its ring's slowest link under the decision's estimates)."""
        obj: dict[str, Any] = {
            "policies": {name: self.run_json(run) for name, run in self.policies.items()},
            "fixed_k": {str(k): self.run_json(run) for k, run in self.fixed.items()},
            "best_static_k": self.policies["best_static"].k[0],
            "decisions": [{**d.to_json(), "ring_factors": self.ring_factors(d.factors)} for d in self.decisions],
            "k_max": self.k_max,
            "memory_limit_bytes": self.memory_limit_bytes,
            "memory_budget_bytes": self.memory_budget_bytes,
            "peak_bytes_per_k": {str(k): b for k, b in self.peak_bytes_per_k.items()},
            "not_run": dict(self.not_run),
        }
        if timing:
            spent = self.decision_ms or [0.0]
            obj["controller"] = {
                "decision_ms_mean": sum(spent) / len(spent),
                "decision_ms_max": max(spent),
                "decision_share_max": self.decision_share,
                "decision_cpu_ms_mean": sum(self.decision_cpu_ms or [0.0]) / max(1, len(self.decision_cpu_ms)),
            }
        return obj

    def run_json(self, run: PolicyRun) -> dict[str, Any]:
        """The run's JSON with its "allreduce": {"stages", "nominal_ms", "mean_ms", "max_ms", "slowdown"} (one
        entry per stage that has an all-reduce; slowdown = mean / nominal)."""
        stages = [s for s, nominal in enumerate(self.allreduce_nominal_ms) if nominal > 0]
        count = max(1, len(run.allreduce_ms))
        mean = [sum(row[s] for row in run.allreduce_ms) / count for s in stages]
        longest = [max((row[s] for row in run.allreduce_ms), default=0.0) for s in stages]
        nominal = [self.allreduce_nominal_ms[s] for s in stages]
        allreduce = {
            "stages": stages,
            "nominal_ms": nominal,
            "mean_ms": mean,
            "max_ms": longest,
            "slowdown": [m / n for m, n in zip(mean, nominal, strict=True)],
        }
        return {**run.to_json(), "allreduce": allreduce}

    def ring_factors(self, factors: Mapping[Link, float]) -> dict[str, float]:
        """Per stage with an all-reduce ring, its slowest link's factor under `factors` (absent links: 1)."""
        return {
            str(s): min(factors.get(link, 1.0) for link in ring)
            for s, ring in enumerate(self.ring_links)
            if ring and self.allreduce_nominal_ms[s] > 0
        }


def check_adapt_work(pipeline: PipelineModel, trace: BandwidthTrace | None, iterations: int, flag: str) -> None:
    """Refuse `iterations` (given as `flag`) when every policy's run would cost more than core.limits allows
    (core.work.adapt_runs: p, m, the transfers' flows and the trace's changes), before any is simulated.

    Raises:
        AdaptError: naming the flag, the estimate, the limit and the most iterations that fit.
    """
    from pipeplan.core.work import adapt_runs, check_work
    from pipeplan.sim.engine.iterations import trace_changes

    p, m = pipeline.num_stages, pipeline.microbatches
    flows = max((len(b) for b in pipeline.costs.forward + pipeline.costs.backward), default=0)
    events = kfkb_events(p, m, flows)
    changes = trace_changes(trace)

    def runs(n: int) -> tuple[list[Run], float]:
        return adapt_runs(n, p, m, events, changes)

    check_work(f"adapt of a {p}-stage pipeline, m={m}, every k and the oracle", flag, iterations, runs, AdaptError)


def compare_policies(
    pipeline: PipelineModel,
    trace: BandwidthTrace | None,
    iterations: int,
    config: ControllerConfig | None = None,
    flag: str = "iterations",
) -> AdaptComparison:
    """Run every policy for `iterations` iterations under `trace` (the same pipeline, the same simulator).

    Raises:
        AdaptError: iterations below 1, more than core.limits allows (`flag` names them), or no k fits memory.
    """
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise AdaptError(f"{flag} must be an integer >= 1, got {iterations!r}")
    check_adapt_work(pipeline, trace, iterations, flag)
    config = config or ControllerConfig()
    controller = AdaptiveController(pipeline, config)
    schedules = controller.predictor.schedules
    fixed = {k: run_fixed(f"k={k}", k, schedules[k], pipeline, trace, iterations) for k in schedules}
    adaptive = run_controller(controller, trace, iterations)
    best_k = min(fixed, key=lambda k: (fixed[k].total_ms, k))
    m = pipeline.microbatches
    policies = {"adaptive": adaptive.run}
    not_run: dict[str, str] = {}
    if 1 in fixed:
        policies["1f1b"] = _renamed(fixed[1], "1f1b")
    else:
        policies["1f1b"] = run_fixed("1f1b", 1, kfkb(pipeline.num_stages, m, 1), pipeline, trace, iterations)
    if m in fixed:
        policies["gpipe"] = _renamed(fixed[m], "gpipe")
    else:
        not_run["gpipe"] = _gpipe_misses(pipeline, controller.memory_budget_bytes)
    policies["best_static"] = _renamed(fixed[best_k], "best_static")
    policies["oracle"] = run_oracle(schedules, pipeline, trace, iterations, config.switch_ms)
    return AdaptComparison(
        policies,
        fixed,
        adaptive.decisions,
        adaptive.decision_ms,
        adaptive.decision_cpu_ms,
        controller.k_max,
        min(pipeline.memory_limit_bytes),
        not_run,
        tuple(c.allreduce_ms for c in pipeline.costs.stages),
        pipeline.ring_links,
        controller.memory_budget_bytes,
        dict(controller.peak_bytes),
    )


def _renamed(run: PolicyRun, name: str) -> PolicyRun:
    return PolicyRun(run.start_ms, run.iteration_ms, run.peak_bytes, name, run.k, allreduce_ms=run.allreduce_ms)


def _gpipe_misses(pipeline: PipelineModel, budget: float | None = None) -> str:
    """Why GPipe (all m microbatches in flight) is left out: the stage that overflows its device (or the memory
    budget) the most, or the controller's k_choices."""
    m = pipeline.microbatches
    peaks = stage_peak_bytes(pipeline, kfkb(pipeline.num_stages, m, m))
    limits = [limit if budget is None else min(limit, budget) for limit in pipeline.memory_limit_bytes]
    over = [need - limit for need, limit in zip(peaks, limits, strict=True)]
    s = max(range(len(over)), key=lambda i: over[i])
    if over[s] <= 0:
        return f"k={m} (GPipe) is not among the controller's k_choices"
    what = "its" if budget is None or limits[s] < budget else "the memory budget's"
    return (
        f"GPipe holds all {m} microbatches: {peaks[s] / GIB:.2f} GiB on stage {s}, "
        f"{over[s] / GIB:.2f} GiB over {what} {limits[s] / GIB:.2f} GiB"
    )
