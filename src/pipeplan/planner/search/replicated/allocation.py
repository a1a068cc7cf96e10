"""The replicated-pipeline seeds' allocation DP over (layers placed, GPUs used, GPUs taken), and two-stage splits.

pipeplan's own seed generator (search.replicated.seeds), derived from the earlier DAPPLE-paper reading; not the
`dapple` baseline.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pipeplan.core.hardware.cluster import Cluster
from pipeplan.core.partition import prefix_sums
from pipeplan.core.units import ms_per_byte
from pipeplan.planner.baselines.layer_groups import Blocks
from pipeplan.planner.search.replicated.placing import FRESH_FIRST, POLICIES, allocate_replicas
from pipeplan.sim.cost.holding import PLAIN, Holding
from pipeplan.sim.cost.layers import static_factor
from pipeplan.sim.cost.link_model import link_matrices

Devices = tuple[int, ...]
StagePlan = tuple[tuple[int, int, Devices], ...]
Used = tuple[int, ...]  # GPUs taken per machine
Placed = tuple[Devices, Used]


class ReplicaSearch:
    """Layer sums, link terms and the allocation DP of the replicated seeds over one profile (in blocks) and cluster.

    Times are ms for one profile batch per pipeline replica (every term scales
    with the microbatch size alike, so the DP's choice does not depend on it).
    """

    def __init__(self, blocks: Blocks, cluster: Cluster, optimizer_factor: float, held: Holding = PLAIN) -> None:
        self.blocks = blocks
        self.profile = blocks.profile
        self.cluster = cluster
        self.num_blocks = self.profile.num_layers
        self.num_devices = cluster.num_devices
        by_node: dict[int, list[int]] = {}
        for d in cluster.devices:
            by_node.setdefault(d.node, []).append(d.id)
        self.nodes = sorted((sorted(ids) for ids in by_node.values()), key=lambda ids: ids[0])
        self.node_size = max(len(n) for n in self.nodes)
        self._sizes = [len(n) for n in self.nodes]
        self._grid = np.asarray(self.nodes, dtype=np.int64) if len(set(self._sizes)) == 1 else None
        self._ints: list[int] = [0] * (max(d.id for d in cluster.devices) + 1)
        for ids in self.nodes:
            for d in ids:
                self._ints[d] = d  # the objects the placements share
        self._fwd = prefix_sums(layer.fwd_ms for layer in self.profile.layers)
        self._bwd = prefix_sums(layer.bwd_ms for layer in self.profile.layers)
        self._params = prefix_sums(layer.param_bytes for layer in self.profile.layers)
        self._static = static_factor(optimizer_factor, held)
        self.grads = held.grads  # gradient bytes the all-reduce moves per parameter byte (sim.cost.holding)
        self._speed = np.asarray([d.speed for d in cluster.devices])
        self._memory = np.asarray([d.memory_bytes for d in cluster.devices])
        rates, latency = link_matrices(cluster)
        self._machine_of = np.zeros(cluster.num_devices, dtype=int)
        for m, ids in enumerate(self.nodes):
            self._machine_of[ids] = m
        row_min = np.stack([rates[ids].min(axis=0) for ids in self.nodes])  # machine x device
        self._machine_pair_min = np.stack([row_min[:, ids].min(axis=1) for ids in self.nodes], axis=1)
        np.fill_diagonal(self._machine_pair_min, np.inf)
        between = self._machine_pair_min[np.isfinite(self._machine_pair_min)]
        self._between_uniform = float(between.min()) if len(between) and between.min() == between.max() else None
        intra = [rates[np.ix_(ids, ids)][~np.eye(len(ids), dtype=bool)] for ids in self.nodes]
        self._intra_min = np.asarray([x.min() if len(x) else np.inf for x in intra])
        self._intra_alike = np.asarray([len(x) == 0 or x.min() == x.max() for x in intra])
        self._latency = latency
        self._rates = rates
        self._device_stats: dict[Devices, tuple[float, float]] = {}
        self._terms: dict[tuple[Devices, Devices, int], tuple[tuple[float, float], ...]] = {}
        self._slowest: dict[Devices, float] = {}
        self._alloc: dict[tuple[Used, int, int, str], Placed | None] = {}
        self.empty = (0,) * len(self.nodes)

    # -- sums over blocks first..last ------------------------------------------------------------
    def fwd(self, first: int, last: int) -> float:
        """Forward ms of blocks first..last for one profile batch."""
        return self._fwd[last + 1] - self._fwd[first]

    def bwd(self, first: int, last: int) -> float:
        """Backward ms of blocks first..last for one profile batch."""
        return self._bwd[last + 1] - self._bwd[first]

    def params(self, first: int, last: int) -> float:
        """Parameter bytes of blocks first..last."""
        return self._params[last + 1] - self._params[first]

    def cut(self, last: int) -> float:
        """Bytes crossing the cut after block `last` for one profile batch."""
        return self.profile.cut_bytes[last]  # type: ignore[index]

    # -- devices ------------------------------------------------------------------------------------
    @staticmethod
    def _memo(table: dict, key: tuple, compute: Callable[[], Any]) -> Any:
        """table[key], computed once."""
        value = table.get(key)
        if value is None:
            value = table[key] = compute()
        return value

    def _stats(self, devices: Devices) -> tuple[float, float]:
        def compute() -> tuple[float, float]:
            index = np.asarray(devices)
            return float(self._speed[index].min()), float(self._memory[index].min())

        return self._memo(self._device_stats, (devices,), compute)  # type: ignore[no-any-return]

    def speed(self, devices: Devices) -> float:
        """The slowest device's speed."""
        return self._stats(devices)[0]

    def memory(self, devices: Devices) -> float:
        """The smallest device memory in bytes."""
        return self._stats(devices)[1]

    def slowest_bytes_per_ms(self, devices: Devices) -> float:
        """B_slowest: the slowest link between two of `devices`, in bytes per ms (inf for one device).

        Over 16 devices, links between machines count by machine pair (the
        slowest link between any GPUs of the two machines; exact when links
        between two machines are alike), links inside a machine exactly (a
        machine whose links are all alike by its one rate, with no pairs built).
        """
        return self._memo(self._slowest, (devices,), lambda: self._slowest_of(devices))  # type: ignore[no-any-return]

    def _slowest_of(self, devices: Devices) -> float:
        """slowest_bytes_per_ms, computed."""
        index = np.asarray(devices)
        if len(devices) <= 16:
            rate = float(self._rates[np.ix_(index, index)].min())
        else:
            machines = self._machine_of[index]
            used, counts = np.unique(machines, return_counts=True)
            rate = np.inf
            if len(used) > 1:
                uniform = self._between_uniform
                rate = uniform if uniform is not None else float(self._machine_pair_min[np.ix_(used, used)].min())
            shared = used[counts > 1]  # machines holding two or more of the devices
            alike = self._intra_alike[shared]
            if alike.any():
                rate = min(rate, float(self._intra_min[shared[alike]].min()))
            if not alike.all():
                keep = np.isin(machines, shared[~alike])
                a, b = _pairs_inside(index[keep], machines[keep])
                rate = min(rate, float(self._rates[a, b].min()))
        return rate / 1000.0

    def link_terms(self, senders: Devices, receivers: Devices, replicas: int) -> tuple[tuple[float, float], ...]:
        """(latency ms, ms per byte) of every pair carrying a transfer between two stages, dominated ones dropped.

        Per pipeline replica, q = min(replicas of each side) pairs, replica t
        with replica t, each carrying 1/q of the bytes (split-concat).
        """
        return self._memo(self._terms, (senders, receivers, replicas), lambda: self._terms_of(senders, receivers, replicas))  # type: ignore[no-any-return]

    def _terms_of(self, senders: Devices, receivers: Devices, replicas: int) -> tuple[tuple[float, float], ...]:
        """link_terms, computed."""
        per_s, per_r = len(senders) // replicas, len(receivers) // replicas
        q = min(per_s, per_r)
        a = np.asarray(senders).reshape(replicas, per_s)[:, :q].ravel()
        b = np.asarray(receivers).reshape(replicas, per_r)[:, :q].ravel()
        rates = self._rates[a, b]
        if not rates.min() > 0:
            self.cluster.require_link(int(a[rates.argmin()]), int(b[rates.argmin()]))  # raises, naming the pair
        terms = set(zip(self._latency[a, b].tolist(), ms_per_byte(q * rates).tolist(), strict=True))
        ordered = sorted(terms, key=lambda x: (-x[1], -x[0]))
        kept: list[tuple[float, float]] = []
        for lat, slope in ordered:  # steepest first; keep a term only if its latency beats all steeper ones
            if not kept or lat > max(k[0] for k in kept):
                kept.append((lat, slope))
        return tuple(kept)

    def transfer_ms(self, senders: Devices, receivers: Devices, replicas: int, nbytes: float) -> float:
        """One transfer of nbytes between two stages (the slowest pair)."""
        return max(lat + nbytes * slope for lat, slope in self.link_terms(senders, receivers, replicas))

    def allocate(self, mask: Used, need: int, replicas: int, policy: str) -> Placed | None:
        """allocate_replicas over this cluster's machines, memoized."""
        key = (mask, need, replicas, policy)
        if key not in self._alloc:
            self._alloc[key] = allocate_replicas(self.nodes, mask, need, replicas, policy, self._sizes, self._grid, self._ints)
        return self._alloc[key]

    def placements(self, mask: Used, need: int, replicas: int) -> list[Placed]:
        """The distinct placements the three policies give (in policy order)."""
        out: list[Placed] = []
        for policy in POLICIES:
            got = self.allocate(mask, need, replicas, policy)
            if got is not None and all(got[0] != o[0] for o in out):
                out.append(got)
        return out

    def fits_static(self, first: int, last: int, devices: Devices) -> bool:
        """True when the stage's weights, gradients and optimizer state fit on its smallest device."""
        return self.params(first, last) * self._static <= self.memory(devices)

    # -- the dynamic program -----------------------------------------------------------------------
    def last_block_fitting(self, first: int, devices: Devices) -> int:
        """The last block j such that blocks first..j fit their static memory on `devices` (first - 1 if none)."""
        budget = self._params[first] + self.memory(devices) / self._static
        return bisect_right(self._params, budget * (1 + 1e-12)) - 2

    def allreduce_ms(self, first: int, ends: range, devices: Devices) -> np.ndarray:
        """The all-reduce estimate (placing.ring_allreduce_ms) of blocks first..j for every j in ends, over `devices` (ms)."""
        n = len(devices)
        if n < 2:
            return np.zeros(len(ends))
        weights = np.asarray(self._params[ends.start + 1 : ends.stop + 1]) - self._params[first]
        return 2.0 * (weights * self.grads) * (n - 1) / (n * self.slowest_bytes_per_ms(devices))

    def best_pipeline(self, gpus: int, replicas: int, counts: Sequence[int], batches: float) -> StagePlan | None:
        """Layers over exactly `gpus` GPUs per pipeline replica, minimizing the slowest block; None if none fits.

        DP over (u GPUs used, last block j): each cell keeps its best value, the
        GPUs taken and the last stage's GPUs. A new stage takes blocks k+1..j on
        mp GPUs per replica placed by each policy; its block is max(previous
        value, compute / (mp * speed) + all-reduce / batches, transfer of 2x the
        cut activation into it), `batches` being profile batches per pipeline
        replica per iteration.

        Note:
            The authors' code leaves the all-reduce out of the block (the term is
            commented out), which makes one stage over all GPUs always win the
            DP; here it enters spread over the iteration, as in the latency
            model's ending phase.
        """
        last = self.num_blocks - 1
        compute = np.asarray([f + b for f, b in zip(self._fwd, self._bwd, strict=True)])
        value = {u: np.full(self.num_blocks, np.inf) for u in range(1, gpus + 1)}
        back: dict[int, list[tuple[int, int] | None]] = {u: [None] * self.num_blocks for u in range(1, gpus + 1)}
        taken: dict[int, list[Placed]] = {u: [((), self.empty)] * self.num_blocks for u in range(1, gpus + 1)}

        def offer(u: int, ends: range, blocks: np.ndarray, prev: tuple[int, int] | None, got: Placed) -> None:
            target = value[u][ends.start : ends.stop]
            for i in np.flatnonzero(blocks < target).tolist():
                j = ends.start + i
                value[u][j] = blocks[i]
                back[u][j] = prev
                taken[u][j] = got

        for mp in counts:
            if mp > gpus:
                continue
            got = self.allocate(self.empty, mp, replicas, FRESH_FIRST) or (self.placements(self.empty, mp, replicas) or [None])[0]
            if got is None:
                continue
            stop = min(self.last_block_fitting(0, got[0]), last if mp == gpus else last - 1) + 1
            ends = range(last, stop) if mp == gpus else range(0, stop)
            comp = (compute[ends.start + 1 : ends.stop + 1] - compute[0]) / (mp * self.speed(got[0]))
            offer(mp, ends, comp + self.allreduce_ms(0, ends, got[0]) / batches, None, got)
        for u in range(1, gpus):
            for k in range(last):
                before_value = value[u][k]
                if not np.isfinite(before_value):
                    continue
                before, mask = taken[u][k]
                for mp in counts:
                    if u + mp > gpus:
                        break
                    for got in self.placements(mask, mp, replicas):
                        devices = got[0]
                        base = max(before_value, self.transfer_ms(before, devices, replicas, 2.0 * self.cut(k)))
                        fitting = self.last_block_fitting(k + 1, devices)
                        if u + mp == gpus:
                            ends = range(last, last + 1 if fitting >= last else last)
                        else:
                            ends = range(k + 1, min(fitting, last - 1) + 1)
                        if len(ends) == 0:
                            continue
                        comp = (compute[ends.start + 1 : ends.stop + 1] - compute[k + 1]) / (mp * self.speed(devices))
                        comp += self.allreduce_ms(k + 1, ends, devices) / batches
                        offer(u + mp, ends, np.maximum(comp, base), (k, u), got)
        if not np.isfinite(value[gpus][last]):
            return None
        stages: list[tuple[int, int, Devices]] = []
        u, j = gpus, last
        while True:
            prev = back[u][j]
            devices = taken[u][j][0]
            if prev is None:
                stages.append((0, j, devices))
                break
            stages.append((prev[0] + 1, j, devices))
            j, u = prev
        return tuple(reversed(stages))

    def two_stage_splits(self, first_gpus: int, batches: float) -> list[StagePlan]:
        """Two stages over all GPUs, first_gpus for the first: one plan per pair of placements.

        The layer cut of each is the one with the smallest slowest block (as in best_pipeline).
        """
        total, last = self.num_devices, self.num_blocks - 1
        compute = [f + b for f, b in zip(self._fwd, self._bwd, strict=True)]
        out: list[StagePlan] = []
        for devices1, mask in self.placements(self.empty, first_gpus, 1):
            for devices2, _ in self.placements(mask, total - first_gpus, 1):
                s1, s2 = self.speed(devices1), self.speed(devices2)
                best: tuple[float, int] | None = None
                for k in range(last):
                    if not (self.fits_static(0, k, devices1) and self.fits_static(k + 1, last, devices2)):
                        continue
                    ar1 = self.allreduce_ms(0, range(k, k + 1), devices1)[0]
                    ar2 = self.allreduce_ms(k + 1, range(last, last + 1), devices2)[0]
                    block = max(
                        (compute[k + 1] - compute[0]) / (first_gpus * s1) + ar1 / batches,
                        (compute[last + 1] - compute[k + 1]) / ((total - first_gpus) * s2) + ar2 / batches,
                        self.transfer_ms(devices1, devices2, 1, 2.0 * self.cut(k)),
                    )
                    if best is None or block < best[0]:
                        best = (block, k)
                if best is not None:
                    out.append(((0, best[1], devices1), (best[1] + 1, last, devices2)))
        return out


def _pairs_inside(devices: np.ndarray, machines: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every ordered pair (a, b), a != b, of `devices` on one machine (`machines[i]` is devices[i]'s), as two arrays."""
    order = np.argsort(machines, kind="stable")
    ids, owner = devices[order], machines[order]
    start = np.searchsorted(owner, owner, side="left")
    end = np.searchsorted(owner, owner, side="right")
    partner = start[:, None] + np.arange(int((end - start).max()))[None, :]
    valid = partner < end[:, None]
    a = np.broadcast_to(ids[:, None], partner.shape)[valid]
    b = ids[np.minimum(partner, len(ids) - 1)][valid]
    different = a != b
    return a[different], b[different]
