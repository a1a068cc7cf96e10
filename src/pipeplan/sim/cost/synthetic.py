"""The synthetic cost form: per-stage F, B (or I, W), per-boundary transfer times, per-stage activation bytes."""

from __future__ import annotations

from collections.abc import Sequence

from pipeplan.core.checks import check_nonneg_float
from pipeplan.core.errors import CostError
from pipeplan.core.limits import MAX_BYTES, MAX_MS
from pipeplan.core.schedule import Schedule
from pipeplan.sim.cost.types import Costs, Flow, StageCost

Value = float | int | Sequence[float | int]
"""One number for every stage (boundary), or one per stage (boundary)."""


def spread(field: str, value: Value, count: int, what: str) -> tuple[float, ...]:
    """Expand `value` to `count` checked numbers, one per `what` (stage or boundary).

    Raises:
        CostError: a negative, NaN or infinite number, one beyond its magnitude limit (MAX_BYTES for act_bytes, else
            MAX_MS), or a list of the wrong length, naming `field` and the value.
    """
    most = MAX_BYTES if field == "act_bytes" else MAX_MS
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (check_nonneg_float(CostError, field, value, most),) * count
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise CostError(f"{field} must be a number or a list of numbers, got {value!r}")
    if len(value) != count:
        raise CostError(f"{field} must have {count} values (one per {what}), got {len(value)}: {list(value)!r}")
    return tuple(check_nonneg_float(CostError, f"{field}[{i}]", v, most) for i, v in enumerate(value))


def uniform_costs(
    schedule: Schedule,
    fwd: Value,
    bwd: Value,
    comm: Value = 0.0,
    act_bytes: Value = 0.0,
    bwd_input: Value | None = None,
    bwd_weight: Value | None = None,
) -> Costs:
    """Costs for `schedule` from per-stage times, with each rank standing for one device.

    Every argument is one number (all stages) or a list: one per schedule stage
    (for interleaved schedules a stage is one chunk), `comm` one per stage
    boundary. The activation of boundary b goes from the rank of stage b to the
    rank of stage b+1 as one flow on resource "pair:{src}->{dst}" taking
    comm[b] ms (no latency); its gradient goes back on the reverse ordered pair
    in the same time. Stages on the same rank exchange nothing. `act_bytes` is
    each stage's saved bytes per in-flight microbatch; no static memory.

    Args:
        schedule: the schedule the costs are for (its stage count and placement).
        fwd, bwd: forward and full-backward ms per microbatch.
        comm: transfer ms per boundary.
        act_bytes: saved bytes per microbatch per stage.
        bwd_input, bwd_weight: the I/W split of bwd for zero-bubble schedules (default half each).

    Raises:
        CostError: a bad value or length, naming the argument and value.
    """
    stages = schedule.num_stages
    boundaries = stages - 1
    fwd_ms = spread("fwd", fwd, stages, "stage")
    bwd_ms = spread("bwd", bwd, stages, "stage")
    comm_ms = spread("comm", comm, boundaries, "stage boundary")
    saved = spread("act_bytes", act_bytes, stages, "stage")
    inputs = spread("bwd_input", bwd_input, stages, "stage") if bwd_input is not None else (None,) * stages
    weights = spread("bwd_weight", bwd_weight, stages, "stage") if bwd_weight is not None else (None,) * stages
    stage_costs = tuple(StageCost(fwd_ms[s], bwd_ms[s], inputs[s], weights[s], saved_bytes=saved[s]) for s in range(stages))
    ranks = schedule.stage_to_rank
    forward = tuple(_pair_transfer(ranks[b], ranks[b + 1], comm_ms[b]) for b in range(boundaries))
    backward = tuple(_pair_transfer(ranks[b + 1], ranks[b], comm_ms[b]) for b in range(boundaries))
    return Costs(stage_costs, forward, backward)


def _pair_transfer(src: int, dst: int, ms: float) -> tuple[Flow, ...]:
    if src == dst:
        return ()
    return (Flow((f"pair:{src}->{dst}",), (src, dst), 0.0, ms),)


def chunk_share(value: float, schedule: Schedule) -> float:
    """A rank's whole-stage cost as the share of each of its chunk-stages (1/v of it; the value itself when v = 1)."""
    return value / (schedule.num_stages // schedule.num_ranks)


def rank_costs(schedule: Schedule, fwd: float, bwd: float, comm: float = 0.0, act_bytes: float = 0.0) -> Costs:
    """uniform_costs from one number per rank's whole stage: each of a rank's v chunk-stages gets 1/v of fwd, bwd and
    act_bytes; `comm` is every boundary's transfer ms, never split (a chunk's activation is as large as a stage's).

    Raises:
        CostError: a bad value, naming the argument.
    """
    return uniform_costs(
        schedule,
        fwd=chunk_share(fwd, schedule),
        bwd=chunk_share(bwd, schedule),
        comm=comm,
        act_bytes=chunk_share(act_bytes, schedule),
    )
