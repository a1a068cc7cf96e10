"""What one stage costs in exact's search: compute, all-reduce, memory and the links to the stage before, cached."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np

from pipeplan.core.errors import PipeplanError
from pipeplan.core.shared_params import span_overlap_bytes
from pipeplan.core.units import wire_ms
from pipeplan.planner.bound.best_rings import Rings
from pipeplan.planner.bound.placed_bounds import Placed
from pipeplan.planner.request import PlanRequest
from pipeplan.sim.cost.layers import StageWork, static_bytes
from pipeplan.sim.cost.link_model import link_arrays, pair_ms, ring_allreduce_ms


@dataclass(slots=True)
class StageCosts:
    """sim's cost model for the stages exact places: the same functions the simulator's costs come from, cached."""

    request: PlanRequest
    works: dict[tuple[int, int, int, int, float], StageWork] = field(default_factory=dict)
    bases: dict[tuple[int, int, tuple[int, ...], int, int], Placed] = field(default_factory=dict)
    links: dict[tuple[int, tuple[int, ...], tuple[int, ...], int, int], tuple[float, float]] = field(default_factory=dict)
    rings: dict[tuple[int, ...], tuple[float, float]] = field(default_factory=dict)  # ring -> (bytes/s, latency ms)
    free_bases: dict[tuple[object, ...], tuple[Rings, Placed]] = field(default_factory=dict)  # anywhere's stages
    # before follow, with the rings they were costed on
    cheapest: dict[tuple[object, ...], tuple[float, float]] = field(default_factory=dict)  # anywhere's transfers:
    # (devices before, free devices, bytes) -> the least in and out over their pairs
    params: list[float] = field(init=False)
    steps: list[float] = field(init=False)

    def __post_init__(self) -> None:
        layers = self.request.model.layers
        self.params = [layer.param_bytes for layer in self.request.profile.layers]
        self.steps = layers.optimizer_steps_ms.tolist()

    def work(self, first: int, last: int, size: int, r: int, speed: float) -> StageWork:
        """LayerCosts.stage of layers first..last on r replicas of `speed` at microbatch size `size`, cached.

        Outside `linear` scaling the same sums in the same order over slices (LayerCosts.stage sums a copy of the
        same values; tests/test_exact_parts.py checks equality to the last bit), without its per-layer Python loops.
        """
        key = (first, last, size, r, speed)
        got = self.works.get(key)
        if got is not None:
            return got
        layers = self.request.model.layers
        if layers.mode == "linear":
            got = self.works[key] = layers.stage(range(first, last + 1), size, r, speed)
            return got
        arrays = layers.arrays(size / r)
        span = slice(first, last + 1)
        held = float(arrays.saved[span].sum())
        if last > first and arrays.shared.any():
            held -= float(arrays.shared[first + 1 : last + 1].sum())
        inp = None if arrays.bwd_input is None else float(arrays.bwd_input[span].sum()) / speed
        wgt = None if arrays.bwd_weight is None else float(arrays.bwd_weight[span].sum()) / speed
        fwd, bwd = float(arrays.fwd[span].sum()) / speed, float(arrays.bwd[span].sum()) / speed
        params = sum(self.params[span])
        groups = self.request.profile.shared_params
        if groups:  # LayerCosts.stage's own subtraction, the same float
            params -= span_overlap_bytes(groups, first, last)
        got = self.works[key] = StageWork(fwd, bwd, inp, wgt, held, params, sum(self.steps[span]) / speed)
        return got

    def allreduce(self, devices: tuple[int, ...], nbytes: float) -> float:
        """link_model.ring_allreduce_ms(cluster, devices, nbytes), the ring's slowest rate and largest latency cached:
        the same formula in the same order, so the same float (tests/test_exact_parts.py)."""
        n = len(devices)
        if n < 2:
            return 0.0
        links = self.rings.get(devices)
        if links is None:
            cluster = self.request.cluster
            ring_allreduce_ms(cluster, devices, 0.0)  # raises ClusterError, naming the pair, on a missing link
            if cluster.allreduce_bytes_per_s is not None:
                links = (cluster.allreduce_bytes_per_s, cluster.allreduce_latency_ms)
            else:
                rate, latency = link_arrays(cluster)
                src = np.array(devices)
                dst = np.roll(src, -1)
                links = (float(rate[src, dst].min()), float(latency[src, dst].max()))
            self.rings[devices] = links
        bandwidth, latency = links
        return wire_ms(2 * (n - 1) / n * nbytes, bandwidth) + 2 * (n - 1) * latency

    def transfer(self, before: Placed, after: Placed, rp: int, nbytes: float, forward: bool) -> float:
        """Slowest pair over all pipeline replicas (each pair carries 1/q of the bytes)."""
        r1, r2 = len(before.devices) // rp, len(after.devices) // rp
        q = min(r1, r2)
        worst = 0.0
        for t in range(rp):
            for i in range(q):
                a, b = before.devices[t * r1 + i], after.devices[t * r2 + i]
                src, dst = (a, b) if forward else (b, a)
                worst = max(worst, pair_ms(self.request.cluster, src, dst, nbytes / q))
        return worst

    def base(self, first: int, last: int, devices: tuple[int, ...], rp: int, size: int) -> Placed:
        """What a stage costs on its own (compute, all-reduce, memory), before any stage is put before it; cached."""
        key = (first, last, devices, rp, size)
        got = self.bases.get(key)
        if got is not None:
            return got
        cluster = self.request.cluster
        work = self.work(first, last, size, len(devices) // rp, min(cluster.devices[d].speed for d in devices))
        memory = min(cluster.devices[d].memory_bytes for d in devices)
        grads = work.param_bytes * self.request.model.holding.grads  # plan_costs' gradient bytes, the same float
        got = self.bases[key] = self.stage(first, last, devices, work, self.allreduce(devices, grads), memory)
        return got

    def stage(self, first: int, last: int, devices: tuple[int, ...], work: StageWork, ring_ms: float, memory: float) -> Placed:
        """A stage of this work (its all-reduce `ring_ms`, its least device memory), before any stage is put before it."""
        inp = work.bwd_ms / 2 if work.bwd_input_ms is None else min(work.bwd_input_ms, work.bwd_ms)
        wgt = work.bwd_ms / 2 if work.bwd_weight_ms is None else work.bwd_weight_ms
        return Placed(
            first,
            last,
            devices,
            fwd=work.fwd_ms,
            bwd=work.bwd_ms,
            inp=inp,
            wgt=wgt,
            allreduce=ring_ms + work.optimizer_ms,
            static=static_bytes(work.param_bytes, self.request.model.optimizer_factor, self.request.model.holding),
            act=work.saved_bytes,
            memory=memory,
            arrive=0.0,
        )

    def place(self, first: int, last: int, devices: tuple[int, ...], rp: int, size: int, prev: Placed | None) -> Placed:
        """Costs of layers first..last on `devices` after `prev`, at microbatch size `size`."""
        stage = clone(self.base(first, last, devices, rp, size))
        if prev is None:
            stage.chain = stage.chain_split = stage.bwd + stage.allreduce
        else:
            key = (prev.last, prev.devices, devices, rp, size)
            links = self.links.get(key)
            if links is None:
                nbytes = self.request.model.layers.cut_bytes(prev.last, size)
                links = self.links[key] = (
                    self.transfer(prev, stage, rp, nbytes, True),
                    self.transfer(prev, stage, rp, nbytes, False),
                )
            follow(stage, prev, *links)
        return stage

    def anywhere(
        self, first: int, last: int, free: tuple[int, ...], r: int, rp: int, size: int, prev: Placed | None, rings: Rings
    ) -> Placed:
        """A stage of layers first..last on r * rp devices of `free`, whichever they are, no costlier than any: the
        fastest free device's compute, the all-reduce on `rings` (the best rings of those devices), the most memory,
        and transfers from `prev` at most its fastest pair's (none after a stage of no devices: an `anywhere` one);
        each bound place's costs take from below."""
        cluster = self.request.cluster
        key = (first, last, free, r, rp, size, id(rings))  # the entry holds `rings`: its id stays its own
        got = self.free_bases.get(key)
        if got is None:
            work = self.work(first, last, size, r, max(cluster.devices[d].speed for d in free))
            ring_ms = float(rings.allreduce_ms(np.array([work.param_bytes]), r * rp)[0])
            base = self.stage(first, last, (), work, ring_ms, max(cluster.devices[d].memory_bytes for d in free))
            got = self.free_bases[key] = (rings, base)
        stage = clone(got[1])
        if prev is None:
            stage.chain = stage.chain_split = stage.bwd + stage.allreduce
            return stage
        nbytes = self.request.model.layers.cut_bytes(prev.last, size) / min(len(prev.devices) // rp or 1, r)
        key = (prev.devices, free, nbytes)
        links = self.cheapest.get(key)
        if links is None:
            ins, outs = [], []
            for a in prev.devices:
                for b in free:
                    with contextlib.suppress(PipeplanError):  # no link: not a pair this stage can use
                        ins.append(pair_ms(cluster, a, b, nbytes))
                    with contextlib.suppress(PipeplanError):
                        outs.append(pair_ms(cluster, b, a, nbytes))
            links = self.cheapest[key] = (min(ins, default=0.0), min(outs, default=0.0))
        follow(stage, prev, *links)
        return stage


def holds_one(stage: Placed) -> bool:
    """Whether the stage's devices hold its weights and optimizer state and one microbatch's saved activations."""
    return stage.static + stage.act <= stage.memory


def clone(stage: Placed) -> Placed:
    """A copy of a stage (copy.copy's generic path costs ~10 us a stage, exact copies ~350,000 of them)."""
    return Placed(
        stage.first,
        stage.last,
        stage.devices,
        stage.fwd,
        stage.bwd,
        stage.inp,
        stage.wgt,
        stage.allreduce,
        stage.static,
        stage.act,
        stage.memory,
        stage.arrive,
        stage.fwd_in,
        stage.bwd_out,
        stage.chain,
        stage.chain_split,
    )


def follow(stage: Placed, prev: Placed, fwd_in: float, bwd_out: float) -> None:
    """Put `stage` after `prev` with these transfers: its arrival and its chains down to stage 0."""
    stage.fwd_in, stage.bwd_out = fwd_in, bwd_out
    stage.arrive = prev.arrive + prev.fwd + fwd_in
    stage.chain = stage.bwd + bwd_out + prev.chain
    stage.chain_split = stage.inp + bwd_out + prev.chain_split
