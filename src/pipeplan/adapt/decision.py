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

    gain_threshold: switch only when the best k is predicted faster than the current one by more than this
        fraction of the current k's time (plus `switch_ms`).
    short_half_life: age (iterations) at which a measurement weighs half, for the view of the network "now".
    long_half_life: the same for the view "lately". Each decision predicts with the view whose estimate of each
        link's rate was closer to what the next iteration measured (errors averaged with this half-life too): after a step change
        "now" wins, while a network that flips faster than k can follow makes "lately" win, so k does not flap.
    switch_ms: what changing k costs at an iteration boundary (ms); counted against the predicted gain.
    factor_step: predictions are memoized on link factors and stage times rounded to a grid of ratio 1 + step.
    reevaluate_change: predictions are redone only when a link's estimated rate (either view) or a stage's
        compute moved by more than this fraction since the last evaluation; otherwise the controller stays at once.
    reversal_window: every switch doubles the threshold of the next ones; after this many iterations without
        a switch the doubling is forgotten when the "now" view decides, and undone one step per such window when
        "lately" decides (the network flips faster than k can follow); a switch that turns back the last one's
        direction (k up, then down again) within this many iterations must gain under the "lately" view too,
        unless the "now" view forecasts at least as well: the hysteresis that keeps a network flipping at about
        the control period from making k flap.
    decision_budget: the share of an iteration a decision may spend simulating: each decision simulates at
        most decision_budget x (last iteration ms) x simulated_events_per_ms / (events per simulation: 2 p m
        compute actions and 2 (p - 1) m transfers) candidates, at least 2 (predict.Predictor.search: the current
        and the last best k, a ladder of k, the best one's neighbours, then the rest; a steady network gets every
        k simulated within a few decisions).
    simulated_events_per_ms: the simulator's speed the budget assumes (a count, not a clock, so every rank fed
        the same observations decides alike; BENCHMARKS.md reports the decision time it gives).
    k_choices: the k the controller may pick (None: every k from 1 to m that fits memory).
    initial_k: the k of the first iteration (None: the best k at nominal bandwidth).
    """

    gain_threshold: float = 0.02
    short_half_life: float = 0.5
    long_half_life: float = 4.0
    switch_ms: float = 0.0
    factor_step: float = 0.01
    reevaluate_change: float = 0.03
    reversal_window: int = 8
    decision_budget: float = 0.003
    simulated_events_per_ms: float = 800.0
    k_choices: tuple[int, ...] | None = None
    initial_k: int | None = None

    def __post_init__(self) -> None:
        for name in ("gain_threshold", "switch_ms"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise AdaptError(f"controller {name} must be a finite number >= 0, got {value!r}")
        if isinstance(self.reversal_window, bool) or not isinstance(self.reversal_window, int) or self.reversal_window < 0:
            raise AdaptError(f"controller reversal_window must be an integer >= 0, got {self.reversal_window!r}")
        for name in (
            "short_half_life",
            "long_half_life",
            "factor_step",
            "reevaluate_change",
            "decision_budget",
            "simulated_events_per_ms",
        ):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise AdaptError(f"controller {name} must be a finite number > 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class Decision:
    """The controller's choice for one iteration and why.

    `iteration`: the iteration that runs with `k`; `view`: the estimate the prediction used ("now": short
    half-life, "lately": long); `factors` / `bandwidth_gb_per_s`: each measured link's rate under that view (as
    a factor of nominal, and in GB/s); `predicted_ms`: T(k) of every candidate simulated under it;
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
