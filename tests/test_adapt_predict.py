"""adapt.predict.Predictor: the rounded state (key) and the costs simulated in it, against plain formulas."""

from __future__ import annotations

import math

from adapt_cases import numbers
from pipeplan.adapt import PipelineModel
from pipeplan.adapt.predict import Predictor, fitting_ks
from pipeplan.sim import Costs, Flow, simulate


def test_key_is_each_factors_index_on_the_log_grid() -> None:
    """Each traffic link's factor (absent: 1) and each stage time as round(log(x) / log(1 + step)); 0 ms: None."""
    pipeline = PipelineModel.from_measurements(**numbers(p=3, m=4))
    predictor = Predictor(pipeline, fitting_ks(pipeline)[0], step=0.02)
    factors = {(0, 1): 0.37, (2, 1): 1.9}
    rates, times = predictor.key(factors, ([1.0, 0.5, 0.0], [2.0, 3.3, 1e-3]))
    grid = math.log(1.02)
    assert rates == tuple(round(math.log(factors.get(link, 1.0)) / grid) for link in pipeline.traffic_links)
    assert times == (
        0,
        round(math.log(0.5) / grid),
        None,
        round(math.log(2.0) / grid),
        round(math.log(3.3) / grid),
        round(math.log(1e-3) / grid),
    )
    assert predictor.key(factors) == (rates, None)


def test_predictions_after_other_states_are_those_of_the_states_costs_built_afresh() -> None:
    """A state met after others (whose flows at equal factors are remembered) predicts what the simulator gives for
    costs built by hand: every flow's work over its link's rounded factor, the stage times on the grid."""
    pipeline = PipelineModel.from_measurements(**numbers(p=4, m=8))
    schedules = fitting_ks(pipeline)[0]
    predictor = Predictor(pipeline, schedules)
    compute = ([1.1, 0.9, 1.0, 1.3], [2.0, 2.2, 1.7, 2.1])
    for slow in (0.5, 0.25, 0.5):  # links (0, 1) and (1, 0) keep their factor from state to state
        predictor.times({(0, 1): 0.8, (1, 0): 0.6, (1, 2): slow, (2, 3): slow / 2}, compute)
    factors = {(0, 1): 0.8, (1, 0): 0.6, (1, 2): 0.3, (2, 3): 0.9}
    got = predictor.times(factors, compute)
    rates, times = predictor.key(factors, compute)
    rounded = dict(zip(pipeline.traffic_links, (1.01**q for q in rates), strict=True))
    base = pipeline.with_compute([1.01**q for q in times[:4]], [1.01**q for q in times[4:]])  # type: ignore[operator]

    def scaled(flows: tuple[Flow, ...]) -> tuple[Flow, ...]:
        return tuple(Flow(f.resources, f.link, f.latency_ms, f.work_ms / rounded[f.link]) for f in flows)

    costs = Costs(base.stages, tuple(map(scaled, base.forward)), tuple(map(scaled, base.backward)), base.shared)
    assert got == {k: simulate(s, costs, record=False).iteration_time for k, s in schedules.items()}
    assert got == Predictor(pipeline, schedules).times(factors, compute)  # a predictor that saw nothing before
