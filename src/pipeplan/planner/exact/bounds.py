"""Lower bounds exact prunes with, from placed stages: on any completion of a partial plan, and on a complete plan
under a schedule. Each only drops what the simulator adds (queues, bubbles); tests/test_exact.py checks them
against the simulation on random plans."""

from __future__ import annotations

from pipeplan.planner.exact.stages import Placed


def compute_bound(stage: Placed, m: int) -> float:
    """The stage's first input, its m forwards and backwards, its all-reduce: nondecreasing in its last layer."""
    return stage.arrive + m * (stage.fwd + min(stage.bwd, stage.inp + stage.wgt)) + stage.allreduce


def placed_bound(stage: Placed, prev: Placed | None, m: int) -> float:
    """A bound every completion and schedule obeys, from a stage and the ones before it.

    Its compute after its first input, then its all-reduce; and the m transfers on its slowest link in each
    direction, each followed by the last microbatch's way down to stage 0 and stage 0's all-reduce.
    """
    bound = compute_bound(stage, m)
    if prev is not None:
        down = stage.inp + prev.chain_split
        bound = max(
            bound,
            prev.arrive + prev.fwd + m * stage.fwd_in + stage.fwd + down,
            stage.arrive + stage.fwd + stage.inp + m * stage.bwd_out + prev.chain_split,
        )
    return bound


def schedule_bound(stages: list[Placed], m: int, split: bool) -> float:
    """Lower bound on the iteration of these stages under a schedule (split: backward as I and W).

    The largest of: per stage, first input + m (F + B) + the longer of its all-reduce and (unsplit only) the
    gradient's way down from it; one microbatch's path forward and back; per boundary and direction, the m
    transfers on its slowest pair plus the way before and after them.
    """
    last = stages[-1]
    chain = [st.chain_split if split else st.chain for st in stages]
    part = [st.inp if split else st.bwd for st in stages]
    part[0] = min(stages[0].bwd, stages[0].inp + stages[0].wgt)  # stage 0 runs I and W of the last microbatch itself
    forward_end = last.arrive + last.fwd
    bound = forward_end + chain[-1]
    first_backward = forward_end  # earliest start of the first backward on stage s (scanned downwards)
    for s in range(len(stages) - 1, -1, -1):
        st = stages[s]
        tail = st.allreduce if split or s == 0 else max(st.allreduce, st.bwd_out + chain[s - 1])
        back = st.inp + st.wgt if split else st.bwd
        bound = max(
            bound,
            st.arrive + m * (st.fwd + back) + tail,
            first_backward + m * back + tail,  # every backward after the first one's earliest start
            first_backward + (m - 1) * st.fwd + back + tail,  # the last forward's way up and back
        )
        if s:
            rest_forward = forward_end - st.arrive  # F on s and every stage after it, with transfers
            prev = stages[s - 1]
            bound = max(bound, prev.arrive + prev.fwd + m * st.fwd_in + rest_forward + chain[-1])
            bound = max(bound, first_backward + part[s] + m * st.bwd_out + chain[s - 1])
            first_backward += part[s] + st.bwd_out
    return bound
