"""What a trace-free simulation's iteration time reads of its costs: costs with equal keys simulate to equal times.

A planner scores many placements of one partition: swapping two devices renames the resources and links its flows
use and the devices of its rings, and often changes nothing else. Without a bandwidth trace the event loops see
resources only as the ids TransferTable numbers them with (first appearance, boundary by boundary, flow by flow), and
never read a flow's link or a ring's devices. So two costs whose `timing_key`s are equal give the same TransferTable
(ids, latencies, works, fast forms, which resources have one producer), the same durations and the same all-reduce
and exchange tails: equal iteration times under one schedule (tests/test_timing_key.py).
"""

from __future__ import annotations

from pipeplan.sim.cost.types import Costs, Flow

TimingKey = tuple[object, ...]


def timing_key(costs: Costs) -> TimingKey:
    """The parts of `costs` that `simulate(schedule, costs, trace=None)`'s iteration time depends on, resources named
    by their TransferTable ids; links, rings and bytes left out (a trace reads the first two, memory the last)."""
    ids: dict[str, int] = {}
    transfers = tuple(_flows(flows, ids) for flows in costs.forward + costs.backward)
    return (_stages(costs), transfers, _shared(costs))


def _stages(costs: Costs) -> tuple[object, ...]:
    """Each stage's times (and its all-reduce buckets'), as a key's first part."""
    return tuple(
        (
            c.fwd_ms,
            c.bwd_ms,
            c.bwd_input_ms,
            c.bwd_weight_ms,
            c.optimizer_ms,
            c.allreduce_ms,
            tuple((b.ready_fraction, b.allreduce_ms) for b in c.allreduce_buckets),
        )
        for c in costs.stages
    )


def _shared(costs: Costs) -> tuple[object, ...]:
    """Each shared parameter's stages and exchange time, as a key's last part."""
    return tuple((x.stages, x.exchange_ms) for x in costs.shared)


def _flows(flows: tuple[Flow, ...], ids: dict[str, int]) -> tuple[tuple[tuple[int, ...], float, float], ...]:
    """One transfer's flows as (resource ids, latency, work); `ids` numbers resources as TransferTable does."""
    return tuple((tuple(ids.setdefault(name, len(ids)) for name in f.resources), f.latency_ms, f.work_ms) for f in flows)


class TimingKeys:
    """timing_key in a compact form, for a search that keys thousands of costs built from the same transfers.

    `key(a) == key(b)` exactly when `timing_key(a) == timing_key(b)`: each transfer is kept as the number of its
    flows' shape (resources numbered by first use inside the transfer, latencies, works; numbered as first seen)
    and the TransferTable ids of its resources in that order, which together give timing_key's entry for it and are
    given by it. A transfer's shape is worked out once per flows tuple (a FlowMemo hands out the same tuples), so a
    key costs a few steps per transfer instead of one per flow and resource.
    """

    def __init__(self) -> None:
        self._transfers: dict[int, tuple[tuple[Flow, ...], int, tuple[str, ...]]] = {}
        self._shapes: dict[tuple[object, ...], int] = {}

    def key(self, costs: Costs) -> TimingKey:
        """The compact timing_key of `costs`."""
        ids: dict[str, int] = {}
        transfers = []
        for flows in costs.forward + costs.backward:
            shape, names = self._shape(flows)
            transfers.append((shape, tuple([ids.setdefault(name, len(ids)) for name in names])))
        return (_stages(costs), tuple(transfers), _shared(costs))

    def _shape(self, flows: tuple[Flow, ...]) -> tuple[int, tuple[str, ...]]:
        """(shape number, resource names in first-use order) of one transfer's flows."""
        known = self._transfers.get(id(flows))
        if known is None or known[0] is not flows:
            local: dict[str, int] = {}
            shape = _flows(flows, local)
            number = self._shapes.setdefault(shape, len(self._shapes))
            known = self._transfers[id(flows)] = (flows, number, tuple(local))  # held: its id stays
        return known[1], known[2]
