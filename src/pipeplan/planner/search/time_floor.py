"""A floor under a simulated iteration, in closed form: what screens a candidate before it is simulated.

One stage per rank (chunks 1), any order of its actions (gpipe, 1f1b, kfkb, zb-h1, list orders), no bandwidth trace.
Stage s cannot start before the first activation reaches it (before_s: the forwards and unqueued transfers of the
stages in front); after that its rank runs all m forwards and m backwards one after the other. So its last backward
(I, for a split backward) ends no earlier than before_s + m (F_s + B_s); that microbatch's gradient then passes
every stage below it, each backward (I) and unqueued transfer in turn, and stage 0 ends with its W (split), its
all-reduce and its optimizer step. The rank's own work also ends with the stage's all-reduce and optimizer step
(a bucketed all-reduce counts 0 in both: its buckets may overlap the backward).
The floor is the largest of these over the stages: for an even deep pipeline (p - 1 + m)(F + B), the fill and
drain included, which a busiest-rank or one-microbatch bound misses.

PassFloor is the other kind: one floor for a whole family of plans (any cuts, devices, microbatch size or schedule),
from one microbatch's pass through every layer and its stage boundaries; what tells a search that nothing it could
derive from its straight pipelines beats a time already known.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipeplan.core.units import wire_ms
from pipeplan.sim.cost.link_model import link_arrays
from pipeplan.sim.cost.model import CostModel
from pipeplan.sim.cost.types import Costs, Flow, StageCost


def unqueued_ms(flows: tuple[Flow, ...]) -> float:
    """A transfer's duration with every resource free: its slowest flow's latency and work."""
    return max((f.latency_ms + f.work_ms for f in flows), default=0.0)


def after_backward_ms(cost: StageCost) -> float:
    """The part of a stage's all-reduce sure to run after its last backward: all of it, or none when bucketed (its
    buckets may run while the backward does, sim.engine.simulator.bucket_spans)."""
    return 0.0 if cost.allreduce_buckets else cost.allreduce_ms


def chain_floor(costs: Costs, microbatches: int, split: bool) -> float:
    """The floor (module docstring) on one iteration of `microbatches` under `costs`, one stage per rank; `split`:
    the backward runs as I then W (bwd_input_ms and bwd_weight_ms; None splits bwd_ms in halves)."""
    stages = costs.stages
    chain: list[float] = []  # the backward that passes the gradient on: B, or I when split
    whole: list[float] = []  # all backward work per microbatch: B, or I + W
    for c in stages:
        if split:
            i = c.bwd_ms / 2 if c.bwd_input_ms is None else c.bwd_input_ms
            w = c.bwd_ms / 2 if c.bwd_weight_ms is None else c.bwd_weight_ms
            chain.append(i)
            whole.append(i + w)
        else:
            chain.append(c.bwd_ms)
            whole.append(c.bwd_ms)
    first = stages[0]
    w0 = whole[0] - chain[0]
    tail0 = w0 + after_backward_ms(first) + first.optimizer_ms
    best = 0.0
    before = 0.0  # the first activation's arrival at stage s
    down = 0.0  # a gradient's path from stage s down to the end of stage 0's backward
    for s, c in enumerate(stages):
        if s > 0:
            before += stages[s - 1].fwd_ms + unqueued_ms(costs.forward[s - 1])
            down += chain[s - 1] + unqueued_ms(costs.backward[s - 1])
        through = before + microbatches * (c.fwd_ms + chain[s]) + down + tail0
        own = before + microbatches * (c.fwd_ms + whole[s]) + after_backward_ms(c) + c.optimizer_ms
        best = max(best, through, own)
    return best


class PassFloor:
    """A floor under every plan of a family, whatever its cuts, devices, microbatch size or schedule: one microbatch's
    pass (no bandwidth trace).

    The family: one device per stage in each pipeline replica, a microbatch size among `sizes`, and at least c + 1
    stages on c + 1 different devices in a row (`at(c)`: c crossings each way). Microbatch 0 runs every layer's
    forward, then the part of every backward that passes the gradient on (B, or I when split: the least of the two
    per layer), one after the other, each on a device no faster than the fastest; and it crosses c boundaries
    forward and c back, at distinct cuts (a cut is after one layer), each no shorter than the least latency plus the
    cut's bytes over the fastest link (one pair carries all of them with one device per stage). The iteration ends
    no earlier than that pass: at(c) = the per-layer least over `sizes` of F + min(B, I), summed, over the fastest
    speed, plus twice the c cheapest crossings. Straight pipelines (one device per stage, all of them) and all that
    the search derives from one (schedules, interleaving, other devices, cuts or microbatch sizes) are such a family.
    """

    def __init__(self, model: CostModel, sizes: Sequence[int]) -> None:
        layers, cluster = model.layers, model.cluster
        compute = []
        for b in sizes:
            arrays = layers.arrays(b)
            if model.bwd_split is not None:
                gradient = arrays.bwd * model.bwd_split[0]
            else:
                gradient = arrays.bwd / 2 if arrays.bwd_input is None else arrays.bwd_input  # as StageCost halves B
            compute.append(arrays.fwd + np.minimum(arrays.bwd, gradient))
        speed = max(d.speed for d in cluster.devices)
        self.compute_ms = float(np.min(compute, axis=0).sum()) / speed
        cuts = model.profile.num_layers - 1
        least = np.array([min(layers.cut_bytes(cut, b) for b in sizes) for cut in range(cuts)], dtype=float)
        crossings = np.zeros(0)
        if cluster.num_devices > 1 and cuts > 0:
            rate, latency = link_arrays(cluster)
            crossings = np.sort(latency.off_diagonal_min() + wire_ms(least, rate.off_diagonal_max()))
        self.cheapest_ms = np.concatenate(([0.0], np.cumsum(crossings)))  # the c cheapest crossings, c = 0.. cuts

    def at(self, crossings: int) -> float:
        """The floor (class docstring) of a plan with `crossings` boundary crossings each way (at most every cut)."""
        return self.compute_ms + 2 * float(self.cheapest_ms[min(crossings, len(self.cheapest_ms) - 1)])


def resource_floor(costs: Costs, microbatches: int, split: bool) -> float:
    """A floor from the links' queues (one stage per rank, no bandwidth trace): a flow holds all its resources until
    it ends, first come first served, so the flows on one resource run one after another. Each of the m microbatches
    sends every transfer once, so a resource is busy at least m x the latency and work of every flow on it. It can
    start no earlier than the first forward's end on the first stage that sends over it, and the transfer that ends
    last on it still leaves its receiving stage t a backward (B, or I), the gradient's path down to stage 0, and stage
    0's W, its all-reduce (none when bucketed: buckets may overlap the backward) and its optimizer step. 0.0 without
    transfers."""
    stages = costs.stages
    chain = [(c.bwd_ms / 2 if c.bwd_input_ms is None else c.bwd_input_ms) if split else c.bwd_ms for c in stages]
    first = stages[0]
    w0 = ((first.bwd_ms / 2 if first.bwd_weight_ms is None else first.bwd_weight_ms) if split else 0.0) or 0.0
    tail0 = w0 + after_backward_ms(first) + first.optimizer_ms
    released: list[float] = []  # per stage s: the end of its first forward, at the earliest
    after: list[float] = []  # per stage t: what must run once a transfer into it has ended
    before = down = 0.0
    for s, c in enumerate(stages):
        if s > 0:
            before += stages[s - 1].fwd_ms + unqueued_ms(costs.forward[s - 1])
            down += chain[s - 1] + unqueued_ms(costs.backward[s - 1])
        released.append(before + c.fwd_ms)
        after.append(chain[s] + down + tail0)
    busy: dict[str, float] = {}
    start: dict[str, float] = {}
    end: dict[str, float] = {}
    for b in range(len(stages) - 1):  # both directions of boundary b: sent once stage b's first forward has ended
        for flows, receiver in ((costs.forward[b], b + 1), (costs.backward[b], b)):
            for f in flows:
                for r in f.resources:
                    busy[r] = busy.get(r, 0.0) + (f.latency_ms + f.work_ms)
                    start[r] = min(start.get(r, released[b]), released[b])
                    end[r] = min(end.get(r, after[receiver]), after[receiver])
    return max((start[r] + microbatches * busy[r] + end[r] for r in busy), default=0.0)
