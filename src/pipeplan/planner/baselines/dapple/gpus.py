"""DAPPLE's GPU placement: machines of GPUs and the three policies that pick a stage's GPUs.

The paper (Fan et al., PPoPP 2021, §IV) and its planner (HPGO,
`environment/device.rs`) place each stage's GPUs by one of:
- Fresh First: GPUs of machines nothing is placed on yet, machine after
  machine (a stage's all-reduce stays inside a machine);
- Append First: GPUs of machines already partly used (neighbouring stages
  share a machine, so their transfers stay inside it);
- Scatter First: one GPU from each machine with a free one, round after round.
A stage replicated over rp pipeline replicas is placed replica by replica,
each with any of the three policies (3^rp sequences, distinct results kept).
GPUs are DAPPLE indices 0..N-1, machine after machine; GPU sets are bitmasks.
Inside a machine the lowest free index goes first.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeplan.core.hardware.cluster import Cluster
from pipeplan.sim.cost.link_model import device_nodes

FRESH_FIRST = "fresh-first"
APPEND_FIRST = "append-first"
SCATTER_FIRST = "scatter-first"
POLICIES = (FRESH_FIRST, APPEND_FIRST, SCATTER_FIRST)


@dataclass(frozen=True)
class Machines:
    """GPUs 0..n-1 grouped into machines: `ends[i]` is one past machine i's last GPU (HPGO's `seps`)."""

    ends: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.ends or any(b <= a for a, b in zip((0, *self.ends), self.ends, strict=False)):
            raise ValueError(f"machine ends must strictly increase from above 0, got {list(self.ends)}")
        starts = (0, *self.ends[:-1])
        owner = np.repeat(np.arange(len(self.ends)), np.diff((0, *self.ends)))
        object.__setattr__(self, "_starts", starts)
        object.__setattr__(self, "_owner", tuple(owner.tolist()))  # Python ints: machine_of is on hot paths
        masks = tuple(((1 << (b - a)) - 1) << a for a, b in zip(starts, self.ends, strict=True))
        object.__setattr__(self, "_masks", masks)

    @property
    def gpus(self) -> int:
        """Number of GPUs."""
        return self.ends[-1]

    @property
    def masks(self) -> tuple[int, ...]:
        """Each machine's GPUs as a bitmask, machine after machine."""
        return self._masks  # type: ignore[attr-defined,no-any-return]

    @property
    def largest(self) -> int:
        """GPUs of the largest machine."""
        return max(b - a for a, b in zip((0, *self.ends), self.ends, strict=False))

    def span(self, i: int) -> range:
        """GPU indices of machine i."""
        return range(self._starts[i], self.ends[i])  # type: ignore[attr-defined]

    def machine_of(self, gpu: int) -> int:
        """The machine holding `gpu`."""
        return self._owner[gpu]  # type: ignore[attr-defined,no-any-return]

    def within_one(self, gpus: int) -> bool:
        """True when the GPUs of bitmask `gpus` (non-empty) lie on one machine (HPGO decides by lowest and highest)."""
        low = (gpus & -gpus).bit_length() - 1
        return self.machine_of(low) == self.machine_of(gpus.bit_length() - 1)

    def on_machine(self, gpus: int, machine: int) -> int:
        """How many GPUs of bitmask `gpus` lie on `machine`."""
        span = self.span(machine)
        return (gpus >> span.start & ((1 << len(span)) - 1)).bit_count()


def machines_of(cluster: Cluster) -> tuple[Machines, tuple[int, ...]]:
    """The cluster's machines (Device.node) and, per DAPPLE index, its device id (machines by lowest device id)."""
    nodes = device_nodes(cluster)
    ids = [d.id for d in cluster.devices]
    first: dict[int, int] = {}
    for node, dev in zip(nodes.tolist(), ids, strict=True):
        first[node] = min(first.get(node, dev), dev)
    order = sorted(range(len(ids)), key=lambda i: (first[int(nodes[i])], ids[i]))
    ends, count, last = [], 0, None
    for i in order:
        if last is not None and nodes[i] != last:
            ends.append(count)
        count += 1
        last = nodes[i]
    ends.append(count)
    return Machines(tuple(ends)), tuple(ids[i] for i in order)


def place(machines: Machines, taken: int, need: int, policy: str) -> int | None:
    """The GPUs (bitmask) `policy` gives `need` more GPUs when `taken` are in use; None if it cannot."""
    free = [mask & ~taken for mask in machines.masks]
    picked, left = 0, need
    if policy == SCATTER_FIRST:
        if sum(f.bit_count() for f in free) < need:
            return None
        while left:  # one round: the lowest free GPU of each machine that has one, machine after machine
            for i, f in enumerate(free):
                if left and f:
                    low = f & -f
                    picked |= low
                    free[i] = f ^ low
                    left -= 1
        return picked
    want_fresh = policy == FRESH_FIRST
    for f, mask in zip(free, machines.masks, strict=True):
        if not left:
            break
        if (f == mask) == want_fresh:
            if f.bit_count() <= left:
                picked |= f
                left -= f.bit_count()
            else:  # the lowest `left` free GPUs of this machine
                while left:
                    low = f & -f
                    picked |= low
                    f ^= low
                    left -= 1
    return picked if left == 0 else None


def placements(machines: Machines, taken: int, need: int) -> list[int]:
    """The distinct placements of `need` GPUs after `taken`, in POLICIES order (the first policy giving each)."""
    out: list[int] = []
    for policy in POLICIES:
        gpus = place(machines, taken, need, policy)
        if gpus is not None and gpus not in out:
            out.append(gpus)
    return out


def replica_placements(machines: Machines, taken: int, need: int, replicas: int) -> dict[int, tuple[int, ...]]:
    """Every distinct GPU set (bitmask, all replicas) of `need` GPUs for each of `replicas` replicas placed in turn,
    each by any policy: set -> its replicas' GPUs, from the first policy sequence (POLICIES order) giving it."""
    frontier: dict[int, tuple[int, ...]] = {taken: ()}
    for _ in range(replicas):
        grown: dict[int, tuple[int, ...]] = {}
        for mask, parts in frontier.items():
            for gpus in placements(machines, mask, need):
                grown.setdefault(mask | gpus, (*parts, gpus))
        frontier = grown
    return {mask & ~taken: parts for mask, parts in frontier.items()}
