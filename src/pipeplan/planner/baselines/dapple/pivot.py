"""DAPPLE's iteration latency (the paper's §IV model): warm-up, steady phase at the pivot stage, ending phase.

A pipeline of S stages (transfers between stages entered as stages of their
own, forward and backward both the transfer time) runs M microbatches; F_s,
B_s are one microbatch's forward and backward on stage s, AR_s its gradient
all-reduce. The pivot Q is the stage whose steady phase decides the
iteration: start with the last stage, and walking towards the first, a stage
s becomes the pivot when (M-1)(F_s+B_s) exceeds (M-1)(F_Q+B_Q) plus the work
of one microbatch on the stages after s up to Q. Then

    L = T_w + T_s + T_e
    T_w = Σ_{s<=Q} F_s                       (the first microbatch reaches Q)
    T_s = (M-1) (F_Q + B_Q)                  (Q busy with every other microbatch)
    T_e = max_s ( AR_s + Σ_{s<=t<=Q} B_t )   for s <= Q: the last backward still has to reach s
          max_s ( AR_s - Σ_{Q<t<s} B_t )     for s > Q: s finished its last backward before Q started its own
"""

from __future__ import annotations

from collections.abc import Sequence

from pipeplan.core.errors import PlanError


def pivot(fwd: Sequence[float], bwd: Sequence[float], microbatches: int) -> int:
    """The pivot stage Q (module docstring); ties keep the later stage."""
    q = len(fwd) - 1
    between = 0.0
    for s in range(len(fwd) - 2, -1, -1):
        between += fwd[s + 1] + bwd[s + 1]
        if (microbatches - 1) * (fwd[s] + bwd[s]) > (microbatches - 1) * (fwd[q] + bwd[q]) + between:
            q, between = s, 0.0
    return q


def latency(fwd: Sequence[float], bwd: Sequence[float], allreduce: Sequence[float], microbatches: int) -> tuple[float, int]:
    """(L, Q) of the module docstring.

    Raises:
        PlanError: lists of different lengths, an empty pipeline or fewer than one microbatch (naming the values).
    """
    if not (len(fwd) == len(bwd) == len(allreduce)) or not fwd:
        raise PlanError(f"latency needs equal, non-empty stage lists, got {len(fwd)}, {len(bwd)}, {len(allreduce)}")
    if microbatches < 1:
        raise PlanError(f"latency needs at least one microbatch, got {microbatches}")
    q = pivot(fwd, bwd, microbatches)
    warmup = sum(fwd[: q + 1])
    steady = (microbatches - 1) * (fwd[q] + bwd[q])
    ahead = sum(bwd[: q + 1])
    ending = float("-inf")
    for s in range(len(fwd)):
        ending = max(ending, allreduce[s] + ahead)
        ahead -= bwd[s]
    return warmup + steady + ending, q
