"""The controller's constants (ControllerConfig) and what each decision records (Decision)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pipeplan.adapt.observation import Link
from pipeplan.core.errors import AdaptError


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    """The controller's constants (frozen for the benchmark; BENCHMARKS.md, "Ada-Grouper (simulated)").

    The decision rule (controller.AdaptiveController._decide): predict T(k) for the candidates under the chosen
    view; the target is the smallest k (the least memory) whose T(k) is within `gain_threshold` of the fastest;
    stay while the current k is itself within it; else switch when what the target saves over the network state's
    expected remaining dwell, dwell x (T(current) - T(target)) / T(current), beats what the switch costs:
    `switch_ms`, plus, when the network as measured "lately" favours the current k, one iteration's loss on the
    target under it and the switch back (the network a short state returns to). The dwell (adapt.dwell) is the
    mean time between change points of the "now" view, pooled over links, with a prior of `dwell_prior`
    iterations per link before any is seen: a network that flips every iteration or two gives a short dwell, so
    a switch pays only when it also pays on the network the state returns to, while one that holds still makes
    even a costly switch pay.

    A network that changes inside iterations (adapt.replay): T(k) at one average rate is not what a rate that is
    nominal for part of an iteration and 0.05 for the rest does to a schedule. So the controller also rebuilds each
    link's measured rate over the last `replay_window` iterations from the transfers' and all-reduces' spans
    (adapt.rate_timeline: a span's nominal / measured wire ms over its wire time, the change half-way through the gap
    between two spans) and, in a regime where the view "lately" decided at least half of the last replay_window / 2
    decisions and at least `replay_straddled` of the window's iterations (one of the last two among them) held a
    change beyond `change_ratio`, predicts T(k) as the mean iteration of k run back to back under that timeline
    replayed as a bandwidth trace (the expected iteration under the recent rate process, not at its mean rate). The
    replayed T(k) decides only while its forecast error of the k run has been smaller than the views' over the same
    iterations (after two of them), so a process that drifts over many iterations keeps the per-state forecast; it
    switches when the gain over the window's length beats `switch_ms`, with the same bands (not widened by the
    forecast error).

    gain_threshold: the band (a fraction of the fastest k's T) within which predicted times count as equal, so the
        smaller k is taken and the current k kept: what separates a gain from a prediction's error. When the view
        "lately" decides (the network flips faster than the view "now" forecasts it, so T(k) is predicted at a mix
        of rates), the band is at least the controller's measured forecast error of T (`time_error`: |predicted -
        measured| / measured of each iteration's T(k) for the k run, averaged with long_half_life): a gain a
        mixed estimate predicts counts only when it exceeds how far such predictions have missed.
    dwell_prior: before (and beside) the change points seen, each link's state is expected to last this many
        iterations (of the last measured one); it weighs as one observed state per link.
    short_half_life: age (iterations) at which a stage's measured compute weighs half.
    long_half_life: age (iterations) at which a link measurement weighs half in the view of the network "lately".
        Each decision predicts with the view whose estimate of each link's rate was closer to what the next
        iteration measured (errors averaged with this half-life too): after a step change "now" wins, while a
        network that flips faster than k can follow makes "lately" win, so k does not flap.
    change_ratio, confirm, segment_half_life: the view "now" (estimate.SegmentEstimator): each link's rate over
        its transfers since the latest change point. A transfer whose rate differs from the current segment's by
        more than a factor `change_ratio` starts a candidate segment; `confirm` consecutive such transfers that
        agree with each other make it the segment (what came before the change is dropped, so the first decision
        after a step predicts with the new rate, not a mix); a lone outlier is folded back. The segment ages with
        `segment_half_life` (iterations), so a rate that drifts without a step is followed too.
    guide_factors: at construction every candidate k is simulated with all links at each of these factors (and
        at nominal); a decision tries first the two k that this landscape ranks fastest at the estimated slowest
        link's factor (interpolated), so a budget of 2-3 simulations per decision still finds the best k of a
        network it has not seen (predict.Predictor.seed_guide).
    switch_ms: what changing k costs at an iteration boundary (ms); counted against the gain over the dwell.
    factor_step: predictions are memoized on link factors and stage times rounded to a grid of ratio 1 + step.
    reevaluate_change: predictions are redone only when a link's estimated rate (either view) or a stage's
        compute moved by more than this fraction since the last evaluation; otherwise the last evaluation's
        predictions are reused (the rule still runs: the dwell grows with the state's age).
    decision_budget: the share of an iteration a decision may spend simulating: each decision simulates at
        most decision_budget x (last iteration ms) x simulated_events_per_ms / (events per simulation: 2 p m
        compute actions and 2 (p - 1) m transfers) candidates, at least 2 (predict.Predictor.search: the current
        and the last best k, a ladder of k, the best one's neighbours, then the rest; a steady network gets every
        k simulated within a few decisions).
    simulated_events_per_ms: the simulator's speed the budget assumes (a count, not a clock, so every rank fed
        the same observations decides alike; BENCHMARKS.md reports the decision time it gives).
    replay_window, replay_straddled: the replay's window (iterations, >= 2) and how many of its iterations must
        hold a rate change (>= 1).
    replay_budget: the share of an iteration the replay may spend simulating, on average: each decision adds
        replay_budget x (last iteration ms) x simulated_events_per_ms / events per simulation to a credit, a
        simulation under the replayed trace costs adapt.replay.TRACED_COST of them, and a replay runs when the
        credit pays two candidates (the current k first) over the window; between replays the last one's T(k) holds.
    markov_horizon, markov_departures: the next states (adapt.transitions): the controller keeps the network's
        states at iteration boundaries (the view "now"'s factors, a state per set of factors within change_ratio of
        each other) and counts how often each followed each. Once `markov_departures` transitions left the current
        state and the next `markov_horizon` boundaries are expected elsewhere with any weight (the mean of the
        rows of P, ..., P^h, P with a prior of one stay per state), T(k) is the mean over those states of each
        one's T(k) (the current state's at the view "now", another's as last predicted there, memoized: no
        simulation beyond the decision's budget), for the k predicted in every such state: a network that flips
        every iteration or two is met with the k best over both states, not the one best in the state just seen.
        The switch is then taken when the current k is outside the band of the expected fastest and the expected
        gain of one iteration beats switch_ms (no dwell: the expectation holds the states that follow), unless the
        replay decides. markov_horizon 0: off.
    k_choices: the k the controller may pick (None: every k from 1 to m that fits memory).
    initial_k: the k of the first iteration (None: the best k at nominal bandwidth).
    memory_budget_bytes: the most any device may hold at any candidate k (None: each device's memory limit).
    memory_ratio, memory_gain: a k is as good as the fastest k when within gain_threshold of it, or within
        memory_gain when the fastest holds more than memory_ratio x its peak memory (so a k that raises the peak
        by over 20 % must be more than 5 % faster: the memory a run holds is set by the largest k it ever runs).
    """

    gain_threshold: float = 0.02
    short_half_life: float = 0.5
    long_half_life: float = 4.0
    switch_ms: float = 0.0
    factor_step: float = 0.01
    reevaluate_change: float = 0.03
    dwell_prior: float = 8.0
    memory_ratio: float = 1.2
    memory_gain: float = 0.05
    decision_budget: float = 0.003
    simulated_events_per_ms: float = 800.0
    k_choices: tuple[int, ...] | None = None
    initial_k: int | None = None
    memory_budget_bytes: float | None = None
    change_ratio: float = 1.25
    confirm: int = 2
    segment_half_life: float = 2.0
    guide_factors: tuple[float, ...] = (0.6, 0.35, 0.2, 0.1)
    replay_window: int = 12
    replay_straddled: int = 2
    replay_budget: float = 0.002
    markov_horizon: int = 2
    markov_departures: int = 2

    def __post_init__(self) -> None:
        for name in ("gain_threshold", "switch_ms"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise AdaptError(f"controller {name} must be a finite number >= 0, got {value!r}")
        if not (isinstance(self.change_ratio, (int, float)) and math.isfinite(self.change_ratio) and self.change_ratio > 1):
            raise AdaptError(f"controller change_ratio must be a finite number > 1, got {self.change_ratio!r}")
        integers = (
            ("confirm", 1),
            ("replay_window", 2),
            ("replay_straddled", 1),
            ("markov_horizon", 0),
            ("markov_departures", 1),
        )
        for name, least in integers:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise AdaptError(f"controller {name} must be an integer >= {least}, got {value!r}")
        for f in self.guide_factors:
            if not (isinstance(f, (int, float)) and math.isfinite(f) and 0 < f <= 1):
                raise AdaptError(f"controller guide_factors must lie in (0, 1], got {f!r}")
        for name in (
            "segment_half_life",
            "dwell_prior",
            "memory_ratio",
            "memory_gain",
            "short_half_life",
            "long_half_life",
            "factor_step",
            "reevaluate_change",
            "decision_budget",
            "simulated_events_per_ms",
            "replay_budget",
        ):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise AdaptError(f"controller {name} must be a finite number > 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class Decision:
    """The controller's choice for one iteration and why.

    `iteration`: the iteration that runs with `k`; `view`: the estimate the prediction used ("now": since the
    latest change point, "lately": long half-life); `factors` / `bandwidth_gb_per_s`: each measured link's rate
    under that view (as a factor of nominal, and in GB/s); `predicted_ms`: T(k) of every candidate simulated under
    it (when the reason names the replayed window, adapt.replay: T(k) of the candidates replayed under it);
    `forecast_error`: each view's mean error (|log| of the factor ratio) against what the following iterations
    measured; `peak_bytes`: each candidate's largest
    per-device peak; `memory_limit_bytes`: the smallest device limit; `evaluated`: False when the estimates had
    not moved and the last evaluation's predictions were reused; `decision_ms`: wall time spent deciding.
    """

    iteration: int
    k_before: int
    k: int
    reason: str
    view: str
    factors: dict[Link, float]
    bandwidth_gb_per_s: dict[Link, float]
    predicted_ms: dict[int, float]
    forecast_error: dict[str, float]
    peak_bytes: dict[int, float]
    memory_limit_bytes: float
    evaluated: bool = True
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
            "view": self.view,
            "factors": {f"{a}->{b}": f for (a, b), f in self.factors.items()},
            "bandwidth_gb_per_s": {f"{a}->{b}": g for (a, b), g in self.bandwidth_gb_per_s.items()},
            "predicted_ms": {str(k): t for k, t in self.predicted_ms.items()},
            "forecast_error": dict(self.forecast_error),
            "peak_bytes": {str(k): b for k, b in self.peak_bytes.items()},
            "memory_limit_bytes": self.memory_limit_bytes,
            "evaluated": self.evaluated,
        }
        if timing:
            obj["decision_ms"] = self.decision_ms
        return obj
