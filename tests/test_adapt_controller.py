"""adapt.controller, adapt.estimate, adapt.predict: estimates, T(k) by simulation, memory, and the switching rule."""

from __future__ import annotations

import pytest

from adapt_cases import RING_FACTOR, bert_plan, numbers, replicated_plan
from pipeplan.adapt import AdaptiveController, ControllerConfig, IterationObservation, PipelineModel, Transfer
from pipeplan.adapt.estimate import LinkEstimator, wire_samples
from pipeplan.adapt.predict import Predictor, fitting_ks
from pipeplan.adapt.replay import ProcessReplay
from pipeplan.adapt.runs import run_controller
from pipeplan.core.errors import AdaptError
from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace, TraceStep
from pipeplan.schedules import make_schedule
from pipeplan.sim import simulate
from pipeplan.sim.cost.plan_costs import plan_costs


def _slow(index: int, k: int, factor: float, links: tuple[tuple[int, int], ...] = ((1, 2), (2, 1))) -> IterationObservation:
    """An iteration of 100 ms whose links moved 1 MB per transfer at `factor` x 1 GB/s, 8 transfers each."""
    transfers = tuple(
        Transfer(link, 1e6, 100.0 * index + 10 * i, 100.0 * index + 10 * i + 1.0 / factor) for link in links for i in range(8)
    )
    return IterationObservation(index, k, 100.0, transfers=transfers, start_ms=100.0 * index)


def test_k1_predicts_1f1b_and_k_m_predicts_gpipe() -> None:
    """T(1) is the 1F1B simulation and T(m) the GPipe one, to the bit (the same simulator, the same costs)."""
    pipeline = PipelineModel.from_measurements(**numbers(p=4, m=16))
    schedules, _ = fitting_ks(pipeline)
    predictor = Predictor(pipeline, schedules)
    for name, k in (("1f1b", 1), ("gpipe", 16)):
        expected = simulate(make_schedule(name, 4, 16), pipeline.costs).iteration_time
        assert predictor.time(k, {}) == expected
    assert (predictor.time(1, {}), predictor.time(2, {})) == (85.0, 63.0)  # issue 20's measurement


def test_a_factor_scales_its_links_wire_time_in_the_prediction() -> None:
    """T(k) under factor 0.5 on every link equals the simulation with 2 ms transfers; the memo answers the repeat."""
    pipeline = PipelineModel.from_measurements(**numbers(p=4, m=16))
    slow = PipelineModel.from_measurements(**numbers(p=4, m=16, gb_per_s=0.5))
    schedules, _ = fitting_ks(pipeline)
    predictor = Predictor(pipeline, schedules)
    half = dict.fromkeys(pipeline.links, 0.5)  # rounded to 1.01^-70 = 0.4984: within 0.5 %
    assert predictor.time(3, half) == pytest.approx(simulate(schedules[3], slow.costs).iteration_time, rel=0.005)
    before = predictor.simulations
    predictor.time(3, half)
    assert predictor.simulations == before


def test_memory_limits_k_to_the_warm_up_that_fits() -> None:
    """Stage 0 holds min(k p, m) microbatches: with room for 8, k_max is 2 on 4 stages, and the peaks say so."""
    pipeline = PipelineModel.from_measurements(**numbers(p=4, m=16, activation_bytes=1e9, limit=8.5e9))
    schedules, peaks = fitting_ks(pipeline)
    assert sorted(schedules) == [1, 2]
    assert peaks[1][0] == 4e9 and peaks[2][0] == 8e9 and peaks[3][0] == 12e9
    assert peaks[2] == tuple(min(2 * (4 - r), 16) * 1e9 for r in range(4))


def test_plan_controller_memory_matches_the_simulators_memory() -> None:
    """On a real plan, each candidate's peak is the simulated peak memory of that kFkB schedule."""
    plan, model = bert_plan()
    controller = AdaptiveController.from_plan(plan, model)
    costs = plan_costs(plan, model)
    for k in (1, 2, controller.k_max):
        result = simulate(make_schedule("kfkb", 4, plan.microbatches, k=k), costs)
        assert controller.peak_bytes[k] == max(r.peak_memory_bytes for r in result.per_rank)


def test_link_estimate_is_the_ratio_of_nominal_to_measured_wire_time() -> None:
    """Transfers at a constant rate give that rate's factor; queued transfers count from the link's free time."""
    pipeline = PipelineModel.from_measurements(**numbers(p=2, m=4))
    queued = (Transfer((0, 1), 1e6, 0.0, 4.0), Transfer((0, 1), 1e6, 1.0, 8.0))  # the second waits until 4
    samples = wire_samples(pipeline, queued)
    assert [(s[1], s[2]) for s in samples] == [(1.0, 4.0), (1.0, 4.0)]
    estimator = LinkEstimator(half_life=1.0)
    estimator.add_iteration(samples, 10.0, 10.0)
    assert estimator.factors() == {(0, 1): 0.25}


def test_older_measurements_weigh_less() -> None:
    """After a slow iteration and a fast one, the short half-life's estimate lies nearer the fast rate than the long's."""
    pipeline = PipelineModel.from_measurements(**numbers(p=4, m=16))
    short, long = LinkEstimator(0.5), LinkEstimator(4.0)
    for index, factor in ((0, 0.25), (1, 1.0)):
        obs = _slow(index, 1, factor)
        for estimator in (short, long):
            estimator.add_iteration(wire_samples(pipeline, obs.transfers), obs.end_ms, obs.iteration_ms)
    assert 0.25 < long.factors()[(1, 2)] < short.factors()[(1, 2)] < 1.0


def test_controller_starts_at_the_best_k_and_stays_while_nothing_moves() -> None:
    """Idle: the best predicted k; an unchanged network is not predicted again; a slower one is."""
    controller = AdaptiveController.from_measurements(**numbers(p=4, m=16, activation_bytes=1e9, limit=8.5e9))
    assert controller.k_choices == (1, 2)
    assert controller.k == 2 and controller.decisions[0].reason.startswith("start: k=2 is the fastest at nominal")
    steady = controller.step(_slow(0, 2, 1.0))
    assert steady.reason.startswith("stay: k=2; every link's estimated rate") and not steady.evaluated
    slowed = controller.step(_slow(1, 2, 0.25))
    assert slowed.evaluated and slowed.reason.startswith("stay: k=2 is the fastest")


def test_threshold_keeps_k_when_the_gain_is_small() -> None:
    """A gain below gain_threshold is logged with its size and k stays (a configured start is evaluated again)."""
    config = ControllerConfig(gain_threshold=0.5, initial_k=1)
    controller = AdaptiveController.from_measurements(config, **numbers(p=4, m=16))
    assert controller.decisions[0].reason == "start: k=1 as configured (k=2 is the fastest at nominal bandwidth)"
    decision = controller.step(_slow(0, 1, 1.0))
    assert decision.k == 1 and not decision.switched
    assert "stay: k=1 (85 ms) is within 50% of the fastest k=2 (63 ms)" in decision.reason


def test_switches_under_a_sustained_slowdown_and_logs_the_link() -> None:
    """Starting at k=1, a middle link at 0.25 moves k up at the next boundary, naming the link, and onto the fastest
    predicted k once the search has simulated every candidate (2 per decision here); then it stays."""
    config = ControllerConfig(initial_k=1, k_choices=(1, 2, 4))
    controller = AdaptiveController.from_measurements(config, **numbers(p=4, m=16))
    decisions = [controller.step(_slow(i, controller.k, 0.25)) for i in range(4)]
    switch = decisions[0]
    assert switch.switched and switch.k_before == 1 and switch.k > 1
    assert switch.k == min(switch.predicted_ms, key=switch.predicted_ms.__getitem__)
    assert switch.predicted_ms[switch.k] < switch.predicted_ms[1]
    assert "link 1->2 0.25 GB/s (0.25 x nominal)" in switch.reason
    assert switch.to_json()["bandwidth_gb_per_s"]["1->2"] == pytest.approx(0.25)
    settled = decisions[1]
    assert set(settled.predicted_ms) == {1, 2, 4} and settled.k == min(settled.predicted_ms, key=settled.predicted_ms.__getitem__)
    assert not any(d.switched for d in decisions[2:])


def test_an_alternating_network_does_not_make_k_flap() -> None:
    """A link slow one iteration and fast the next: at most two switches in 20 iterations, none after the eighth."""
    controller = AdaptiveController.from_measurements(ControllerConfig(initial_k=1), **numbers(p=4, m=16))
    for i in range(20):
        controller.step(_slow(i, controller.k, 0.2 if i % 2 == 0 else 1.0))
    switched = [d.iteration for d in controller.decisions if d.switched]
    assert len(switched) <= 2 and max(switched) <= 8


def test_the_view_that_forecast_better_decides() -> None:
    """After a lasting step change the short view forecasts better; on an alternating network the long one does."""
    step = AdaptiveController.from_measurements(**numbers(p=4, m=16))
    for i in range(6):
        step.step(_slow(i, step.k, 1.0 if i < 2 else 0.3))
    assert step.decisions[-1].view == "now"
    alternating = AdaptiveController.from_measurements(**numbers(p=4, m=16))
    for i in range(12):
        alternating.step(_slow(i, alternating.k, 0.2 if i % 2 == 0 else 1.0))
    assert alternating.decisions[-1].view == "lately"
    assert alternating.forecast_error["lately"] < alternating.forecast_error["now"]


def test_a_decision_simulates_within_its_budget() -> None:
    """The budget grows with the iteration it is a share of; a search never runs more simulations than allowed."""
    controller = AdaptiveController.from_measurements(**numbers(p=4, m=16))
    events = 2 * 4 * 16 + 2 * 3 * 16
    controller.observe(_slow(0, controller.k, 0.5))
    assert controller.budget() == max(2, int(0.003 * 100.0 * 800.0 / events))
    before = controller.predictor.simulations
    controller.step(_slow(1, controller.k, 0.3))
    assert controller.predictor.simulations - before <= controller.budget()


def test_same_observations_give_the_same_decisions() -> None:
    """Two controllers fed the same iterations decide alike (ranks may each run their own)."""
    runs = []
    for _ in range(2):
        controller = AdaptiveController.from_measurements(**numbers(p=4, m=16))
        runs.append([controller.step(_slow(i, controller.k, 0.3 + 0.1 * (i % 3))).to_json() for i in range(6)])
    assert runs[0] == runs[1]


def test_config_and_observation_errors() -> None:
    """Bad constants, an unknown k and observations of another pipeline are AdaptErrors naming the value."""
    with pytest.raises(AdaptError, match=r"gain_threshold must be a finite number >= 0, got -0.1"):
        ControllerConfig(gain_threshold=-0.1)
    with pytest.raises(AdaptError, match=r"short_half_life must be a finite number > 0, got 0"):
        ControllerConfig(short_half_life=0)
    tight = numbers(p=4, m=16, activation_bytes=1e9, limit=8.5e9)
    with pytest.raises(AdaptError, match=r"k_choices holds k=4, which does not fit memory"):
        AdaptiveController.from_measurements(ControllerConfig(k_choices=(1, 4)), **tight)
    with pytest.raises(AdaptError, match=r"no k fits memory: k=1 \(1F1B\) needs 3.73 GiB on stage 0"):
        AdaptiveController.from_measurements(**numbers(p=4, m=16, activation_bytes=1e9, limit=3e9))
    controller = AdaptiveController.from_measurements(**numbers(p=4, m=16))
    with pytest.raises(AdaptError, match=r"observation has 2 stage times for a 4-stage pipeline"):
        controller.observe(IterationObservation(0, 1, 10.0, (1.0, 1.0), (2.0, 2.0)))
    with pytest.raises(AdaptError, match=r"link \[7, 8\]: no stage boundary"):
        controller.observe(IterationObservation(0, 1, 10.0, transfers=(Transfer((7, 8), 1.0, 0.0, 1.0),)))


def test_repeated_searches_in_one_state_cover_every_k_within_their_budgets() -> None:
    """Each search spends at most its budget; searches in the same rounded state go on until every k is simulated."""
    pipeline = PipelineModel.from_measurements(**numbers(p=4, m=16))
    schedules, _ = fitting_ks(pipeline)
    predictor = Predictor(pipeline, schedules)
    key = predictor.key({(1, 2): 0.3})
    seen: dict[int, float] = {}
    for _ in range(16):
        before = predictor.simulations
        seen = predictor.search(key, (1,), budget=3)
        assert predictor.simulations - before <= 3
    assert sorted(seen) == list(range(1, 17))
    assert seen == predictor.times({(1, 2): 0.3})


def test_a_slower_all_reduce_ring_is_predicted_after_observing_it() -> None:
    """A trace on a link only stage 0's all-reduce uses slows the simulated iteration; once the controller has
    observed an iteration (its Collective), its T(k) equals the simulator's under the same trace to 1e-9, for every
    k tried, where before it predicted the nominal all-reduce."""
    plan, model = replicated_plan()
    pipeline = PipelineModel.from_plan(plan, model)
    ring = pipeline.ring_links[0]
    assert ring == ((4, 5), (5, 4)) and not set(ring) & set(pipeline.links) and set(ring) <= set(pipeline.traffic_links)
    trace = BandwidthTrace(tuple(TraceStep(0.0, link, RING_FACTOR) for link in ring))
    schedule = make_schedule("1f1b", 4, 16)
    assert simulate(schedule, pipeline.costs, trace).iteration_time > simulate(schedule, pipeline.costs).iteration_time
    controller = AdaptiveController(pipeline)
    nominal = controller.predictor.time(1, controller.views["now"].factors())
    assert nominal == simulate(schedule, pipeline.costs).iteration_time
    run_controller(controller, trace, 2)
    factors = controller.views["now"].factors()
    assert factors[(4, 5)] == pytest.approx(RING_FACTOR, rel=1e-12) and factors[(6, 7)] == pytest.approx(1.0, rel=1e-12)
    for k in (1, 2, 3, 4):
        truth = simulate(make_schedule("kfkb", 4, 16, k=k), pipeline.costs, trace).iteration_time
        assert controller.predictor.time(k, factors) == pytest.approx(truth, rel=1e-9, abs=0)
    assert controller.decisions[-1].bandwidth_gb_per_s[(4, 5)] == pytest.approx(
        RING_FACTOR * pipeline.nominal_gb_per_s((4, 5)), rel=1e-12
    )


def test_a_switch_pays_when_its_gain_over_the_expected_dwell_beats_its_cost() -> None:
    """Every link at 0.25 and no change point seen: the dwell is the prior (8 nominal iterations of the current k)
    less the state's age (96 ms since the first transfer ended); a switch gaining 50 ms per iteration is made
    against a switch_ms of 60 ms, as dwell x gain / T exceeds it, and refused against 200 ms."""
    links = ((0, 1), (1, 0), (1, 2), (2, 1), (2, 3), (3, 2))
    cheap = AdaptiveController.from_measurements(
        ControllerConfig(initial_k=1, k_choices=(1, 4), switch_ms=60.0), **numbers(p=4, m=16)
    )
    decision = cheap.step(_slow(0, 1, 0.25, links=links))
    t1, t4 = decision.predicted_ms[1], decision.predicted_ms[4]
    assert 49.0 < t1 - t4 < 60.0 and decision.switched and decision.k == 4
    dwell = 8.0 * cheap.predictor.time(1, {}) - 96.0
    assert f"saves {dwell * (t1 - t4) / t1:.4g} ms over the state's expected {dwell:.4g} ms" in decision.reason
    assert cheap.dwell_ms() == pytest.approx(8.0 * cheap.predictor.time(4, {}) - 96.0)  # the prior follows the current k
    dear = AdaptiveController.from_measurements(
        ControllerConfig(initial_k=1, k_choices=(1, 4), switch_ms=200.0), **numbers(p=4, m=16)
    )
    refused = dear.step(_slow(0, 1, 0.25, links=links))
    assert not refused.switched and "not more than the switch's 200 ms" in refused.reason


def test_the_smaller_k_is_taken_among_those_within_the_threshold() -> None:
    """At nominal bandwidth T(1) = 85 ms and T(2) = 63 ms: a 40 % threshold starts at k=1 (85 <= 1.4 x 63), 30 % at 2."""
    wide = AdaptiveController.from_measurements(ControllerConfig(gain_threshold=0.4), **numbers(p=4, m=16))
    assert wide.k == 1 and wide.decisions[0].reason.endswith("near the fastest k=2 with less memory)")
    assert AdaptiveController.from_measurements(ControllerConfig(gain_threshold=0.3), **numbers(p=4, m=16)).k == 2


def test_a_k_holding_much_more_memory_must_gain_memory_gain() -> None:
    """k=2 holds twice k=1's activations (over memory_ratio 1.2): it must be faster by memory_gain, not gain_threshold."""
    case = numbers(p=4, m=16, activation_bytes=1e9)
    lenient = AdaptiveController.from_measurements(ControllerConfig(gain_threshold=0.0, memory_gain=0.4), **case)
    assert lenient.peak_bytes[2] > 1.2 * lenient.peak_bytes[1] and lenient.k == 1
    assert AdaptiveController.from_measurements(ControllerConfig(gain_threshold=0.0, memory_gain=0.3), **case).k == 2
    roomy = AdaptiveController.from_measurements(ControllerConfig(gain_threshold=0.0, memory_gain=0.4, memory_ratio=3.0), **case)
    assert roomy.k == 2


def test_a_mixed_estimate_must_beat_the_measured_forecast_error() -> None:
    """While "lately" decides, the band is at least time_error (the relative miss of the T it forecast for the k
    run, averaged with long_half_life): here every iteration measured 100 ms against its forecast. (The next states'
    expectation is off: it decides in this network, with the band of a single state.)"""
    controller = AdaptiveController.from_measurements(ControllerConfig(markov_horizon=0), **numbers(p=4, m=16))
    for i in range(12):
        controller.step(_slow(i, controller.k, 0.2 if i % 2 == 0 else 1.0))
    weight = 1.0 - 2.0 ** (-1.0 / 4.0)
    expected = 0.0
    for d in controller.decisions[:-1]:
        expected += weight * (abs(d.predicted_ms[d.k] - 100.0) / 100.0 - expected)
    assert controller.time_error == pytest.approx(expected) and controller.time_error > 0.02
    assert controller.decisions[-1].view == "lately" and controller._band(1, 2) == controller.time_error


def test_replay_constants_are_checked() -> None:
    """The replay's window, straddle count and budget are refused out of range, naming the field and the value."""
    with pytest.raises(AdaptError, match=r"controller replay_window must be an integer >= 2, got 1"):
        ControllerConfig(replay_window=1)
    with pytest.raises(AdaptError, match=r"controller replay_straddled must be an integer >= 1, got 0"):
        ControllerConfig(replay_straddled=0)
    with pytest.raises(AdaptError, match=r"controller replay_budget must be a finite number > 0, got 0"):
        ControllerConfig(replay_budget=0)


def test_a_replayed_run_under_a_constant_rate_is_one_iteration_of_that_rate() -> None:
    """Under a trace that holds every link at 0.5 from 0, k run back to back over 2.5 iterations' length takes, per
    iteration, exactly the simulator's one iteration at 0.5 (the last half iteration counted by its share)."""
    pipeline = PipelineModel.from_measurements(**numbers(p=4, m=8))
    schedules, _ = fitting_ks(pipeline)
    predictor = Predictor(pipeline, schedules)
    trace = BandwidthTrace(tuple(TraceStep(0.0, link, 0.5) for link in pipeline.traffic_links))
    for k in (1, 2, 4):
        one = simulate(schedules[k], pipeline.costs, trace, record=False).iteration_time
        assert predictor.replayed_run(k, trace, 0.0, 2.5 * one) == pytest.approx(one, rel=1e-12)


def _flipping(index: int, k: int) -> IterationObservation:
    """An iteration of 180 ms whose links moved 1 MB at 1 GB/s in their first four transfers and at 0.05 of it in the
    last four (one every 20 ms)."""
    links = ((1, 2), (2, 1))
    transfers = []
    for link in links:
        for i in range(8):
            start = 180.0 * index + 20 * i
            transfers.append(Transfer(link, 1e6, start, start + (1.0 if i < 4 else 20.0)))
    return IterationObservation(index, k, 180.0, transfers=tuple(transfers), start_ms=180.0 * index)


def test_inside_iteration_changes_hold_a_replay_of_the_window() -> None:
    """Every iteration straddles a change and "lately" decides: the controller holds a replay and scores it against
    the views' forecast; a replay paid in full holds, for each candidate, k run back to back over the window's length
    under its timeline replayed (Predictor.replayed_run, to the bit)."""
    config = ControllerConfig(initial_k=1, replay_window=4, replay_budget=0.5)
    controller = AdaptiveController.from_measurements(config, **numbers(p=4, m=16))
    for i in range(10):
        controller.step(_flipping(i, controller.k))
    assert controller.decisions[-1].view == "lately"
    assert controller.replay.compared >= 1
    replay = ProcessReplay(ControllerConfig(replay_window=4, replay_budget=1e3), controller.predictor, 0.5)
    for i in range(4):
        observation = _flipping(i, 1)
        replay.observe(wire_samples(controller.pipeline, observation.transfers), observation.start_ms, observation.end_ms)
        held, decides = replay.predict("lately", 1, 1, 10.0, None)
    assert held is not None and not decides  # nothing scored yet
    trace, length = replay.timeline.replay(3)
    assert length == 720.0
    for k, value in held.items():
        assert value == controller.predictor.replayed_run(k, trace, 0.0, length, None)


def test_a_network_that_flips_every_iteration_is_met_with_the_expected_t_over_its_next_states() -> None:
    """Slow (0.2) and nominal in turn, one iteration each, 12 iterations: the chain counted 5 moves nominal -> slow
    and 6 slow -> nominal; the last decision (after a nominal iteration) predicts each k's T as the mean over the
    next two boundaries of the two states' T(k), weighted by P and P^2 from those counts (a prior of one stay)."""
    controller = AdaptiveController.from_measurements(ControllerConfig(initial_k=1), **numbers(p=4, m=16))
    for i in range(12):
        controller.step(_slow(i, controller.k, 0.2 if i % 2 == 0 else 1.0))
    last = controller.decisions[-1]
    assert "expected states" in last.reason
    fast_fast, slow_fast = 1 / 6, 6 / 7
    one = (fast_fast, 1 - fast_fast)  # (nominal, slow) after one boundary
    two = (one[0] * fast_fast + one[1] * slow_fast, one[0] * (1 - fast_fast) + one[1] * (1 - slow_fast))
    w_fast, w_slow = (one[0] + two[0]) / 2, (one[1] + two[1]) / 2
    links = ((1, 2), (2, 1))
    for k, value in last.predicted_ms.items():
        fast = controller.predictor.time(k, dict.fromkeys(links, 1.0))
        slow = controller.predictor.time(k, dict.fromkeys(links, 0.2))
        assert value == pytest.approx(w_fast * fast + w_slow * slow, rel=1e-12)
    assert last.k == min(last.predicted_ms, key=lambda k: (last.predicted_ms[k], k)) or controller._near(
        last.k, min(last.predicted_ms, key=lambda k: (last.predicted_ms[k], k)), last.predicted_ms
    )


def test_next_states_constants_are_checked() -> None:
    with pytest.raises(AdaptError, match=r"controller markov_horizon must be an integer >= 0, got -1"):
        ControllerConfig(markov_horizon=-1)
    with pytest.raises(AdaptError, match=r"controller markov_departures must be an integer >= 1, got 0"):
        ControllerConfig(markov_departures=0)


def test_known_reads_only_the_memoized_predictions_of_a_state() -> None:
    """Predictor.known: the k already predicted in a rounded state, to the bit, without simulating."""
    pipeline = PipelineModel.from_measurements(**numbers(p=4, m=8))
    schedules, _ = fitting_ks(pipeline)
    predictor = Predictor(pipeline, schedules)
    slow = {(1, 2): 0.3, (2, 1): 0.3}
    values = {k: predictor.time(k, slow) for k in (1, 3)}
    spent = predictor.simulations
    assert predictor.known(predictor.key(slow)) == values
    assert predictor.known(predictor.key({(1, 2): 0.5})) == {}
    assert predictor.simulations == spent
