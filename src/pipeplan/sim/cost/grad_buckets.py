"""A replicated stage's gradient all-reduce cut into buckets, as PyTorch DDP overlaps it with the backward.

DDP (and runtime.execution.replicas with buckets on) walks a stage's parameters in reverse layer order, fills a
bucket until it holds `bucket_bytes` or more, then opens the next; a bucket's all-reduce starts once the last
microbatch's backward has passed every layer in it (its gradients are final), the buckets going over the ring one
after another. `stage_buckets` prices this from the profile: each bucket's bytes, and the fraction of the stage's
backward task done when it is ready (the backward times of the layers from the stage's last down to the bucket's
first that holds parameters, over the stage's whole backward). The simulator places the buckets in the stage's
last backward task (sim.engine.simulator).

Note:
    A split stage's (zero-bubble schedules) last task is a W, which accumulates the weight gradients by hand
    (models.stage.StageModule.backward_weight) where no gradient hook sees them: the runtime launches its buckets
    right after W, one after another, and the simulator starts them there too.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipeplan.core.errors import PlanError
from pipeplan.core.hardware.cluster import Cluster
from pipeplan.sim.cost.layers import LayerCosts
from pipeplan.sim.cost.link_model import ring_allreduce_parts
from pipeplan.sim.cost.types import GradBucket

DDP_BUCKET_BYTES = 25 * 2**20
"""PyTorch DistributedDataParallel's default bucket_cap_mb (25 MiB)."""


def check_bucket_bytes(bucket_bytes: float | None) -> float | None:
    """`bucket_bytes` when None (one all-reduce after the backward) or a finite number > 0, else PlanError."""
    if bucket_bytes is None:
        return None
    if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int | float) or not 0 < bucket_bytes < float("inf"):
        raise PlanError(
            f"allreduce_bucket_bytes must be a number of bytes > 0 or None (one all-reduce after the backward), "
            f"got {bucket_bytes!r}; DDP's default is {DDP_BUCKET_BYTES}"
        )
    return float(bucket_bytes)


def fill_buckets(param_bytes: Sequence[float], bucket_bytes: float) -> list[list[int]]:
    """Positions (0..len-1) of the layers holding parameters, in reverse order, cut into buckets: each bucket takes
    layers until its bytes reach `bucket_bytes` (the last layer may carry it over), as DDP fills its buckets; layers
    without parameters are in none."""
    buckets: list[list[int]] = []
    current: list[int] = []
    held = 0.0
    for position in range(len(param_bytes) - 1, -1, -1):
        if param_bytes[position] <= 0:
            continue
        current.append(position)
        held += param_bytes[position]
        if held >= bucket_bytes:
            buckets.append(current)
            current, held = [], 0.0
    if current:
        buckets.append(current)
    return buckets


def ready_fractions(bwd_ms: Sequence[float], buckets: Sequence[Sequence[int]]) -> list[float]:
    """Per bucket, the fraction of the backward over all `bwd_ms` (positions in layer order, run last to first)
    done when the backward has passed the bucket's lowest position; 1.0 for the last bucket's when the lowest
    position is 0, and every fraction 1.0 when the backward takes no time."""
    total = float(sum(bwd_ms))
    out = []
    for bucket in buckets:
        lowest = min(bucket)
        if total <= 0:
            out.append(1.0)
            continue
        passed = float(sum(bwd_ms[lowest:]))
        out.append(1.0 if lowest == 0 else min(1.0, passed / total))
    return out


def stage_buckets(
    layers: LayerCosts,
    positions: Sequence[int],
    samples: float,
    cluster: Cluster,
    ring: tuple[int, ...],
    param_bytes: float,
    bucket_bytes: float,
) -> tuple[GradBucket, ...]:
    """The buckets of a stage holding the layers `positions` (in order) whose all-reduce moves `param_bytes` over
    `ring`: each layer's share of `param_bytes` in proportion to its profiled parameter bytes (a tensor-parallel
    stage's shards, a shared parameter held elsewhere), each bucket's ring time (link_model.ring_allreduce_parts)
    and ready fraction at `samples` samples per device; () for a ring of one device or no parameters.
    """
    if len(ring) < 2 or param_bytes <= 0:
        return ()
    profile = layers.profile
    raw = [float(profile.layers[i].param_bytes) for i in positions]
    whole = sum(raw)
    if whole <= 0:
        return ()
    share = [b * param_bytes / whole for b in raw]
    if layers.mode == "linear":
        bwd = [float(profile.layers[i].bwd_ms) for i in positions]
    else:
        per_layer = layers.arrays(samples).bwd
        bwd = [float(v) for v in np.asarray(per_layer)[list(positions)]]
    buckets = fill_buckets(share, bucket_bytes)
    out = []
    for bucket, fraction in zip(buckets, ready_fractions(bwd, buckets), strict=True):
        total, latency = ring_allreduce_parts(cluster, ring, sum(share[p] for p in bucket))
        out.append(GradBucket(fraction, total, latency))
    return tuple(out)
