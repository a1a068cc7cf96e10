"""The Ada-Grouper controller: observe an iteration, estimate the links, predict T(k) by simulation, switch k or stay."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeplan.adapt.estimate import ComputeEstimator, LinkEstimator, wire_samples
from pipeplan.adapt.observation import IterationObservation, Link
from pipeplan.adapt.pipeline import PipelineModel
from pipeplan.adapt.predict import Predictor, fitting_ks
from pipeplan.core.errors import AdaptError
from pipeplan.core.plan import Plan
from pipeplan.sim.cost_model import CostModel
from pipeplan.sim.trace import BandwidthTrace

GIB = float(1 << 30)


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    """The controller's constants (frozen for the benchmark; BENCHMARKS.md, "Ada-Grouper (simulated)").

    gain_threshold: switch only when the best k is predicted faster than the current one by more than this
        fraction of the current k's time (plus `switch_ms`).
    short_half_life: age (iterations) at which a measurement weighs half, for the estimate that decides.
    long_half_life: the same for the slower estimate that confirms: a switch must not make the iteration
        slower under it by more than `gain_threshold`, so a network that flips faster than the controller
        can follow does not make k flap.
    switch_ms: what changing k costs at an iteration boundary (ms); counted against the predicted gain.
    factor_step: predictions are memoized on link factors and stage times rounded to a grid of ratio 1 + step.
    k_choices: the k the controller may pick (None: every k from 1 to m that fits memory).
    initial_k: the k of the first iteration (None: the best k at nominal bandwidth).
    """

    gain_threshold: float = 0.02
    short_half_life: float = 0.5
    long_half_life: float = 4.0
    switch_ms: float = 0.0
    factor_step: float = 0.01
    k_choices: tuple[int, ...] | None = None
    initial_k: int | None = None

    def __post_init__(self) -> None:
        for name in ("gain_threshold", "switch_ms"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise AdaptError(f"controller {name} must be a finite number >= 0, got {value!r}")
        for name in ("short_half_life", "long_half_life", "factor_step"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise AdaptError(f"controller {name} must be a finite number > 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class Decision:
    """The controller's choice for one iteration and why.

    `iteration`: the iteration that runs with `k`; `factors` / `bandwidth_gb_per_s`: each link's estimated rate
    (as a factor of nominal, and in GB/s) the prediction used; `predicted_ms` / `long_predicted_ms`: T(k) of every
    candidate under the short- and long-horizon estimates; `peak_bytes`: each candidate's largest per-device
    peak; `memory_limit_bytes`: the smallest device limit; `decision_ms`: wall time spent deciding.
    """

    iteration: int
    k_before: int
    k: int
    reason: str
    factors: dict[Link, float]
    bandwidth_gb_per_s: dict[Link, float]
    predicted_ms: dict[int, float]
    long_predicted_ms: dict[int, float]
    peak_bytes: dict[int, float]
    memory_limit_bytes: float
    decision_ms: float = field(default=0.0, compare=False)

    @property
    def switched(self) -> bool:
        """True when this decision changes k."""
        return self.k != self.k_before

    def to_json(self, timing: bool = False) -> dict[str, Any]:
        """A JSON object (links as "a->b"); `decision_ms` only with `timing` (it differs run to run)."""
        obj: dict[str, Any] = {
            "iteration": self.iteration,
            "k_before": self.k_before,
            "k": self.k,
            "switched": self.switched,
            "reason": self.reason,
            "factors": {f"{a}->{b}": f for (a, b), f in self.factors.items()},
            "bandwidth_gb_per_s": {f"{a}->{b}": g for (a, b), g in self.bandwidth_gb_per_s.items()},
            "predicted_ms": {str(k): t for k, t in self.predicted_ms.items()},
            "long_predicted_ms": {str(k): t for k, t in self.long_predicted_ms.items()},
            "peak_bytes": {str(k): b for k, b in self.peak_bytes.items()},
            "memory_limit_bytes": self.memory_limit_bytes,
        }
        if timing:
            obj["decision_ms"] = self.decision_ms
        return obj


class AdaptiveController:
    """Chooses kFkB's k at every iteration boundary from what the iterations measured.

    Use: build it (`from_plan` or `from_measurements`), run the first iteration
    with `controller.k`, then after each iteration call `step(observation)`
    and run the next one with the returned decision's k. The same
    observations give the same decisions (no clock or randomness steers it),
    so every rank of a job can run its own copy and switch at the same iteration.

    Each decision: estimate every link's rate (short and long half-life) and
    each stage's compute, simulate the next iteration for every k that fits
    memory (k = 1..k_max, sim.engine, memoized), and switch to the fastest k
    when it gains more than the threshold under the short estimate and is not
    slower by more than the threshold under the long one; else stay.
    """

    def __init__(self, pipeline: PipelineModel, config: ControllerConfig | None = None) -> None:
        self.pipeline = pipeline
        self.config = config or ControllerConfig()
        schedules, peaks = fitting_ks(pipeline)
        if not schedules:
            raise AdaptError(_no_fit(pipeline, peaks[1]))
        if self.config.k_choices is not None:
            wanted = set(self.config.k_choices)
            outside = sorted(wanted - set(schedules))
            if outside:
                raise AdaptError(
                    f"k_choices holds k={outside[0]}, which does not fit memory or exceeds m={pipeline.microbatches} "
                    f"(k_max {max(schedules)})"
                )
            schedules = {k: s for k, s in schedules.items() if k in wanted}
        self.k_max = max(schedules)
        self.peak_bytes = {k: max(peaks[k]) for k in schedules}
        self.predictor = Predictor(pipeline, schedules, self.config.factor_step)
        stages = pipeline.costs.stages
        self.short = LinkEstimator(self.config.short_half_life)
        self.long = LinkEstimator(self.config.long_half_life)
        self.compute = ComputeEstimator([c.fwd_ms for c in stages], [c.bwd_ms for c in stages], self.config.short_half_life)
        self.decisions: list[Decision] = []
        self.k = self.config.initial_k if self.config.initial_k is not None else min(schedules)
        if self.k not in schedules:
            raise AdaptError(f"initial_k {self.k} is not a candidate (k that fit memory: 1..{self.k_max})")
        self._decide(0, first=True)

    @classmethod
    def from_plan(
        cls, plan: Plan, model: CostModel, config: ControllerConfig | None = None, trace: BandwidthTrace | None = None
    ) -> AdaptiveController:
        """The controller of `plan`'s stages under the simulator's cost model (PipelineModel.from_plan)."""
        return cls(PipelineModel.from_plan(plan, model, trace), config)

    @classmethod
    def from_measurements(cls, config: ControllerConfig | None = None, **numbers: Any) -> AdaptiveController:
        """The controller of a pipeline given as numbers a runtime measures (PipelineModel.from_measurements' arguments)."""
        return cls(PipelineModel.from_measurements(**numbers), config)

    @property
    def k_choices(self) -> tuple[int, ...]:
        """The candidates: every k the controller may pick."""
        return tuple(self.predictor.schedules)

    def predict(self, k: int, factors: dict[Link, float] | None = None) -> float:
        """Predicted ms of the next iteration with `k` under `factors` (default: the current short estimate)."""
        if k not in self.predictor.schedules:
            raise AdaptError(f"k={k} is not a candidate (k that fit memory: {list(self.k_choices)})")
        rates = self.short.factors() if factors is None else factors
        return self.predictor.time(k, rates, self._compute())

    def observe(self, observation: IterationObservation) -> None:
        """Take in one finished iteration's measurements.

        Raises:
            AdaptError: per-stage values for another number of stages, or a transfer on a link the pipeline does not use.
        """
        p = self.pipeline.num_stages
        if observation.stage_fwd_ms and len(observation.stage_fwd_ms) != p:
            raise AdaptError(f"observation has {len(observation.stage_fwd_ms)} stage times for a {p}-stage pipeline")
        samples = wire_samples(self.pipeline, observation.transfers)
        for estimator in (self.short, self.long):
            estimator.add_iteration(samples, observation.end_ms, observation.iteration_ms)
        self.compute.add_iteration(observation.stage_fwd_ms, observation.stage_bwd_ms)

    def step(self, observation: IterationObservation) -> Decision:
        """observe(observation), then decide the k of iteration observation.index + 1."""
        self.observe(observation)
        return self._decide(observation.index + 1)

    def _compute(self) -> tuple[Sequence[float], Sequence[float]] | None:
        return (self.compute.fwd_ms, self.compute.bwd_ms) if self.compute.measured else None

    def _decide(self, iteration: int, first: bool = False) -> Decision:
        started = time.perf_counter()
        short, long = self.short.factors(), self.long.factors()
        compute = self._compute()
        predicted = self.predictor.times(short, compute)
        confirm = self.predictor.times(long, compute)
        current = self.k
        best = min(predicted, key=lambda k: (predicted[k], k != current, k))
        threshold = self.config.gain_threshold
        gain = predicted[current] - predicted[best]
        if first and self.config.initial_k is not None:
            chosen, reason = current, f"start: k={current} as configured (k={best} is the fastest at nominal bandwidth)"
        elif first:
            chosen, reason = best, f"start: k={best} is the fastest at nominal bandwidth ({predicted[best]:.4g} ms)"
        elif best == current:
            chosen, reason = current, f"stay: k={current} is the fastest ({predicted[current]:.4g} ms)"
        elif gain <= threshold * predicted[current] + self.config.switch_ms:
            chosen = current
            reason = (
                f"stay: k={best} would take {predicted[best]:.4g} ms against {predicted[current]:.4g} ms, a gain of "
                f"{gain / predicted[current]:.1%}, not above the threshold {threshold:.0%}"
                + (f" plus the switch's {self.config.switch_ms:g} ms" if self.config.switch_ms else "")
            )
        elif confirm[best] > confirm[current] * (1 + threshold):
            chosen = current
            reason = (
                f"stay: k={best} would gain {gain / predicted[current]:.1%} now, but is "
                f"{confirm[best] / confirm[current] - 1:.1%} slower on the longer horizon (the network changes faster "
                "than k can follow)"
            )
        else:
            chosen = best
            reason = (
                f"switch: k={current} -> {best}, predicted {predicted[current]:.4g} -> {predicted[best]:.4g} ms "
                f"({-gain / predicted[current]:+.1%}) at {_links_text(self.pipeline, short)}"
            )
        self.k = chosen
        decision = Decision(
            iteration,
            chosen if first else current,
            chosen,
            reason,
            short,
            {link: f * self.pipeline.nominal_gb_per_s(link) for link, f in short.items()},
            predicted,
            confirm,
            dict(self.peak_bytes),
            min(self.pipeline.memory_limit_bytes),
            (time.perf_counter() - started) * 1000.0,
        )
        self.decisions.append(decision)
        return decision


def _links_text(pipeline: PipelineModel, factors: dict[Link, float]) -> str:
    """The slowest measured link as 'link a->b x GB/s (f x nominal)', or 'nominal bandwidth'."""
    slow = [link for link in factors if factors[link] < 1.0]
    if not slow:
        return "nominal bandwidth"
    link = min(slow, key=lambda x: factors[x])
    rate = factors[link] * pipeline.nominal_gb_per_s(link)
    return f"link {link[0]}->{link[1]} {rate:.3g} GB/s ({factors[link]:.2f} x nominal)"


def _no_fit(pipeline: PipelineModel, peaks: tuple[float, ...]) -> str:
    """Why not even k=1 (1F1B) fits: the stage that overflows the most and by how much."""
    over = [need - limit for need, limit in zip(peaks, pipeline.memory_limit_bytes, strict=True)]
    s = max(range(len(over)), key=lambda i: over[i])
    return (
        f"no k fits memory: k=1 (1F1B) needs {peaks[s] / GIB:.2f} GiB on stage {s} "
        f"(limit {pipeline.memory_limit_bytes[s] / GIB:.2f} GiB, {over[s] / GIB:.2f} GiB too much)"
    )
