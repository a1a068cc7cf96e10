"""sim.engine.timing_key: costs that only rename resources, links and rings share a key and simulate to the same time;
a change of anything else the key holds changes it, and a change it leaves out never changes the time."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeplan.core.schedule import Schedule
from pipeplan.schedules import make_schedule
from pipeplan.sim import Costs, Flow, StageCost, simulate
from pipeplan.sim.cost.types import GradBucket, SharedExchange
from pipeplan.sim.engine.timing_key import TimingKeys, timing_key

RESOURCES = ("nic:0:out", "nic:1:in", "switch", "pair:a", "pair:b", "pair:c")
TIMES = st.sampled_from([0.0, 0.1, 0.25, 0.3, 1.0, 1.7, 3.0])
"""Durations in ms, some not binary fractions, from a small set so that ties and contention happen."""


def _flows(data: st.DataObject, src: int, dst: int) -> tuple[Flow, ...]:
    """0 to 3 flows of one transfer, each on 1 to 3 resources of a small shared pool (ranks contend)."""
    flows = []
    for _ in range(data.draw(st.integers(0, 3))):
        resources = tuple(data.draw(st.lists(st.sampled_from(RESOURCES), min_size=1, max_size=3, unique=True)))
        flows.append(Flow(resources, (src, dst), data.draw(TIMES), data.draw(TIMES)))
    return tuple(flows)


def _stage(data: st.DataObject, s: int) -> StageCost:
    """A stage with an optimizer step and an all-reduce, bucketed or not (its latency below its time)."""
    allreduce = data.draw(TIMES)
    buckets: tuple[GradBucket, ...] = ()
    if data.draw(st.booleans()):
        buckets = (GradBucket(0.5, allreduce / 2, 0.0), GradBucket(1.0, allreduce / 2, 0.0))
        allreduce = buckets[0].allreduce_ms + buckets[1].allreduce_ms
    return StageCost(
        data.draw(TIMES),
        data.draw(TIMES),
        saved_bytes=1e6 * (s + 1),
        static_bytes=3e6,
        allreduce_ms=allreduce,
        optimizer_ms=data.draw(TIMES),
        allreduce_ring=(s, s + 10),
        allreduce_latency_ms=allreduce / 4,
        allreduce_buckets=buckets,
    )


def _costs(data: st.DataObject, stages: int) -> Costs:
    shared = (SharedExchange("tied", 1e6, (0, stages - 1), 2, data.draw(TIMES), (0, 99)),) if stages > 1 else ()
    return Costs(
        tuple(_stage(data, s) for s in range(stages)),
        tuple(_flows(data, b, b + 1) for b in range(stages - 1)),
        tuple(_flows(data, b + 1, b) for b in range(stages - 1)),
        shared,
    )


def _renamed(costs: Costs, names: dict[str, str]) -> Costs:
    """`costs` on other devices: every resource renamed by the one-to-one `names`, links and rings elsewhere, other
    bytes (none of which a trace-free run's time reads)."""

    def move(flows: tuple[Flow, ...]) -> tuple[Flow, ...]:
        return tuple(
            Flow(tuple(names[r] for r in f.resources), (f.link[1] + 50, f.link[0] + 60), f.latency_ms, f.work_ms) for f in flows
        )

    stages = tuple(
        dataclasses.replace(c, allreduce_ring=tuple(d + 7 for d in c.allreduce_ring), static_bytes=c.static_bytes * 2)
        for c in costs.stages
    )
    shared = tuple(dataclasses.replace(x, ring=(5, 6, 7)) for x in costs.shared)
    return Costs(stages, tuple(map(move, costs.forward)), tuple(map(move, costs.backward)), shared)


def _schedules(p: int) -> list[Schedule]:
    return [
        make_schedule("gpipe", p, 2 * p),
        make_schedule("1f1b", p, 2 * p + 1),
        make_schedule("kfkb", p, 2 * p, k=2),
        make_schedule("zb-h1", p, 2 * p),
        make_schedule("interleaved-1f1b", p, 2 * p, chunks=2),
    ]


@settings(max_examples=60, deadline=None)
@given(p=st.integers(2, 4), data=st.data())
def test_renamed_resources_links_and_rings_keep_the_key_and_the_time(p: int, data: st.DataObject) -> None:
    """A one-to-one renaming of resources (drawn), moved links and rings: the same key, and every schedule simulates
    both costs to the same iteration time (the simulator itself is the reference)."""
    target = data.draw(st.permutations([f"r{i}" for i in range(len(RESOURCES))]))
    names = dict(zip(RESOURCES, target, strict=True))
    for schedule in _schedules(p):
        costs = _costs(data, schedule.num_stages)
        other = _renamed(costs, names)
        assert timing_key(other) == timing_key(costs)
        assert simulate(schedule, other, record=False).iteration_time == simulate(schedule, costs, record=False).iteration_time


def _perturbed(costs: Costs, where: int) -> Costs:
    """`costs` with one thing changed, by index: a stage field, a flow's time or resources, the exchange's time."""
    c = costs.stages[0]
    fields = ["fwd_ms", "bwd_ms", "optimizer_ms", "allreduce_ms", "saved_bytes", "static_bytes"]
    if where < len(fields):
        name = fields[where]
        value = getattr(c, name) + 0.5
        changed = (
            dataclasses.replace(c, **{name: value}, allreduce_buckets=())
            if name == "allreduce_ms"
            else dataclasses.replace(c, **{name: value})
        )
        if name == "bwd_ms":  # keep the split's halves what a fresh StageCost gives
            changed = dataclasses.replace(changed, bwd_input_ms=value / 2, bwd_weight_ms=value / 2)
        return dataclasses.replace(costs, stages=(changed, *costs.stages[1:]))
    flows = costs.forward[0]
    if where == len(fields) and flows:  # a flow's work
        f = flows[0]
        moved = (dataclasses.replace(f, work_ms=f.work_ms + 0.5), *flows[1:])
        return dataclasses.replace(costs, forward=(moved, *costs.forward[1:]))
    if where == len(fields) + 1 and flows:  # a flow onto one resource of its own (no longer shared)
        f = flows[0]
        moved = (dataclasses.replace(f, resources=("alone",)), *flows[1:])
        return dataclasses.replace(costs, forward=(moved, *costs.forward[1:]))
    x = costs.shared[0]
    return dataclasses.replace(costs, shared=(dataclasses.replace(x, exchange_ms=x.exchange_ms + 0.5),))


@settings(max_examples=80, deadline=None)
@given(p=st.integers(2, 3), where=st.integers(0, 8), data=st.data())
def test_a_change_the_key_leaves_out_never_changes_the_time(p: int, where: int, data: st.DataObject) -> None:
    """One field changed: either the key changes, or no schedule's iteration time does (what the key leaves out is
    what the time does not read; the bytes are the fields it must leave out)."""
    for schedule in _schedules(p):
        costs = _costs(data, schedule.num_stages)
        other = _perturbed(costs, where)
        if timing_key(other) == timing_key(costs):
            assert (
                simulate(schedule, other, record=False).iteration_time == simulate(schedule, costs, record=False).iteration_time
            )


def test_the_key_holds_times_and_shared_resources_and_leaves_out_bytes() -> None:
    """Hand-built: a flow's work, the sharing of a resource between two transfers and each stage's times are in the
    key; saved and static bytes are not."""
    flow = Flow(("a",), (0, 1), 0.0, 1.0)
    back = Flow(("b",), (1, 0), 0.0, 1.0)
    base = Costs((StageCost(1.0, 2.0), StageCost(1.0, 2.0)), ((flow,),), ((back,),))
    same_resource = dataclasses.replace(base, backward=((dataclasses.replace(back, resources=("a",)),),))
    slower = dataclasses.replace(base, forward=((dataclasses.replace(flow, work_ms=1.5),),))
    heavier = dataclasses.replace(base, stages=(StageCost(1.0, 2.0, saved_bytes=9.0, static_bytes=9.0), base.stages[1]))
    later = dataclasses.replace(base, stages=(StageCost(1.0, 2.5), base.stages[1]))
    assert timing_key(same_resource) != timing_key(base)
    assert timing_key(slower) != timing_key(base)
    assert timing_key(later) != timing_key(base)
    assert timing_key(heavier) == timing_key(base)


@settings(max_examples=60, deadline=None)
@given(p=st.integers(2, 3), data=st.data())
def test_compact_keys_are_equal_exactly_when_the_keys_are(p: int, data: st.DataObject) -> None:
    """TimingKeys.key against timing_key on drawn costs, their renamings and perturbations, and costs that reuse
    another's flows tuples in other places (its per-tuple memory must not leak across costs): equal compact keys
    exactly when timing_key's are equal, through one TimingKeys as a search keeps it."""
    keys = TimingKeys()
    names = dict(zip(RESOURCES, data.draw(st.permutations([f"r{i}" for i in range(len(RESOURCES))])), strict=True))
    pool: list[Costs] = []
    for schedule in _schedules(p):
        costs = _costs(data, schedule.num_stages)
        pool += [costs, _renamed(costs, names), *(_perturbed(costs, w) for w in range(9))]
        swapped = dataclasses.replace(costs, forward=costs.backward, backward=costs.forward)  # the same tuples, elsewhere
        pool.append(swapped)
    for a in pool:
        for b in pool:
            if len(a.stages) == len(b.stages):
                assert (keys.key(a) == keys.key(b)) == (timing_key(a) == timing_key(b))
