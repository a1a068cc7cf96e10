"""A proven lower bound on the iteration time of every plan of a request, under pipeplan's simulator.

The plans covered: every plan `sim.plan_sim.simulate_plan` scores for the request's profile, cluster and global
batch G with a synchronous schedule (gpipe, 1f1b, kfkb, zb-h1, interleaved-1f1b with any chunking, `list` with any
order), in any layer order of a DAG profile, that fits in memory: any number of pipeline replicas rp
(G = rp * m * b), any microbatch size b (the request's when it names one), any stages (contiguous layer ranges,
or chunk-stages several to a rank) on any devices, each stage on r devices per pipeline replica with r | b (r = 1
under `--replication pipelines`, and rp = 1 under `none`), devices left idle or not. For one shape (rp, b), with
m = G / (rp b), n = N // rp devices per pipeline and x = b / r samples per device, let a layer's costs at x
samples on a speed-1 device be F_i(x), B_i(x), its backward input and weight parts I_i(x), W_i(x) (half of B each
when not measured, or the cost model's bwd_split), its optimizer step O_i and its parameter bytes P_i;
B'_i = min(B_i, I_i + W_i), I'_i = min(I_i, B_i); s_max the fastest device's speed, S the speed of a pipeline's
devices added up (at most the n fastest, and at most all devices' over rp). Then every plan of that shape takes
at least the largest of:

1. compute: sum_i min_r r (m (F_i + B'_i)(b / r) + O_i) / S. Every device runs its rank's actions and its
   optimizer step one after another; the r devices of a stage each run the stage's actions at b / r samples and
   each step the stage's layers, and a device of speed s does speed-1 work w in w / s.
2. path: sum_i min_r F_i(b / r) / s_max + sum_i min_r I'_i(b / r) / s_max. One microbatch passes every layer's
   forward, then every layer's backward (at least its I part) from the last layer down.
   Joint: each layer has one width r_i that both sums above use, so for any w in [0, 1] the larger of the two
   is at least sum_i min_r (w a_i(r) + (1 - w) p_i(r)), with a_i(r) = r (m (F_i + B'_i)(b / r) + O_i) / S and
   p_i(r) = (F_i + I'_i)(b / r) / s_max; term 1 is the largest of that over MIXES weights and itself.
3. all-reduce: max_i min_r [m (F_i + B'_i)(b / r) / s_max + O_i / s_max + AR(P_i, r rp)]. The stage holding layer
   i ends its last backward (B or W) after all of its m forwards and backwards, then all-reduces its parameters
   (at least P_i bytes) over its r rp devices, then its rank steps the optimizer (at least O_i); AR(P, k) is the
   ring's 2 (k - 1) / k P / rate + 2 (k - 1) latency with the cluster's fastest link and least latency, or,
   for k above the largest node's device count, the fastest link and least latency between nodes (a ring
   over two nodes has a link between them), or the cluster's measured all-reduce; 0 for k = 1.
   Phases: no rank's backward starts before one microbatch's forward has passed every layer, and every rank's
   forwards end before one microbatch's whole backward path: term 1 also takes the largest convex combination
   of compute, path and these two (planner.bound.phase_term, where the argument is).
4. fill: the ranks' first layers are distinct, and a rank that starts at a later layer loses the path before it
   (planner.bound.fill_term, where the argument is).

A shape counts only when a pipeline's devices can hold every layer's weights, gradients and optimizer state once
(sum_i static_i <= the memory of its n largest devices) and every layer fits one device. The bound is the least,
over the shapes, of the largest of the four. Each term only drops what a simulated run adds: the engine runs a
rank's actions one at a time, a stage's all-reduce after its last backward, and the rank's optimizer step after
its all-reduces; transfers, queues and activation memory only add.

5. stages (`lower_bound(request, stages=True)`): for plans with one contiguous stage per rank only (every
   schedule but interleaving and chunked `list`), in the profile's own layer order, the least over every split
   into stages of the largest stage bound, with the transfer into each stage, one microbatch's memory, and the
   nodes a plan must cross (planner.bound.stage_term); planner.bound.over_orders takes it over the layer orders
   pipeplan's search plans on. A plan's gap is measured over the bound of its class (benchmarks/bound_gap.py):
   term 5 for a plan with one stage per rank, which belongs to that class, else the all-plan bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pipeplan.core.hardware.cluster import Cluster
from pipeplan.core.shared_params import first_holder_params
from pipeplan.core.units import wire_ms
from pipeplan.planner.bound.fill_term import fill_term
from pipeplan.planner.bound.phase_term import phase_term
from pipeplan.planner.bound.stage_term import STAGE_DP_CELLS, stage_term
from pipeplan.planner.plan_space import divisors, shapes
from pipeplan.planner.request import PlanRequest
from pipeplan.sim.cost.layers import static_bytes
from pipeplan.sim.cost.link_model import device_nodes, link_arrays

TERMS = ("compute", "path", "all-reduce", "fill", "stages")
__all__ = ["STAGE_DP_CELLS", "TERMS", "LowerBound", "ShapeBounds", "lower_bound"]
MIXES = 41
"""Weights w in [0, 1] tried for the joint compute-and-path term (each gives a valid bound; the largest counts)."""


@dataclass(frozen=True, slots=True)
class LowerBound:
    """The bound (ms), the shape that gives it (pipeline replicas, microbatch size) and the term that binds there."""

    ms: float
    pipelines: int
    microbatch_size: int
    term: str
    terms: tuple[float, ...]


def across_nodes(cluster: Cluster) -> tuple[int, float, float]:
    """(devices of the largest node, fastest link between two nodes in bytes/s, least latency between nodes in ms)."""
    rate, latency = link_arrays(cluster)
    nodes = device_nodes(cluster)
    size = int(np.bincount(nodes).max())
    if size == len(nodes):
        return size, math.inf, 0.0
    fastest = 0.0
    for node in np.unique(nodes):  # row blocks: one node's devices to every device of another node
        rows = np.flatnonzero(nodes == node)
        cols = np.flatnonzero(nodes != node)
        block = rate.values(np.repeat(rows, len(cols)), np.tile(cols, len(rows)))
        fastest = max(fastest, float(block.max()))
    return size, fastest, float(latency.extremes(nodes)[1])


class ShapeBounds:
    """Per-layer costs of one request at every samples-per-device count, and the three terms of a shape."""

    def __init__(self, request: PlanRequest) -> None:
        self.request = request
        model = request.model
        self.layers = model.layers
        profile = request.profile
        cluster = request.cluster
        speeds = np.sort(np.array([d.speed for d in cluster.devices], dtype=float))[::-1]
        self.speed_prefix = np.concatenate([[0.0], np.cumsum(speeds)])
        self.s_max = float(speeds[0])
        memories = np.sort(np.array([d.memory_bytes for d in cluster.devices], dtype=float))[::-1]
        self.memory_prefix = np.concatenate([[0.0], np.cumsum(memories)])
        # a shared parameter counted at its first holder only: any set of layers holds at least this (a lower bound)
        self.params = np.array(
            first_holder_params([layer.param_bytes for layer in profile.layers], profile.shared_params), dtype=float
        )
        self.static = static_bytes(self.params, model.optimizer_factor, model.holding)
        self.grads = model.holding.grads  # gradient bytes the all-reduce moves per parameter byte (sim.cost.holding)
        self.optimizer = self.layers.optimizer_steps_ms.copy()
        self.split = model.bwd_split
        self.node_size = cluster.num_devices
        if cluster.num_devices > 1:
            rate, latency = link_arrays(cluster)
            self.rate, self.latency = rate.off_diagonal_max(), latency.off_diagonal_min()
            self.node_size, self.rate_across, self.latency_across = across_nodes(cluster)
        else:
            self.rate, self.latency = math.inf, 0.0
        self.transfer_rate, self.transfer_latency = self.rate, self.latency  # stage boundaries: always the links
        if cluster.allreduce_bytes_per_s is not None:
            self.rate, self.latency = cluster.allreduce_bytes_per_s, cluster.allreduce_latency_ms
            self.node_size = cluster.num_devices  # the measured collective replaces every ring

    def saved_spans(self, samples: float) -> np.ndarray:
        """[a, e]: the saved bytes of one microbatch of `samples` samples of layers a..e on one device (a storage two
        neighbours both save counted once, as LayerArrays.saved_of); +inf below the diagonal is not needed (masked)."""
        arrays = self.layers.arrays(samples)
        saved, shared = np.asarray(arrays.saved, dtype=float), np.asarray(arrays.shared, dtype=float)
        total = np.concatenate([[0.0], np.cumsum(saved)])
        inner = np.concatenate([[0.0], np.cumsum(shared)])
        # shared[i] counts once layer i - 1 is in the set too: layers a+1..e
        return (total[None, 1:] - total[:-1, None]) - (inner[None, 1:] - inner[1:, None])

    def costs(self, samples: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per layer at `samples` samples on a speed-1 device: F, B' = min(B, I + W) and I' = min(I, B)."""
        arrays = self.layers.arrays(samples)
        fwd, bwd = np.asarray(arrays.fwd, dtype=float), np.asarray(arrays.bwd, dtype=float)
        if self.split is not None:
            inp, wgt = bwd * self.split[0], bwd * self.split[1]
        elif arrays.bwd_input is None or arrays.bwd_weight is None:
            inp, wgt = bwd / 2, bwd / 2
        else:
            inp, wgt = np.asarray(arrays.bwd_input, dtype=float), np.asarray(arrays.bwd_weight, dtype=float)
        return fwd, np.minimum(bwd, inp + wgt), np.minimum(inp, bwd)

    def allreduce_ms(self, nbytes: np.ndarray, devices: int, across: bool = False) -> np.ndarray:
        """The least ring all-reduce of the gradients of `nbytes` parameter bytes (x self.grads) over `devices`
        devices on this cluster (ms): the fastest link and least
        latency, or, for more devices than the largest node holds, the fastest link and least latency between nodes
        (a ring over two nodes has a link between them, and the ring's time follows its slowest link); `across`: a
        ring known to span two nodes."""
        if devices < 2:
            return np.zeros_like(nbytes)
        k = devices
        inside = k <= self.node_size and not (across and self.node_size < self.request.cluster.num_devices)
        rate, latency = (self.rate, self.latency) if inside else (self.rate_across, self.latency_across)
        return wire_ms(2 * (k - 1) / k * (nbytes * self.grads), rate) + 2 * (k - 1) * latency

    def fits(self, rp: int) -> bool:
        """Whether n = N // rp devices can hold every layer's static bytes once, and each layer fits one device."""
        n = self.request.cluster.num_devices // rp
        return float(self.static.sum()) <= self.memory_prefix[n] and float(self.static.max(initial=0.0)) <= self.memory_prefix[1]

    def widths(self, rp: int, b: int) -> list[int]:
        """The devices per pipeline a stage may have at shape (rp, b): r | b, r <= n (1 without stage replication)."""
        n = self.request.cluster.num_devices // rp
        return [r for r in divisors(b) if r <= n] if self.request.stage_replicas_allowed else [1]

    def terms(self, rp: int, b: int) -> tuple[float, float, float]:
        """(compute, path, all-reduce) of shape (rp, b): see the module docstring (compute and path joined)."""
        devices = self.request.cluster.num_devices
        n = devices // rp
        m = self.request.global_batch // (rp * b)
        speed = min(float(self.speed_prefix[n]), float(self.speed_prefix[-1]) / rp)
        areas, paths, tails = [], [], []
        for r in self.widths(rp, b):
            fwd, back, inp = self.costs(b / r)
            areas.append(r * (m * (fwd + back) + self.optimizer) / speed)  # each of the r devices steps the layer
            paths.append((fwd + inp) / self.s_max)
            tails.append(m * (fwd + back) / self.s_max + self.optimizer / self.s_max + self.allreduce_ms(self.params, r * rp))
        area, path = np.array(areas), np.array(paths)
        # one width per layer serves both: max(A, P) >= w A + (1 - w) P >= sum_i min_r (w a_ir + (1 - w) p_ir)
        joint = max(float(np.min(w * area + (1 - w) * path, axis=0).sum()) for w in np.linspace(0.0, 1.0, MIXES))
        compute = max(float(area.min(axis=0).sum()), joint, phase_term(self, rp, b))
        return compute, float(path.min(axis=0).sum()), float(np.min(tails, axis=0).max(initial=0.0))

    def stages(self, rp: int, b: int) -> float:
        """The least, over every split of the layers into contiguous stages of r_s devices each (sum r_s <= n), of
        the largest stage bound (planner.bound.stage_term); nan when the shape is too large to search."""
        return stage_term(self, rp, b)


def lower_bound(request: PlanRequest, stages: bool = False, stop_at: float = math.inf) -> LowerBound:
    """The least iteration time (ms) any plan of `request` can simulate to (module docstring); inf when no plan can
    hold the model's weights. With `stages`, the bound over plans of one contiguous stage per rank (in the profile's
    layer order) only: term 5 joins the others. Shapes whose bound cannot go below `stop_at` are not looked at (the
    answer is then exact below stop_at, and inf when nothing is)."""
    bounds = ShapeBounds(request)
    best = LowerBound(math.inf, 0, 0, "memory", (math.inf,) * (len(TERMS) if stages else len(TERMS) - 1))
    cheap = sorted((max(terms), rp, b, terms) for rp, b in shapes(request) if bounds.fits(rp) for terms in [bounds.terms(rp, b)])
    for value, rp, b, terms in cheap:  # the least over shapes: from the smallest partial bound, until none can go below
        if value >= min(best.ms, stop_at):
            break
        fill = fill_term(bounds, rp, b)
        terms = (*terms, fill)
        value = max(value, fill)
        if stages and value < best.ms:
            dp = bounds.stages(rp, b)
            terms = (*terms, dp)
            value = max(value, dp) if not math.isnan(dp) else value
        if value < best.ms:
            best = LowerBound(value, rp, b, TERMS[terms.index(value)], terms)
    return best
