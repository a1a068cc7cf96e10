"""T(k) under the network's recent process: the window's measured rate timeline replayed, and when to trust it."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

from pipeplan.adapt.decision import ControllerConfig
from pipeplan.adapt.estimate import Sample
from pipeplan.adapt.predict import Compute, Predictor
from pipeplan.adapt.rate_timeline import RateTimeline

COPIES = 3
"""The window's timeline is replayed this many times back to back (a run that starts late in it goes on in the next)."""
TRACED_COST = 3.0
"""A simulation under the replayed trace counts as this many of decision_budget's simulations (measured: 2-4x the
CPU of one at constant rates, the trace's steps re-timing every transfer)."""


class ProcessReplay:
    """Predicts T(k) as the mean iteration of kFkB run back to back under the last `replay_window` iterations' measured
    rates (adapt.rate_timeline), for a network whose rate changes inside iterations (ControllerConfig's docstring).

    A regime: at least half of the last replay_window / 2 decisions predicted with the view "lately", at least
    `replay_straddled` of the window's iterations (and one of the last two) saw a link's rate change by more than
    change_ratio inside them, and the window holds replay_window / 2 iterations or more. In a regime it replays when
    its credit pays two candidates over the window (each decision adds `replay_budget` of the last iteration in
    simulations, a traced one counted TRACED_COST times; a candidate costs one per iteration it runs), otherwise it
    holds the last replay's T(k) (a replay that lacks the current k is redone). Its T(k) decides only while its
    forecast error of the k run (|log predicted / measured|, averaged with the views' half-life) is below that of the
    views' T(k) over the same iterations, after two of them: a process that drifts over many iterations keeps the
    per-state forecast.
    """

    def __init__(self, config: ControllerConfig, predictor: Predictor, error_weight: float) -> None:
        self.config = config
        self.predictor = predictor
        self.timeline = RateTimeline(config.replay_window, 1.0 + config.reevaluate_change)
        self._views: deque[str] = deque(maxlen=max(1, config.replay_window // 2))
        self._weight = error_weight
        self._credit = 0.0
        self._held: dict[int, float] | None = None  # the T(k) the last decision held (replayed now or before)
        self._best = 0  # the fastest k of the last replay (0: none yet)
        self.error = 0.0  # the replay's forecast error of T(k run)
        self.state_error = 0.0  # the views' over the same iterations
        self.compared = 0

    def observe(self, samples: Sequence[Sample], start_ms: float, end_ms: float) -> None:
        """Keep one ended iteration's samples in the timeline."""
        self.timeline.add_iteration(samples, start_ms, end_ms)

    def score(self, k: int, state_ms: float, measured_ms: float) -> None:
        """After an iteration ran with k: the replay's and the views' forecast errors of its time, when the decision
        held a replayed T(k)."""
        held = self._held
        if held is None or k not in held or measured_ms <= 0:
            return
        w = self._weight
        self.error += w * (abs(math.log(held[k] / measured_ms)) - self.error)
        self.state_error += w * (abs(math.log(state_ms / measured_ms)) - self.state_error)
        self.compared += 1

    def predict(
        self, view: str, current: int, state_best: int, share: float, compute: Compute | None
    ) -> tuple[dict[int, float] | None, bool]:
        """(the replayed T(k), whether it decides): None outside a regime; the T(k) also when it does not decide
        yet (its forecast error is being measured)."""
        cfg = self.config
        self._credit = min(self._credit + cfg.replay_budget / cfg.decision_budget * share / TRACED_COST, 8.0 * cfg.replay_window)
        self._views.append(view)
        timeline = self.timeline
        held = len(timeline.bounds())
        if held < max(2, cfg.replay_window // 2) or 2 * sum(v == "lately" for v in self._views) < len(self._views):
            self._held = None
            return None, False
        if self._held is None and self._credit < 2 * held:
            return None, False  # no replay held nor payable: the straddle test could change nothing, so it is not read
        if timeline.straddled(cfg.change_ratio) < cfg.replay_straddled or timeline.straddled(cfg.change_ratio, 2) < 1:
            self._held = None
            return None, False
        if self._held is None or current not in self._held or self._credit >= 2 * held:
            self._held = self._replay(current, state_best, held, compute)
        decides = self.compared >= 2 and self.error < self.state_error
        return self._held, decides

    def _replay(self, current: int, state_best: int, held: int, compute: Compute | None) -> dict[int, float]:
        """Replay the window for the candidates its credit pays for: the current k, the last replay's best, the views'
        best, the start-up landscape's best at the window's slowest and fastest rates, the last best's neighbours."""
        trace, length = self.timeline.replay(COPIES)
        schedules = self.predictor.schedules
        steps = self.timeline.steps()
        slow = {link: min(f for _, f in series) for link, series in steps.items()}
        fast = {link: max(f for _, f in series) for link, series in steps.items()}
        near = self._best or current
        ranked = self.predictor.ranked
        order = [current, near, state_best, *ranked(slow)[:1], near - 1, near + 1, *ranked(fast)[:1]]
        order = [k for k in dict.fromkeys(order) if k in schedules]
        spent = self.predictor.simulations
        paid = order[: max(2, int(self._credit // held))]
        found = {k: self.predictor.replayed_run(k, trace, 0.0, length, compute) for k in paid}
        self._credit -= self.predictor.simulations - spent
        self._best = min(found, key=lambda k: (found[k], k))
        return found
