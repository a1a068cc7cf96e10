"""A floor under a simulated iteration, in closed form: what screens a candidate before it is simulated.

One stage per rank (chunks 1), any order of its actions (gpipe, 1f1b, kfkb, zb-h1, list orders), no bandwidth trace.
Stage s cannot start before the first activation reaches it (before_s: the forwards and unqueued transfers of the
stages in front); after that its rank runs all m forwards and m backwards one after the other. So its last backward
(I, for a split backward) ends no earlier than before_s + m (F_s + B_s); that microbatch's gradient then passes
every stage below it, each backward (I) and unqueued transfer in turn, and stage 0 ends with its W (split), its
all-reduce and its optimizer step. The rank's own work also ends with the stage's all-reduce and optimizer step.
The floor is the largest of these over the stages: for an even deep pipeline (p - 1 + m)(F + B), the fill and
drain included, which a busiest-rank or one-microbatch bound misses.
"""

from __future__ import annotations

from pipeplan.sim.cost.types import Costs, Flow


def unqueued_ms(flows: tuple[Flow, ...]) -> float:
    """A transfer's duration with every resource free: its slowest flow's latency and work."""
    return max((f.latency_ms + f.work_ms for f in flows), default=0.0)


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
    tail0 = w0 + first.allreduce_ms + first.optimizer_ms
    best = 0.0
    before = 0.0  # the first activation's arrival at stage s
    down = 0.0  # a gradient's path from stage s down to the end of stage 0's backward
    for s, c in enumerate(stages):
        if s > 0:
            before += stages[s - 1].fwd_ms + unqueued_ms(costs.forward[s - 1])
            down += chain[s - 1] + unqueued_ms(costs.backward[s - 1])
        through = before + microbatches * (c.fwd_ms + chain[s]) + down + tail0
        own = before + microbatches * (c.fwd_ms + whole[s]) + c.allreduce_ms + c.optimizer_ms
        best = max(best, through, own)
    return best
