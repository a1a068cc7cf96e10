"""adapt.runs and adapt.fixed_baselines: fixed k, the controller under a trace, the oracle, and every policy side by side."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapt_cases import RING_FACTOR, bert_plan, numbers, replicated_plan
from pipeplan.adapt import AdaptiveController, Collective, ControllerConfig, PipelineModel
from pipeplan.adapt.fixed_baselines import compare_policies
from pipeplan.adapt.predict import fitting_ks
from pipeplan.adapt.runs import ControllerRun, observe_result, run_controller, run_fixed, run_oracle
from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace, TraceStep
from pipeplan.schedules import make_schedule
from pipeplan.sim import simulate
from pipeplan.sim.engine.iterations import simulate_iterations
from pipeplan.sim.trace_gen import markov_trace, periodic_trace


def _slow_middle(t_ms: float = 0.0, factor: float = 0.25) -> BandwidthTrace:
    return BandwidthTrace((TraceStep(t_ms, (1, 2), factor), TraceStep(t_ms, (2, 1), factor)))


def test_fixed_k1_is_1f1b_and_k_m_is_gpipe_under_a_trace() -> None:
    """kFkB with k=1 runs as 1F1B and with k=m as GPipe, iteration for iteration, under the same trace."""
    pipeline = PipelineModel.from_measurements(**numbers(p=4, m=8))
    trace = periodic_trace(40.0, 0.5, 0.25, 400.0, [(1, 2), (2, 1)])
    schedules, _ = fitting_ks(pipeline)
    for name, k in (("1f1b", 1), ("gpipe", 8)):
        reference = simulate_iterations(make_schedule(name, 4, 8), pipeline.costs, trace, 10)
        run = run_fixed(name, k, schedules[k], pipeline, trace, 10)
        assert run.iteration_ms == reference.iteration_ms and run.k == (k,) * 10


def test_observations_of_a_simulated_iteration_give_the_traces_factor() -> None:
    """Under a constant factor 0.25 on the middle link the controller estimates exactly 0.25 there, 1 elsewhere."""
    pipeline = PipelineModel.from_measurements(**numbers(p=4, m=8))
    trace = _slow_middle()
    result = simulate(make_schedule("1f1b", 4, 8), pipeline.costs, trace, record=True)
    controller = AdaptiveController(pipeline)
    controller.observe(observe_result(pipeline, result, 0, 1, 0.0))
    factors = controller.views["now"].factors()
    assert factors[(1, 2)] == pytest.approx(0.25) and factors[(2, 1)] == pytest.approx(0.25)
    assert factors[(0, 1)] == pytest.approx(1.0)


def test_plan_flows_are_read_one_by_one() -> None:
    """On a real plan with a slowed inter-node pair, the estimate of that pair is the trace's factor."""
    plan, model = bert_plan()
    trace = BandwidthTrace((TraceStep(0.0, (7, 8), 0.3), TraceStep(0.0, (8, 7), 0.3)))
    pipeline = PipelineModel.from_plan(plan, model, trace)
    run = run_controller(AdaptiveController(pipeline), trace, 2)
    assert run.decisions[-1].factors[(7, 8)] == pytest.approx(0.3)
    assert run.decisions[-1].factors[(6, 7)] == pytest.approx(1.0)


def test_oracle_equals_the_best_sequence_found_by_brute_force() -> None:
    """On 3 iterations and k in {1, 2, 4} with a switch cost, the DP's total is the minimum over all 27 sequences."""
    pipeline = PipelineModel.from_measurements(**numbers(p=3, m=4))
    trace = periodic_trace(30.0, 0.5, 0.2, 200.0, [(1, 2), (2, 1)])
    schedules = {k: make_schedule("kfkb", 3, 4, k=k) for k in (1, 2, 4)}
    switch = 1.5
    best = float("inf")
    for sequence in itertools.product(schedules, repeat=3):
        t = 0.0
        for i, k in enumerate(sequence):
            if i and k != sequence[i - 1]:
                t += switch
            t += simulate(schedules[k], pipeline.costs, trace, record=False, offset_ms=t).iteration_time
        best = min(best, t)
    oracle = run_oracle(schedules, pipeline, trace, 3, switch)
    assert oracle.total_ms == pytest.approx(best)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_without_a_switch_cost_the_oracle_is_the_greedy_that_sees_one_iteration_ahead(seed: int) -> None:
    """switch_ms 0: the DP's total equals a plain loop that runs, each iteration, the k that ends it first from where
    the last one ended (an iteration that starts later never ends earlier): the oracle's whole edge is knowing the
    next iteration's network (benchmarks/adaptive_gap.py)."""
    pipeline = PipelineModel.from_measurements(**numbers(p=4, m=8))
    trace = markov_trace(seed, 30.0, 40.0, (0.05, 0.5), 2000.0, [(1, 2), (2, 1)])
    schedules = {k: make_schedule("kfkb", 4, 8, k=k) for k in (1, 2, 4, 8)}
    t = 0.0
    for _ in range(12):
        t += min(simulate(s, pipeline.costs, trace, record=False, offset_ms=t).iteration_time for s in schedules.values())
    assert run_oracle(schedules, pipeline, trace, 12, 0.0).total_ms == pytest.approx(t, rel=1e-12)


def test_switch_cost_delays_the_next_iteration() -> None:
    """A controller that switches pays switch_ms before the next iteration starts."""
    pipeline = PipelineModel.from_measurements(**numbers(p=4, m=16))
    config = ControllerConfig(initial_k=1, switch_ms=0.5)
    run = run_controller(AdaptiveController(pipeline, config), None, 3).run
    assert run.k == (1, 2, 2)
    assert run.start_ms[1] == pytest.approx(run.iteration_ms[0] + 0.5)
    assert run.start_ms[2] == pytest.approx(run.start_ms[1] + run.iteration_ms[1])


def test_compare_runs_every_policy_and_the_oracle_is_never_beaten() -> None:
    """The JSON holds the five policies with the issue's keys; no policy beats the oracle; best_static is a fixed k."""
    plan, model = bert_plan(8)
    trace = markov_trace(3, 4000.0, 6000.0, (0.1, 0.4), 60_000.0, [(7, 8), (8, 7)])
    pipeline = PipelineModel.from_plan(plan, model, trace)
    comparison = compare_policies(pipeline, trace, 12)
    obj = comparison.to_json(timing=False)
    assert set(obj["policies"]) == {"adaptive", "1f1b", "gpipe", "best_static", "oracle"}
    for run in obj["policies"].values():
        assert set(run) >= {"total_ms", "iteration_ms", "k", "peak_bytes"}
        assert len(run["iteration_ms"]) == len(run["k"]) == len(run["peak_bytes"]) == 12
    oracle = comparison.policies["oracle"].total_ms
    assert all(run.total_ms >= oracle - 1e-6 for run in comparison.policies.values())
    assert all(run.total_ms >= oracle - 1e-6 for run in comparison.fixed.values())
    assert comparison.policies["best_static"].total_ms == min(run.total_ms for run in comparison.fixed.values())
    assert len(obj["decisions"]) == 12 and "controller" not in obj


def test_gpipe_is_left_out_when_all_microbatches_do_not_fit() -> None:
    """With room for 8 microbatches on stage 0, GPipe (16) is not run and the reason names the overflow."""
    pipeline = PipelineModel.from_measurements(**numbers(p=4, m=16, activation_bytes=1e9, limit=8.5e9))
    comparison = compare_policies(pipeline, _slow_middle(), 3)
    assert "gpipe" not in comparison.policies
    assert comparison.not_run["gpipe"].startswith("GPipe holds all 16 microbatches: 14.90 GiB on stage 0")


@pytest.mark.slow
@settings(max_examples=15)
@given(
    seed=st.integers(0, 1000),
    slow=st.floats(5.0, 80.0),
    fast=st.floats(5.0, 80.0),
    low=st.floats(0.05, 0.9),
    limit=st.sampled_from([4.5e9, 6.5e9, 8.5e9, 12.5e9]),
)
def test_memory_stays_within_the_limit_at_every_iteration(seed: int, slow: float, fast: float, low: float, limit: float) -> None:
    """Under random Markov traces the controller and the oracle never run a k whose peak exceeds a device's memory."""
    pipeline = PipelineModel.from_measurements(**numbers(p=4, m=16, activation_bytes=1e9, limit=limit))
    trace = markov_trace(seed, slow, fast, (low, min(1.0, low * 2)), 3000.0, [(1, 2), (2, 1), (0, 1)])
    comparison = compare_policies(pipeline, trace, 15)
    for name in ("adaptive", "oracle", "best_static"):
        assert max(comparison.policies[name].peak_bytes) <= limit
    assert all(d.k <= comparison.k_max for d in comparison.decisions)


def test_observations_report_each_stages_all_reduce_on_the_trace_clock() -> None:
    """observe_result turns SimResult.collectives into Collectives moved by the iteration's start; the runs keep each
    stage's all-reduce ms per iteration, longer under a trace on the ring than at nominal."""
    plan, model = replicated_plan(8)
    pipeline = PipelineModel.from_plan(plan, model)
    trace = BandwidthTrace(tuple(TraceStep(0.0, link, RING_FACTOR) for link in pipeline.ring_links[2]))
    result = simulate(make_schedule("1f1b", 4, 8), pipeline.costs, trace, offset_ms=100.0)
    observed = observe_result(pipeline, result, 3, 1, 100.0).collectives
    assert observed == tuple(Collective(c.stage, 100.0 + c.start_ms, 100.0 + c.end_ms) for c in result.collectives)
    assert [c.stage for c in observed] == [0, 1, 2, 3]
    cost = pipeline.costs.stages[2]
    assert observed[2].end_ms - observed[2].start_ms == pytest.approx(
        cost.allreduce_latency_ms + cost.allreduce_work_ms / RING_FACTOR, rel=1e-12
    )
    schedules, _ = fitting_ks(pipeline)
    run = run_fixed("1f1b", 1, schedules[1], pipeline, trace, 3)
    assert run.allreduce_ms[0][2] == pytest.approx(observed[2].end_ms - observed[2].start_ms, rel=1e-12)
    assert run.allreduce_ms[0][1] == pytest.approx(pipeline.costs.stages[1].allreduce_ms, rel=1e-12)


def _steps(changes: list[tuple[float, float]], links: tuple[tuple[int, int], ...]) -> tuple[TraceStep, ...]:
    return tuple(TraceStep(t, link, f) for t, f in changes for link in links)


@settings(max_examples=25, deadline=None)
@given(
    gaps=st.lists(st.floats(5.0, 120.0), min_size=1, max_size=12),
    factors=st.lists(st.floats(0.05, 1.0), min_size=24, max_size=24),
    cut=st.floats(20.0, 700.0),
    switch_ms=st.sampled_from([0.0, 3.0]),
)
def test_the_controller_never_looks_ahead(gaps: list[float], factors: list[float], cut: float, switch_ms: float) -> None:
    """Two traces equal up to t = cut and different after it: every decision for an iteration that starts before t
    (so made from iterations that ended before t) is the same in both runs; the runs differ only from there on."""
    pipeline = PipelineModel.from_measurements(**numbers(p=4, m=8))
    links = ((1, 2), (2, 1), (0, 1))
    times = list(itertools.accumulate(gaps))
    before = [(t, f) for t, f in zip(times, factors, strict=False) if t < cut]
    after_a = [(cut + t, f) for t, f in zip(times, factors[12:], strict=False)]
    after_b = [
        (cut, 1.0 if factors[-1] < 0.5 else 0.05),
        *((cut + t, 1.05 - f) for t, f in zip(times, factors[12:], strict=False)),
    ]
    trace_a = BandwidthTrace(_steps(before + after_a, links))
    trace_b = BandwidthTrace(_steps(before + after_b, links))
    config = ControllerConfig(switch_ms=switch_ms)
    run_a = run_controller(AdaptiveController(pipeline, config), trace_a, 14)
    run_b = run_controller(AdaptiveController(pipeline, config), trace_b, 14)
    starts = run_a.run.start_ms
    early = sum(1 for s in starts if s < cut)
    assert starts[:early] == run_b.run.start_ms[:early]
    decided_a = [d for d in run_a.decisions if d.iteration < early]
    decided_b = [d for d in run_b.decisions if d.iteration < early]
    assert len(decided_a) == early and decided_a == decided_b
    assert run_a.run.k[:early] == run_b.run.k[:early]


def test_a_wrong_model_runs_against_the_truth() -> None:
    """With `truth`, the simulator runs the true pipeline (fixed k=1's times) while the controller keeps its own
    model; `distort` sees every observation before the controller does."""
    truth = PipelineModel.from_measurements(**numbers(p=4, m=8))
    wrong = PipelineModel.from_measurements(**{**numbers(p=4, m=8), "fwd_ms": [2.0] * 4})
    seen: list[int] = []

    def distort(observation: object) -> object:
        seen.append(observation.index)  # type: ignore[attr-defined]
        return observation

    controller = AdaptiveController(wrong, ControllerConfig(k_choices=(1,)))
    run = run_controller(controller, None, 3, truth=truth, distort=distort)  # type: ignore[arg-type]
    fixed = run_fixed("k=1", 1, controller.predictor.schedules[1], truth, None, 3)
    assert run.run.iteration_ms == pytest.approx(fixed.iteration_ms) and seen == [0, 1]
    assert controller.decisions[0].predicted_ms[1] > fixed.iteration_ms[0]


def _cut_runs(
    config: ControllerConfig, phase_idle: float, phases: int, iterations: int, cut_in: int, after: float
) -> tuple[ControllerRun, ControllerRun, int]:
    """The controller of `config` run twice on one 4-stage pipeline: under a network slow (0.05) and nominal in turn,
    each phase `phase_idle` idle 1F1B iterations long, and under the same trace cut 1 ms into iteration `cut_in` of
    the first run, `after` from there. Both runs, and how many of the first run's iterations start before the cut."""
    pipeline = PipelineModel.from_measurements(**numbers(p=4, m=8))
    links = pipeline.traffic_links
    schedules, _ = fitting_ks(pipeline)
    idle = simulate(schedules[1], pipeline.costs, None, record=False).iteration_time
    flips = [(phase_idle * idle * i, 0.05 if i % 2 else 1.0) for i in range(1, phases)]
    run_a = run_controller(AdaptiveController(pipeline, config), BandwidthTrace(_steps(flips, links)), iterations)
    cut = run_a.run.start_ms[cut_in] + 1.0
    trace_b = BandwidthTrace(_steps([(t, f) for t, f in flips if t < cut] + [(cut, after)], links))
    run_b = run_controller(AdaptiveController(pipeline, config), trace_b, iterations)
    return run_a, run_b, sum(1 for s in run_a.run.start_ms if s < cut)


def test_the_replay_never_looks_ahead() -> None:
    """A network that flips inside iterations (1.0 and 0.05 in turn, each 0.6 of an idle iteration) until t and
    differently after: the controller replays its window before t (a decision says so), and every decision for an
    iteration that starts before t is the same under both traces."""
    config = ControllerConfig(initial_k=1, replay_window=4, replay_budget=0.5)
    run_a, run_b, early = _cut_runs(config, phase_idle=0.6, phases=400, iterations=40, cut_in=25, after=0.3)
    assert early == 26
    decided_a = [d for d in run_a.decisions if d.iteration < early]
    assert decided_a == [d for d in run_b.decisions if d.iteration < early]
    assert any("replayed" in d.reason for d in decided_a)
    assert run_a.run.start_ms[:early] == run_b.run.start_ms[:early]
    assert run_a.run.iteration_ms != run_b.run.iteration_ms


def test_the_next_states_never_look_ahead() -> None:
    """A network slow (0.05) and nominal in turn, each phase 3 idle iterations, until t and nominal after: the
    controller predicts over its next states before t (a decision says so), and every decision for an iteration
    that starts before t is the same under both traces (the chain counts only boundaries already passed)."""
    config = ControllerConfig(initial_k=1, markov_horizon=2)
    run_a, run_b, early = _cut_runs(config, phase_idle=3.0, phases=200, iterations=30, cut_in=20, after=1.0)
    assert early == 21
    decided_a = [d for d in run_a.decisions if d.iteration < early]
    assert decided_a == [d for d in run_b.decisions if d.iteration < early]
    assert any("expected states" in d.reason for d in decided_a)
    assert run_a.run.start_ms[:early] == run_b.run.start_ms[:early]
    assert run_a.run.iteration_ms != run_b.run.iteration_ms
