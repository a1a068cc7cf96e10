"""What the controller observes after an iteration: per-stage compute and every transfer, as plain numbers."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipeplan.core.errors import AdaptError
from pipeplan.core.hardware.links import Link, is_link


def _check_time(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise AdaptError(f"{field} must be a finite number, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class Transfer:
    """One message that crossed `link` (src device, dst device): `nbytes` bytes, from start_ms to end_ms.

    Times are on one clock that runs across the whole run (ms); only their
    differences and their order on a link matter. start_ms is when the
    sender handed the message over; when an earlier message on the same link
    was still in flight, the controller counts the wire time from that one's
    end (transfers on a link queue first-come first-served).
    """

    link: Link
    nbytes: float
    start_ms: float
    end_ms: float

    def __post_init__(self) -> None:
        if not is_link(self.link):
            raise AdaptError(f"transfer link must be two different device ids (src, dst), got {self.link!r}")
        nbytes = _check_time("transfer nbytes", self.nbytes)
        if nbytes < 0:
            raise AdaptError(f"transfer nbytes must be >= 0, got {self.nbytes!r}")
        start = _check_time("transfer start_ms", self.start_ms)
        end = _check_time("transfer end_ms", self.end_ms)
        if end < start:
            raise AdaptError(f"transfer on {list(self.link)} ends at {end} ms, before it starts at {start} ms")


@dataclass(frozen=True, slots=True)
class Collective:
    """The data-parallel all-reduce of one stage's gradients as measured (the stage's replicas, and the same stage
    of every pipeline copy, summing them): it ran from start_ms to end_ms on the transfers' clock."""

    stage: int
    start_ms: float
    end_ms: float

    def __post_init__(self) -> None:
        if isinstance(self.stage, bool) or not isinstance(self.stage, int) or self.stage < 0:
            raise AdaptError(f"collective stage must be an integer >= 0, got {self.stage!r}")
        start = _check_time("collective start_ms", self.start_ms)
        if _check_time("collective end_ms", self.end_ms) < start:
            raise AdaptError(f"collective of stage {self.stage} ends at {self.end_ms} ms, before it starts at {start} ms")


@dataclass(frozen=True, slots=True)
class IterationObservation:
    """What one iteration measured: the k it ran with, its time, per-stage compute and its transfers.

    `stage_fwd_ms` / `stage_bwd_ms`: per-microbatch forward and full-backward
    ms of each stage, averaged over the iteration (empty: not measured; the
    controller keeps the costs it was built with). `start_ms` is the
    iteration's start on the transfers' clock (the iteration ends at
    start_ms + iteration_ms). `collectives`: the data-parallel all-reduces of
    the iteration (empty: none, or not measured).
    """

    index: int
    k: int
    iteration_ms: float
    stage_fwd_ms: tuple[float, ...] = ()
    stage_bwd_ms: tuple[float, ...] = ()
    transfers: tuple[Transfer, ...] = ()
    start_ms: float = 0.0
    collectives: tuple[Collective, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.index, bool) or not isinstance(self.index, int) or self.index < 0:
            raise AdaptError(f"observation index must be an integer >= 0, got {self.index!r}")
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise AdaptError(f"observation k must be an integer >= 1, got {self.k!r}")
        if _check_time("observation iteration_ms", self.iteration_ms) <= 0:
            raise AdaptError(f"observation iteration_ms must be > 0, got {self.iteration_ms!r}")
        _check_time("observation start_ms", self.start_ms)
        for name in ("stage_fwd_ms", "stage_bwd_ms"):
            for s, value in enumerate(getattr(self, name)):
                if _check_time(f"observation {name}[{s}]", value) < 0:
                    raise AdaptError(f"observation {name}[{s}] must be >= 0, got {value!r}")
        if len(self.stage_fwd_ms) != len(self.stage_bwd_ms):
            raise AdaptError(
                f"observation has {len(self.stage_fwd_ms)} stage_fwd_ms but {len(self.stage_bwd_ms)} stage_bwd_ms values"
            )

    @property
    def end_ms(self) -> float:
        """When the iteration ended on the transfers' clock."""
        return self.start_ms + self.iteration_ms
