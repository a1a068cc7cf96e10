"""The event loops' transfer timing without a trace (loops.plain_run) against the transfer table's general queue."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeplan.schedules import make_schedule
from pipeplan.sim import Costs, Flow, StageCost, simulate
from pipeplan.sim.engine.loops import plain_run
from pipeplan.sim.engine.simulator import simulate_in_time_order
from pipeplan.sim.engine.transfers import GENERAL, TransferTable, fresh_table

RESOURCES = ("nic:0:out", "nic:1:in", "switch", "pair:a", "pair:b")
TIMES = st.sampled_from([0.0, 0.1, 0.25, 0.3, 1.0, 1.7, 3.0])
"""Durations in ms, some of them not binary fractions: an addition done in another order rounds differently."""


def _flows(data: st.DataObject, src: int, dst: int) -> tuple[Flow, ...]:
    """0 to 2 flows of one transfer, each on 1 to 3 resources drawn from a small shared pool (so ranks contend)."""
    count = data.draw(st.integers(0, 2))
    flows = []
    for _ in range(count):
        resources = tuple(data.draw(st.lists(st.sampled_from(RESOURCES), min_size=1, max_size=3, unique=True)))
        flows.append(Flow(resources, (src, dst), data.draw(TIMES), data.draw(TIMES)))
    return tuple(flows)


def _random_costs(data: st.DataObject, stages: int) -> Costs:
    per_stage = tuple(StageCost(data.draw(TIMES), data.draw(TIMES)) for _ in range(stages))
    forward = tuple(_flows(data, b, b + 1) for b in range(stages - 1))
    backward = tuple(_flows(data, b + 1, b) for b in range(stages - 1))
    return Costs(per_stage, forward, backward)


@settings(max_examples=150, deadline=None)
@given(
    name=st.sampled_from(["gpipe", "1f1b", "kfkb", "zb-h1", "interleaved-1f1b"]),
    p=st.integers(2, 4),
    mult=st.integers(1, 3),
    k=st.integers(2, 4),
    data=st.data(),
)
def test_an_unrecorded_run_times_shared_resources_as_the_recorded_general_queue_does(
    name: str, p: int, mult: int, k: int, data: st.DataObject
) -> None:
    """record=False times several-flow and several-resource transfers by plain_run; record=True logs every flow, so
    TransferTable.run times them (the reference). Every number but the timeline is the same, in both event loops."""
    k = min(k, p * mult) if name == "kfkb" else 1
    schedule = make_schedule(name, p, p * mult, k=k, chunks=2 if name == "interleaved-1f1b" else 1)
    costs = _random_costs(data, schedule.num_stages)
    quick = simulate(schedule, costs, record=False)
    recorded = simulate(schedule, costs, record=True)
    assert quick == dataclasses.replace(recorded, compute=(), transfers=(), flows=())
    assert simulate_in_time_order(schedule, costs, record=False) == dataclasses.replace(
        simulate_in_time_order(schedule, costs, record=True), compute=(), transfers=(), flows=()
    )


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_plain_run_queues_flows_as_the_transfer_table_does(data: st.DataObject) -> None:
    """Requests in time order on random boundaries: plain_run on the table's `plain` flows gives the (start, end) and
    leaves the resources' free times that TransferTable.run gives (a copy of the table serves as the reference)."""
    stages = data.draw(st.integers(2, 4))
    costs = _random_costs(data, stages)
    reference = TransferTable(tuple(range(stages)), costs, None)
    table = TransferTable(tuple(range(stages)), costs, None)
    general = [b for b, rid in enumerate(table.fast_resource) if rid == GENERAL]
    if not general:
        return
    request = 0.0
    for _ in range(data.draw(st.integers(1, 12))):
        boundary = data.draw(st.sampled_from(general))
        request += data.draw(st.sampled_from([0.0, 0.5, 2.0]))
        flows = table.plain_flows()[boundary]
        assert flows is not None
        assert plain_run(flows, request, table.free) == reference.run(boundary, request)
        assert table.free == reference.free


def test_a_logging_table_has_no_plain_flows() -> None:
    """While `flow_log` is set every transfer goes through TransferTable.run, which logs each flow."""
    flows = (Flow(("pair:0->1", "nic"), (0, 1), 0.0, 2.0), Flow(("pair:0->1b", "nic"), (0, 1), 0.5, 1.0))
    table = TransferTable((0, 1), Costs((StageCost(1.0, 1.0),) * 2, (flows,), ((),)), None)
    assert table.plain_flows() == [(((0, 1), 0.0, 2.0), ((2, 1), 0.5, 1.0)), None]  # the gradient moves nothing
    table.flow_log = []
    assert table.plain_flows() == [None, None]


def test_a_fresh_table_is_a_new_queue_on_the_same_compiled_flows() -> None:
    """fresh_table reuses the compiled flows of the same costs object but starts every resource free again."""
    flows = (Flow(("pair:0->1", "nic"), (0, 1), 0.1, 2.0), Flow(("pair:0->1b", "nic"), (0, 1), 0.5, 1.0))
    costs = Costs((StageCost(1.0, 1.0),) * 2, (flows,), ((),))
    first = fresh_table((0, 1), costs, None)
    assert first.run(0, 0.0) == (0.0, 3.6)  # the second flow waits for the nic: [2.1, 3.6]
    second = fresh_table((0, 1), costs, None)
    assert second is not first and second.flows is first.flows and second.free == [0.0, 0.0, 0.0]
    assert second.run(0, 0.0) == (0.0, 3.6) and first.free == [2.1, 3.6, 3.6]
    equal = Costs(costs.stages, costs.forward, costs.backward)  # another object: compiled again, the same numbers
    third = fresh_table((0, 1), equal, None)
    assert third.flows is not first.flows and third.flows == first.flows
