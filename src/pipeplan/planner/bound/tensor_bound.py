"""A proven lower bound on the iteration time of every plan of a request, tensor-parallel and sharded plans included.

planner.bound.shape_bounds covers plans with tp 1 and no sharding: its terms price each layer whole on every device
that runs it. Under sim.cost.tensor_parallel a stage on groups of t runs a split layer's forward at a share
c_i(t) = w + (1 - w) / t of its time (w its whole share, 0 with sequence parallelism), its backward (and I and W) at
c'_i(t), steps 1 / t of its optimizer on each device, and adds collectives (time only); a replicated layer runs whole.
ZeRO over d copies divides the step by d and replaces the all-reduce by a reduce-scatter and all-gather of the same
time. For one shape (rp, b) (planner.bound.shape_bounds's notation: m = G / (rp b), n = N // rp, S the speed of a
pipeline's devices, r | b the groups of a stage, each of t devices, at b / r samples), every such plan takes at least
the larger of:

1. compute: sum_i min_r (r m (F_i + B'_i)(b / r) + O_i / rp) / S. The r t devices of a stage each run layer i's m
   forwards and backwards at a share c_i(t) >= 1 / t (t c_i(t) >= 1: the group together does at least the layer's
   work) and each steps at least O_i / (t r rp) of it (1 / t of the layer, 1 / d of that under ZeRO, d <= r rp):
   r t x O_i / (t r rp).
2. path: sum_i min_r (F_i + I'_i)(b / r) x s_i / s_max, s_i = 1 / T_i for a layer that splits (T_i its width's
   largest divisor at most N: a group of t runs a share c_i(t) >= 1 / t, and t divides the width) and 1 for one that
   does not. One microbatch passes every layer's forward, then every layer's backward from the last layer down.
   Joint, as shape_bounds's: one width per layer serves both, so for every w in [0, 1] the larger of the two is at
   least sum_i min_r (w a_i(r) + (1 - w) p_i(r)).

A shape counts when a pipeline's devices can hold every layer's working weights once (ZeRO 1 and 2 shard gradients,
master copy and optimizer state, never the working weights: a pipeline holds each weight at least once, split or not).
Those are sim.cost.holding.Holding.weights per parameter byte: the whole of it for a profile without a master copy,
half for 16-bit weights beside an fp32 master copy (the profile's param_bytes count the master's 4 bytes). The bound is the least,
over the shapes, of the larger of the two. It holds for t = 1 plans too, where shape_bounds's tighter bound is used
(planner.bound.plan_bound picks a plan's class).
"""

from __future__ import annotations

import math

import numpy as np

from pipeplan.planner.bound.shape_bounds import MIXES, LowerBound, ShapeBounds
from pipeplan.planner.plan_space import divisors, shapes
from pipeplan.planner.request import PlanRequest

TERMS = ("compute", "path")
__all__ = ["TERMS", "tensor_lower_bound"]


def path_shares(request: PlanRequest) -> np.ndarray:
    """Per layer, the least share of its time one device of a tensor-parallel group runs: 1 / T_i for a layer that
    splits (T_i the largest divisor of its width at most the device count), 1 for one that does not."""
    n = request.cluster.num_devices
    shares = np.ones(request.profile.num_layers)
    for i, layer in enumerate(request.profile.layers):
        if layer.tp is not None:
            shares[i] = 1.0 / max(t for t in divisors(layer.tp.width) if t <= n)
    return shares


def tensor_terms(bounds: ShapeBounds, shares: np.ndarray, rp: int, b: int) -> tuple[float, float]:
    """(compute, path) of shape (rp, b) over every plan, tensor-parallel and sharded included (module docstring)."""
    request = bounds.request
    n = request.cluster.num_devices // rp
    m = request.global_batch // (rp * b)
    speed = min(float(bounds.speed_prefix[n]), float(bounds.speed_prefix[-1]) / rp)
    areas, paths = [], []
    for r in bounds.widths(rp, b):
        fwd, back, inp = bounds.costs(b / r)
        areas.append((r * m * (fwd + back) + bounds.optimizer / rp) / speed)
        paths.append((fwd + inp) * shares / bounds.s_max)
    area, path = np.array(areas), np.array(paths)
    joint = max(float(np.min(w * area + (1 - w) * path, axis=0).sum()) for w in np.linspace(0.0, 1.0, MIXES))
    return max(float(area.min(axis=0).sum()), joint), float(path.min(axis=0).sum())


def shape_counts(bounds: ShapeBounds, rp: int) -> bool:
    """Whether the devices of one of rp pipeline copies can hold the model's working weights once (module docstring)."""
    request = bounds.request
    weights = float(bounds.params.sum()) * request.model.holding.weights
    return weights <= bounds.memory_prefix[request.cluster.num_devices // rp]


def tensor_lower_bound(request: PlanRequest) -> LowerBound:
    """The least iteration time (ms) any plan of `request` can simulate to, with tensor parallelism and ZeRO in the
    space (module docstring); inf when no pipeline can hold the model's weights."""
    bounds = ShapeBounds(request)
    shares = path_shares(request)
    best = LowerBound(math.inf, 0, 0, "memory", (math.inf,) * len(TERMS))
    for rp, b in shapes(request):
        if not shape_counts(bounds, rp):
            continue
        terms = tensor_terms(bounds, shares, rp, b)
        value = max(terms)
        if value < best.ms:
            best = LowerBound(value, rp, b, TERMS[terms.index(value)], terms)
    return best
