"""sim.engine.simulator.iteration_time: the iteration time alone, as simulate gives it, and a closed form."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeplan.schedules import make_schedule
from pipeplan.sim import Costs, Flow, StageCost, simulate
from pipeplan.sim.cost.types import GradBucket, SharedExchange
from pipeplan.sim.engine.program import compile_schedule
from pipeplan.sim.engine.simulator import iteration_time

RESOURCES = ("nic:0:out", "nic:1:in", "switch", "pair:a")
TIMES = st.sampled_from([0.0, 0.1, 0.25, 0.3, 1.0, 1.7, 3.0])


def _flows(data: st.DataObject, src: int, dst: int) -> tuple[Flow, ...]:
    flows = []
    for _ in range(data.draw(st.integers(0, 2))):
        resources = tuple(data.draw(st.lists(st.sampled_from(RESOURCES), min_size=1, max_size=2, unique=True)))
        flows.append(Flow(resources, (src, dst), data.draw(TIMES), data.draw(TIMES)))
    return tuple(flows)


def _stage(data: st.DataObject) -> StageCost:
    allreduce = data.draw(TIMES)
    buckets = (GradBucket(0.25, allreduce / 2), GradBucket(1.0, allreduce / 2)) if data.draw(st.booleans()) else ()
    return StageCost(
        data.draw(TIMES), data.draw(TIMES), allreduce_ms=allreduce, optimizer_ms=data.draw(TIMES), allreduce_buckets=buckets
    )


@settings(max_examples=80, deadline=None)
@given(
    name=st.sampled_from(["gpipe", "1f1b", "kfkb", "zb-h1", "interleaved-1f1b"]),
    p=st.integers(1, 4),
    m=st.integers(1, 9),
    data=st.data(),
)
def test_iteration_time_is_simulates(name: str, p: int, m: int, data: st.DataObject) -> None:
    """Shared resources (so both event loops run), bucketed and plain all-reduces, a shared exchange, optimizer
    steps: the same float as simulate's iteration_time."""
    chunks = 2 if name == "interleaved-1f1b" else 1
    m = m * p if chunks > 1 else m
    schedule = make_schedule(name, p, m, k=min(2, m) if name == "kfkb" else 1, chunks=chunks)
    n = schedule.num_stages
    shared = (SharedExchange("tied", 1.0, (0, n - 1), 2, data.draw(TIMES)),) if n > 1 else ()
    costs = Costs(
        tuple(_stage(data) for _ in range(n)),
        tuple(_flows(data, b, b + 1) for b in range(n - 1)),
        tuple(_flows(data, b + 1, b) for b in range(n - 1)),
        shared,
    )
    assert iteration_time(schedule, costs) == simulate(schedule, costs, record=False).iteration_time
    program = compile_schedule(schedule)  # a caller's compiled program (the adaptive controller's): the same float
    assert iteration_time(schedule, costs, program) == simulate(schedule, costs, record=False).iteration_time


@pytest.mark.parametrize(("p", "m"), [(1, 1), (2, 3), (4, 8), (3, 7)])
def test_uniform_1f1b_without_transfers_takes_its_closed_form(p: int, m: int) -> None:
    """Uniform stages, free transfers: 1F1B takes (m + p - 1)(F + B), plus the optimizer step."""
    free = tuple(() for _ in range(p - 1))
    costs = Costs(tuple(StageCost(1.0, 2.0, optimizer_ms=0.5) for _ in range(p)), free, free)
    assert iteration_time(make_schedule("1f1b", p, m), costs) == (m + p - 1) * 3.0 + 0.5
