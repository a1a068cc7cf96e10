"""What exact's search reads besides its incumbent (Tables), built as it is first asked and kept for one request:
the stages' costs, the shape bounds, the best rings and the suffix table of each set of free devices, the cuts'
round trips, and the memos of exact.filled. The search and its pruning steps (filled, lookahead) take it as an
argument, with the best time so far; none of them reaches back into the search."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from pipeplan.core.errors import PipeplanError
from pipeplan.planner.bound.best_rings import MAX_DEVICES, Rings
from pipeplan.planner.bound.shape_bounds import ShapeBounds
from pipeplan.planner.bound.suffix_table import SuffixBound
from pipeplan.planner.exact.stages import StageCosts
from pipeplan.planner.request import PlanRequest
from pipeplan.sim.cost.link_model import pair_ms

NARROW_LAYERS = 600
"""Most layers for which exact keeps a suffix table per set of free devices (their rings' signature): above, one
table per shape serves every node (a table of 1,251 layers costs ~0.5 s, more than the nodes it would prune)."""

FILLS = 200_000
"""Most entries a memo keeps before it starts again (memory)."""


@dataclass(slots=True)
class Memos:
    """What exact.filled keeps of one search."""

    lead: tuple[tuple[str, int], ...]  # schedules in the order filled tries them: the last one that passed first
    best: float = math.inf  # the best time the answers hold under
    answers: dict[tuple[object, ...], bool] = field(default_factory=dict)  # without Tables.hop: (values of the
    # stages, m, the table, n, the last stage's last layer, the end) -> filled
    bounds: dict[tuple[object, ...], dict[tuple[object, ...], float]] = field(default_factory=dict)  # (the
    # stages' times, m, split) -> (schedule, k, p, rest, finish) -> fill_bound
    rooms: dict[tuple[object, ...], dict[tuple[str, int, int], bool]] = field(default_factory=dict)  # (the
    # stages' static, act and memory, m) -> (schedule, k, p) -> fits
    rests: dict[tuple[object, ...], float] = field(default_factory=dict)  # filled.least_rest
    tails: dict[tuple[object, ...], dict[tuple[str, int], tuple[bool, float, float]]] = field(default_factory=dict)

    def forget(self) -> None:
        """Start the memos of values again when one has grown past FILLS entries."""
        if max(len(self.bounds), len(self.rests), len(self.tails)) > FILLS:
            for memo in (self.bounds, self.rooms, self.rests, self.tails):
                memo.clear()


@dataclass(frozen=True, slots=True)
class Tables:
    """The tables of one request (tables_for); only their caches grow."""

    request: PlanRequest
    schedules: tuple[tuple[str, int], ...]  # (name, k) exact tries, in its order
    layers: int
    costs: StageCosts
    bounds: ShapeBounds
    narrow: bool  # tables per set of free devices (no twins, at most best_rings.MAX_DEVICES devices, NARROW_LAYERS)
    memos: Memos
    rings: dict[tuple[int, ...], Rings] = field(default_factory=dict)  # free devices -> their rings
    suffixes: dict[tuple[object, ...], SuffixBound] = field(default_factory=dict)  # (shape, ring signature) -> table
    by_free: dict[tuple[object, ...], SuffixBound] = field(default_factory=dict)  # (shape, free) -> table
    shared: dict[object, tuple[np.ndarray, ...]] = field(default_factory=dict)  # SuffixBound's grids of the request
    hops: dict[tuple[object, ...], float] = field(default_factory=dict)  # (src, last, q, free, size) -> hop

    def table(self, shape: tuple[int, int, int], free: tuple[int, ...]) -> SuffixBound:
        """The suffix table of a shape for stages on `free` only: its rings are the best those devices allow."""
        if not self.narrow:
            free = ()
        got = self.by_free.get((shape, free))
        if got is not None:
            return got
        rings = self.rings_of(free)
        key = (shape, rings.signature())
        got = self.suffixes.get(key)
        if got is None:
            got = self.suffixes[key] = SuffixBound(self.bounds, rings, *shape, self.schedules, self.shared)
        self.by_free[shape, free] = got
        return got

    def rings_of(self, free: tuple[int, ...]) -> Rings:
        """The best rings the devices `free` allow (those of the whole cluster unless tables are per free set)."""
        if not self.narrow:
            free = ()
        got = self.rings.get(free)
        if got is None:
            got = self.rings[free] = Rings(self.bounds, free or None)
        return got

    def hop(self, src: int, last: int, q: int, left: tuple[int, ...], size: int) -> float:
        """The least time of the cut after `last` from `src` to a device of `left` and back, in 1/q of its bytes: at
        most the next stage's transfer in and the gradient's transfer out of its first pair (StageCosts.transfer
        splits the bytes over at most q pairs and takes the slowest)."""
        key = (src, last, q, left, size)
        got = self.hops.get(key)
        if got is None:
            cluster = self.request.cluster
            nbytes = self.request.model.layers.cut_bytes(last, size) / q
            times = []
            for d in left:
                try:
                    times.append(pair_ms(cluster, src, d, nbytes) + pair_ms(cluster, d, src, nbytes))
                except PipeplanError:  # no link: that device cannot follow src
                    continue
            got = self.hops[key] = min(times, default=0.0)
        return got


def tables_for(request: PlanRequest, schedules: tuple[tuple[str, int], ...], classes: tuple[int, ...] = ()) -> Tables:
    """The tables of a request searched under `schedules`; `classes`: its devices' twin classes (one class each when
    no two devices are twins: then suffix tables are kept per set of free devices, where that is cheap)."""
    n, layers = request.cluster.num_devices, request.profile.num_layers
    return Tables(
        request,
        schedules,
        layers,
        StageCosts(request),
        ShapeBounds(request),
        len(set(classes)) == n <= MAX_DEVICES and layers <= NARROW_LAYERS,
        Memos(schedules),
    )
