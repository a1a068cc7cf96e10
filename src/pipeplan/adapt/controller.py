"""The Ada-Grouper controller: observe an iteration, estimate the links, predict T(k) by simulation, switch k or stay."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

from pipeplan.adapt.budget import check_budget
from pipeplan.adapt.decision import ControllerConfig, Decision
from pipeplan.adapt.dwell import expected_dwell_ms
from pipeplan.adapt.estimate import ComputeEstimator, LinkEstimator, SegmentEstimator, collective_samples, wire_samples
from pipeplan.adapt.observation import IterationObservation, Link
from pipeplan.adapt.pipeline import PipelineModel
from pipeplan.adapt.predict import Predictor, fitting_ks
from pipeplan.adapt.replay import ProcessReplay
from pipeplan.adapt.transitions import StateChain
from pipeplan.core.errors import AdaptError
from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace
from pipeplan.core.plan import Plan
from pipeplan.sim.cost.model import CostModel

GIB = float(1 << 30)


class AdaptiveController:
    """Chooses kFkB's k at every iteration boundary from what the iterations measured.

    Use: build it (`from_plan` or `from_measurements`), run the first iteration
    with `controller.k`, then after each iteration call `step(observation)`
    and run the next one with the returned decision's k. The same
    observations give the same decisions (no clock or randomness steers it),
    so every rank of a job can run its own copy and switch at the same iteration.

    Each decision: estimate every link's rate since its latest change point
    ("now") and over a long half-life ("lately"), and each stage's compute;
    take the view whose estimates came closer to what the following
    iterations measured; simulate the next iteration under it for the k that
    fit memory (k = 1..k_max, sim.engine, memoized; the k a precomputed
    landscape ranks fastest first, within a simulation budget); then the rule
    of ControllerConfig: the smallest k near the fastest, reached only when
    the switch pays over the current network state's expected remaining
    dwell (adapt.dwell). When no estimate moved by more than
    `reevaluate_change` since the last evaluation, its predictions are reused.
    """

    def __init__(self, pipeline: PipelineModel, config: ControllerConfig | None = None) -> None:
        self.pipeline = pipeline
        self.config = config or ControllerConfig()
        self.memory_budget_bytes = self.config.memory_budget_bytes
        if self.memory_budget_bytes is not None:  # a budget below 1F1B's peak: refused, naming both (adapt.budget)
            check_budget(pipeline, self.memory_budget_bytes)
        schedules, peaks = fitting_ks(pipeline, self.memory_budget_bytes)
        if not schedules:
            raise AdaptError(_no_fit(pipeline, peaks[1]))
        if self.config.k_choices is not None:
            wanted = set(self.config.k_choices)
            outside = sorted(wanted - set(schedules))
            if outside:
                raise AdaptError(
                    f"k_choices holds k={outside[0]}, which does not fit memory (or the budget) or exceeds "
                    f"m={pipeline.microbatches} (k_max {max(schedules)})"
                )
            schedules = {k: s for k, s in schedules.items() if k in wanted}
        self.k_max = max(schedules)
        self.peak_bytes = {k: max(peaks[k]) for k in schedules}
        self.predictor = Predictor(pipeline, schedules, self.config.factor_step)
        self.predictor.seed_guide(self.config.guide_factors)
        stages = pipeline.costs.stages
        cfg = self.config
        self.views: dict[str, LinkEstimator | SegmentEstimator] = {
            "now": SegmentEstimator(cfg.change_ratio, cfg.segment_half_life, cfg.confirm),
            "lately": LinkEstimator(cfg.long_half_life),
        }
        self.forecast_error = dict.fromkeys(self.views, 0.0)
        self._error_weight = 1.0 - 2.0 ** (-1.0 / self.config.long_half_life)
        self.replay = ProcessReplay(self.config, self.predictor, self._error_weight)
        self.chain = StateChain(cfg.change_ratio)
        self._state_predicted: dict[int, float] = {}  # the last decision's T(k) under the views (time_error's forecast)
        self._replaying = False  # the decision predicts with the replayed window (adapt.replay)
        self.compute = ComputeEstimator([c.fwd_ms for c in stages], [c.bwd_ms for c in stages], self.config.short_half_life)
        self.decisions: list[Decision] = []
        self._evaluated: tuple[Any, ...] | None = None  # (view, both views' factors, stage times, predictions) of the last
        self._iteration_ms = 0.0  # the last observed iteration (the decision budget's measure)
        self.time_error = 0.0  # |predicted - measured| / measured of T(k) run, averaged with long_half_life
        self.k = self.config.initial_k if self.config.initial_k is not None else min(schedules)
        if self.k not in schedules:
            raise AdaptError(f"initial_k {self.k} is not a candidate (k that fit memory: 1..{self.k_max})")
        self._best = self.k  # the best k of the last evaluation: searched first next time
        self._simulated = 0  # the predictor's simulations when the decision began (the budget's count)
        self._mixed = False  # the decision predicts with "lately", a mix of states: its gains must beat time_error
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
        """Predicted ms of the next iteration with `k` under `factors` (default: the "now" view's estimate)."""
        if k not in self.predictor.schedules:
            raise AdaptError(f"k={k} is not a candidate (k that fit memory: {list(self.k_choices)})")
        rates = self.views["now"].factors() if factors is None else factors
        return self.predictor.time(k, rates, self._compute())

    def observe(self, observation: IterationObservation) -> None:
        """Take in one finished iteration's measurements.

        Raises:
            AdaptError: per-stage values for another number of stages, a transfer on a link the pipeline does not use,
                or a collective of a stage it does not have.
        """
        p = self.pipeline.num_stages
        if observation.stage_fwd_ms and len(observation.stage_fwd_ms) != p:
            raise AdaptError(f"observation has {len(observation.stage_fwd_ms)} stage times for a {p}-stage pipeline")
        samples = wire_samples(self.pipeline, observation.transfers)
        samples += collective_samples(self.pipeline, observation.collectives)  # the rings' links no transfer uses
        measured = LinkEstimator.of(samples)
        if measured:
            w = self._error_weight
            for view, estimator in self.views.items():
                forecast = estimator.factors()
                error = sum(abs(math.log(f / forecast.get(link, 1.0))) for link, f in measured.items()) / len(measured)
                self.forecast_error[view] = (1 - w) * self.forecast_error[view] + w * error
        for estimator in self.views.values():
            estimator.add_iteration(samples, observation.end_ms, observation.iteration_ms)
        self.replay.observe(samples, observation.start_ms, observation.end_ms)
        self.chain.observe(self.views["now"].factors())
        self.compute.add_iteration(observation.stage_fwd_ms, observation.stage_bwd_ms)
        self._iteration_ms = observation.iteration_ms

    def budget(self) -> int:
        """Simulations the next decision may run (ControllerConfig.decision_budget)."""
        return max(2, int(self._share()))

    def _share(self) -> float:
        """decision_budget's worth of simulations of the last iteration (unrounded)."""
        reference = self._iteration_ms or self.predictor.time(self.k, {}, self._compute())
        p, m = self.pipeline.num_stages, self.pipeline.microbatches
        events = 2 * p * m + 2 * (p - 1) * m
        return self.config.decision_budget * reference * self.config.simulated_events_per_ms / events

    def step(self, observation: IterationObservation) -> Decision:
        """observe(observation), then decide the k of iteration observation.index + 1."""
        self.observe(observation)
        return self._decide(observation.index + 1)

    def _compute(self) -> tuple[Sequence[float], Sequence[float]] | None:
        return (self.compute.fwd_ms, self.compute.bwd_ms) if self.compute.measured else None

    def _decide(self, iteration: int, first: bool = False) -> Decision:
        started = time.perf_counter()
        self._simulated = self.predictor.simulations
        ran = self.decisions[-1] if self.decisions else None
        forecast = self._state_predicted
        if not first and ran is not None and self._iteration_ms > 0 and ran.k in forecast:
            miss = abs(forecast[ran.k] - self._iteration_ms) / self._iteration_ms
            self.time_error += self._error_weight * (miss - self.time_error)
            self.replay.score(ran.k, forecast[ran.k], self._iteration_ms)
        factors = {view: estimator.factors() for view, estimator in self.views.items()}
        view = min(self.forecast_error, key=lambda v: (self.forecast_error[v], v != "now"))
        compute = self._compute()
        current = self.k
        state = (view, factors["now"], factors["lately"], tuple(self.compute.fwd_ms + self.compute.bwd_ms))
        last = self._evaluated
        complete = last is not None and len(last[1]) == len(self.predictor.schedules)
        evaluated = first or last is None or not complete or self._moved(last[0], state)
        if evaluated:
            guide = self.predictor.ranked(factors[view])
            key = self.predictor.key(factors[view], compute)
            predicted = self.predictor.search(key, (current, self._best), self.budget(), guide)
        else:
            predicted = last[1]  # type: ignore[index]
        self._state_predicted = state_predicted = predicted
        best = state_best = min(predicted, key=lambda k: (predicted[k], k))
        replayed, self._replaying = (None, False) if first else self.replay.predict(view, current, best, self._share(), compute)
        if self._replaying:
            predicted = replayed  # type: ignore[assignment]
            best = min(predicted, key=lambda k: (predicted[k], k))
            view_text = f"the last {len(self.replay.timeline.bounds())} iterations' measured rates replayed"
        expected = None
        if not first and not self._replaying and self.config.markov_horizon > 0:
            expected = self._expected(current, factors["now"], compute, state_predicted if view == "now" else None)
        if expected is not None:
            predicted, weights = expected
            best = min(predicted, key=lambda k: (predicted[k], k))
        self._mixed = view == "lately" and not self._replaying and expected is None
        target = min(k for k in predicted if self._near(k, best, predicted))  # the least memory among the near ones
        seen = f"the network as measured {view} ({_links_text(self.pipeline, factors[view])})"
        if self._replaying:
            seen = view_text
        if expected is not None:
            seen = f"the next iterations' expected states ({_weights_text(self.pipeline, self.chain, weights)})"
        if first and self.config.initial_k is not None:
            chosen, reason = current, f"start: k={current} as configured (k={best} is the fastest at nominal bandwidth)"
        elif first:
            near = "" if target == best else f", near the fastest k={best} with less memory"
            chosen, reason = target, f"start: k={target} is the fastest at nominal bandwidth ({predicted[target]:.4g} ms{near})"
        elif self._replaying and not self._near(current, best, predicted):
            chosen, reason = self._pays_replayed(current, target, predicted, seen)
        elif expected is not None:
            chosen, reason = self._pays_expected(current, best, target, predicted, seen)
        elif not evaluated and self._near(current, best, predicted):
            chosen = current
            reason = (
                f"stay: k={current}; every link's estimated rate and every stage's compute is within "
                f"{self.config.reevaluate_change:.0%} of the last evaluation's"
            )
        elif best == current:
            chosen, reason = current, f"stay: k={current} is the fastest ({predicted[current]:.4g} ms) under {seen}"
        elif self._near(current, best, predicted):
            chosen = current
            reason = (
                f"stay: k={current} ({predicted[current]:.4g} ms) is within {self._band(current, best):.0%} of the "
                f"fastest k={best} ({predicted[best]:.4g} ms) under {seen}"
            )
        else:
            chosen, reason = self._pays(current, target, predicted, factors[view], seen)
        if evaluated:
            self._best = state_best
            self._evaluated = (state, state_predicted)
        if first and self.config.initial_k is not None:
            self._evaluated = None  # the configured k was not chosen by this evaluation: evaluate again next time
        before = chosen if first else current
        return self._log(iteration, before, chosen, reason, view, factors[view], predicted, started, evaluated)

    def _pays_replayed(self, current: int, target: int, predicted: dict[int, float], seen: str) -> tuple[int, str]:
        """Switch to `target` when what it saves over the replayed window's length (the regime is expected to last
        as long as it has been seen) beats switch_ms."""
        start, end = self.replay.timeline.span_ms()
        gain = predicted[current] - predicted[target]
        saved = (end - start) * gain / predicted[current]
        if saved <= self.config.switch_ms:
            return current, (
                f"stay: k={target} would take {predicted[target]:.4g} ms against {predicted[current]:.4g} ms under {seen}; "
                f"over the window's {end - start:.4g} ms it saves {saved:.4g} ms, not more than the switch's "
                f"{self.config.switch_ms:g} ms"
            )
        return target, (
            f"switch: k={current} -> {target}, predicted {predicted[current]:.4g} -> {predicted[target]:.4g} ms "
            f"({-gain / predicted[current]:+.1%}) under {seen}; saves {saved:.4g} ms over the window's {end - start:.4g} ms"
        )

    def _expected(
        self,
        current: int,
        now: dict[Link, float],
        compute: tuple[Sequence[float], Sequence[float]] | None,
        searched: dict[int, float] | None,
    ) -> tuple[dict[int, float], dict[int, float]] | None:
        """T(k) expected over the states the chain (adapt.transitions) says the next markov_horizon iterations see,
        each state's T(k) simulated at its representative factors (the current state at the "now" view's), for the
        k predicted in every state with weight; None until markov_departures transitions left the current state.
        `searched`: the decision's own predictions when they are the "now" view's (the current state's T(k))."""
        chain = self.chain
        state = chain.current
        if state is None or chain.departures(state) < self.config.markov_departures:
            return None
        weights = {s: w for s, w in chain.next_weights(self.config.markov_horizon).items() if w >= 0.02}
        if set(weights) == {state}:
            return None
        total = sum(weights.values())
        found: dict[int, float] | None = None
        expected: dict[int, float] = {}
        for s in sorted(weights, key=lambda x: (x != state, -weights[x], x)):
            if s != state:  # another state: its T(k) as last predicted there (memoized), no simulation
                times = self.predictor.known(self.predictor.key(chain.representative(s), compute))
            elif searched is not None:
                times = searched
            else:  # the current state at the "now" view: what the views' search left of the budget
                budget = max(0, self.budget() - (self.predictor.simulations - self._simulated))
                key = self.predictor.key(now, compute)
                if budget > 0:
                    times = self.predictor.search(key, (current, self._best), budget, self.predictor.ranked(now))
                else:
                    times = self.predictor.known(key)
            if not times:
                return None
            found = times if found is None else {k: v for k, v in found.items() if k in times}
            for k in found:
                expected[k] = expected.get(k, 0.0) + weights[s] / total * times[k]
        if not found or current not in found:
            return None
        return {k: expected[k] for k in found}, weights

    def _pays_expected(self, current: int, best: int, target: int, predicted: dict[int, float], seen: str) -> tuple[int, str]:
        """Switch to `target` when the current k is not within the band of the expected fastest and the expected
        gain of one iteration beats switch_ms."""
        if self._near(current, best, predicted):
            return current, (
                f"stay: k={current} ({predicted[current]:.4g} ms) is within {self._band(current, best):.0%} of the "
                f"fastest k={best} ({predicted[best]:.4g} ms) expected over {seen}"
            )
        gain = predicted[current] - predicted[target]
        if gain <= self.config.switch_ms:
            return current, (
                f"stay: k={target} would save {gain:.4g} ms expected over {seen}, not more than the switch's "
                f"{self.config.switch_ms:g} ms"
            )
        return target, (
            f"switch: k={current} -> {target}, expected {predicted[current]:.4g} -> {predicted[target]:.4g} ms "
            f"({-gain / predicted[current]:+.1%}) over {seen}"
        )

    def _near(self, k: int, best: int, predicted: dict[int, float]) -> bool:
        """True when k is as good as the fastest: within gain_threshold of it, or within memory_gain when the
        fastest holds more than memory_ratio x k's peak memory."""
        return predicted[k] <= predicted[best] * (1 + self._band(k, best))

    def _band(self, k: int, best: int) -> float:
        """memory_gain when `best` holds more than memory_ratio x k's peak memory, else gain_threshold."""
        cfg = self.config
        dearer = self.peak_bytes[best] > cfg.memory_ratio * self.peak_bytes[k]
        band = cfg.memory_gain if dearer else cfg.gain_threshold
        return max(band, self.time_error) if self._mixed else band

    def dwell_ms(self) -> float:
        """The expected remaining time of the network's current state (adapt.dwell over the "now" view's change
        points; prior: `dwell_prior` iterations of the current k at nominal bandwidth and the model's compute, one
        state per link)."""
        now = self.views["now"]
        assert isinstance(now, SegmentEstimator)
        reference = self.predictor.guided({}).get(self.k) or self.predictor.time(self.k, {})  # no simulation once seeded
        return expected_dwell_ms(now.durations_ms, now.age_ms(), self.config.dwell_prior * reference, max(1, now.links))

    def _pays(
        self,
        current: int,
        target: int,
        predicted: dict[int, float],
        factors: dict[Link, float],
        seen: str,
    ) -> tuple[int, str]:
        """Switch to `target` when what it saves over the current state's expected remaining dwell beats its cost.

        Saved: dwell x (T(current) - T(target)) / T(current), the time the
        faster k wins while the state lasts. Cost: switch_ms, plus, when the
        network the state returns to (each link at its rate before its latest
        change; T(k) there read off the start-up landscape, predict.Predictor.guided)
        favours the current k, the iteration run on `target` there before the
        controller can turn back, and that switch back.
        """
        gain = predicted[current] - predicted[target]
        dwell = self.dwell_ms()
        saved = dwell * gain / predicted[current]
        cost = self.config.switch_ms
        back = 0.0
        before = self.views["now"].previous_factors()  # type: ignore[union-attr]
        if saved > cost and self.predictor.key(before) != self.predictor.key(factors):
            landscape = self.predictor.guided(before)  # no simulation: the decision's budget is the search's
            after = landscape[target] - landscape[current] if landscape else 0.0
            if after > 0:
                back = after + self.config.switch_ms
        cost += back
        if saved <= cost:
            turn = f" and {back:.4g} ms to turn back once it ends (the network before the change favours k={current})"
            return current, (
                f"stay: k={target} would take {predicted[target]:.4g} ms against {predicted[current]:.4g} ms under {seen}; "
                f"over the state's expected {dwell:.4g} ms more it saves {saved:.4g} ms, not more than the switch's "
                f"{self.config.switch_ms:g} ms{turn if back else ''}"
            )
        return target, (
            f"switch: k={current} -> {target}, predicted {predicted[current]:.4g} -> {predicted[target]:.4g} ms "
            f"({-gain / predicted[current]:+.1%}) under {seen}; saves {saved:.4g} ms over the state's expected "
            f"{dwell:.4g} ms, against {cost:.4g} ms of switching"
        )

    def _moved(self, before: tuple[Any, ...], now: tuple[Any, ...]) -> bool:
        """True when the view changed, or a link factor (either view) or stage time moved by more than
        reevaluate_change (relative) since `before`."""
        if before[0] != now[0]:
            return True
        limit = self.config.reevaluate_change
        pairs = [
            (b.get(link, 1.0), n.get(link, 1.0))
            for b, n in zip(before[1:3], now[1:3], strict=True)
            for link in b.keys() | n.keys()
        ]
        pairs += list(zip(before[3], now[3], strict=True))
        return any(abs(new - old) > limit * old for old, new in pairs)

    def _log(
        self,
        iteration: int,
        before: int,
        chosen: int,
        reason: str,
        view: str,
        factors: dict[Link, float],
        predicted: dict[int, float],
        started: float,
        evaluated: bool = True,
    ) -> Decision:
        self.k = chosen
        decision = Decision(
            iteration,
            before,
            chosen,
            reason,
            view,
            factors,
            {link: f * self.pipeline.nominal_gb_per_s(link) for link, f in factors.items()},
            predicted,
            dict(self.forecast_error),
            dict(self.peak_bytes),
            min(self.pipeline.memory_limit_bytes),
            evaluated,
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


def _weights_text(pipeline: PipelineModel, chain: StateChain, weights: dict[int, float]) -> str:
    """Each expected state as 'share x <its slowest link>', heaviest first."""
    order = sorted(weights, key=lambda s: (-weights[s], s))
    return "; ".join(f"{weights[s]:.0%} {_links_text(pipeline, chain.representative(s))}" for s in order)


def _no_fit(pipeline: PipelineModel, peaks: tuple[float, ...]) -> str:
    """Why not even k=1 (1F1B) fits: the stage that overflows the most and by how much."""
    over = [need - limit for need, limit in zip(peaks, pipeline.memory_limit_bytes, strict=True)]
    s = max(range(len(over)), key=lambda i: over[i])
    return (
        f"no k fits memory: k=1 (1F1B) needs {peaks[s] / GIB:.2f} GiB on stage {s} "
        f"(limit {pipeline.memory_limit_bytes[s] / GIB:.2f} GiB, {over[s] / GIB:.2f} GiB too much)"
    )
