"""Tensor parallelism and sharded state in the cost model: each layer's share under a group of t, the group's
collectives, and the static bytes under ZeRO.

A stage with tensor-parallel degree t (core.plan.Stage.tp) runs every layer the profile marks splittable
(core.layer_profile.TensorSplit) on t devices at once, and every other layer whole on each of them (replicated):

- compute (forward, backward, I, W) of a split layer: its time / t, exactly (no per-shard efficiency loss is
  modelled without a measurement), except the share its split names as run whole on every
  device without sequence parallelism (TensorSplit.whole_fwd for the forward, whole_bwd for the backward and its
  I and W: Megatron-LM's layer norms, dropouts and residual adds), time x (w + (1 - w) / t); with sequence
  parallelism that work splits along the sequence too, time / t; a replicated layer: its whole time. A layer the
  profiler ran split at t (TensorSplit.timed: its time on one device of the group, with the split's dispatch,
  profiler.split_timing) takes the measured share instead: at each measured size, its split time over its dense
  time, interpolated linearly in the number of samples between sizes and held at the end values beyond them
  (numpy.interp), times its dense time at that number (the backward's share for B, I and W); with or without
  sequence parallelism (the profiler marks whole_fwd = whole_bwd = 0: the formula is the same for both);
- weights, gradients, optimizer state and the optimizer step of a split layer: / t; a replicated layer: whole;
- saved bytes (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"): a split
  layer keeps its kind's whole share w (TP_KINDS: 10 of 34 sbh for a block) on every device and the rest / t,
  saved x (w + (1 - w) / t); with sequence parallelism the whole share splits along the sequence too, saved / t;
  a replicated layer keeps all of its saved bytes;
- collectives: each split layer all-reduces its output (or its input's gradient, TP_KINDS) over the group, the
  counts of TP_KINDS per forward and backward (a Megatron block: 2 and 2), the backward's count plus the
  forward's when the split says the layer is recomputed (TensorSplit.recomputed: its backward reruns its forward,
  collectives included). With sequence parallelism each
  all-reduce is a reduce-scatter plus an all-gather of the same bytes, which a ring moves in the same time. A ring
  all-reduce of n bytes over the group takes 2(t-1)/t x n / (slowest link of the group) + 2(t-1) x (largest
  latency of the group), the formula of sim.cost.link_model over the group's own links (read by
  sim.cost.link_model.ring_group_links, as the data-parallel ring's are; a cluster's measured all-reduce prices
  the data-parallel ring, not this one), or, when the cluster carries the measured all-reduce at TP's small
  messages (Cluster.tp_allreduce_bytes_per_s and tp_allreduce_latency_ms, what `pipeplan probe` fits: on gloo a
  call's fixed cost is hundreds of microseconds, several link latencies), the same formula with its bus bandwidth
  and per-step latency: in place of the links' for a group on one node, the slower of the two for a group across
  nodes; a stage's groups are priced at the slowest one, so a plan cannot hide a group split across servers.
  The forward's collectives lengthen the stage's F, the backward's its B and its I (they carry the input gradient).

ZeRO (core.plan.Plan.zero) over a stage's d = devices / t copies: 1 divides the optimizer state by d (with the
32-bit master copy of a mixed-precision profile's 16-bit weights, core.profile.ModelProfile.master_copy, and any
fp32 copy of its gradients), 2 the gradients too (sim.cost.holding prices each layout); the data-parallel exchange
becomes a reduce-scatter of the gradients and an all-gather of the parameters, which a ring moves in the time of
the all-reduce it replaces, and each device steps its 1/d of the parameters (the step / d).

Note:
    Left out, each an approximation the tests name: the all-gather a receiving stage without sequence parallelism
    runs after a pipeline transfer split over its group's devices (Megatron's scatter-gather; cut bytes per
    boundary against 4 all-reduces of the same size per block), NIC sharing between the t concurrent
    data-parallel rings of a stage (one per rank of the group, each priced alone), a shared parameter's
    exchange, which is priced over every device of its stages with its whole bytes (an upper bound).

With sequence parallelism a stage also runs the boundary all-gathers and norm all-reduces sim.cost.sequence_traffic
prices, over the same ring (TensorTraffic counts an all-gather of n bytes as an all-reduce of n/2 bytes and half a
latency count).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeplan.core.errors import PlanError
from pipeplan.core.layer_profile import TP_KINDS
from pipeplan.core.profile import ModelProfile
from pipeplan.core.shared_params import SharedGroup
from pipeplan.core.units import wire_ms
from pipeplan.sim.cost.layers import LayerCosts, StageWork
from pipeplan.sim.cost.link_model import device_nodes, ring_group_links
from pipeplan.sim.cost.sequence_traffic import sequence_traffic

__all__ = [
    "TensorShares", "TensorTraffic", "check_tp_widths", "compute_shares", "group_collectives_ms", "split_stage",
    "tensor_shares",
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class TensorShares:
    """Per layer (numpy arrays over the profile's layers), the share each device of a group of `t` holds or runs."""

    t: int
    compute: np.ndarray
    params: np.ndarray
    saved: np.ndarray
    fwd_collectives: np.ndarray
    bwd_collectives: np.ndarray
    on_input: np.ndarray
    bwd_compute: np.ndarray

    def overlap_bytes(self, groups: Sequence[SharedGroup], layers: set[int]) -> float:
        """Bytes a set of layers would count more than once under the split: per shared group with several members in
        the set, its bytes x (the members' shares summed - the largest share); core.shared_params.overlap_bytes at
        t = 1."""
        extra = 0.0
        for g in groups:
            shares = [float(self.params[u]) for u in g.layers if u in layers]
            if len(shares) > 1:
                extra += (sum(shares) - max(shares)) * g.param_bytes
        return extra


@dataclass(frozen=True, slots=True)
class TensorTraffic:
    """A stage's tensor-parallel collectives for one microbatch on one device: bytes and count of all-reduces (an
    all-gather of n bytes counts as an all-reduce of n/2 bytes and half a count: module docstring)."""

    fwd_bytes: float
    fwd_count: float
    bwd_bytes: float
    bwd_count: float


def tensor_shares(profile: ModelProfile, t: int, sequence_parallel: bool) -> TensorShares:
    """Each layer's shares under a group of t (module docstring): `compute` of its forward, `bwd_compute` of its
    backward (and I and W), `params`, `saved`, and its collectives."""
    n = profile.num_layers
    compute, bwd_compute, params, saved = np.ones(n), np.ones(n), np.ones(n), np.ones(n)
    fwd, bwd, on_input = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool)
    for i, layer in enumerate(profile.layers):
        split = layer.tp
        if split is None:
            continue
        params[i] = 1.0 / t
        whole_fwd, whole_bwd = (0.0, 0.0) if sequence_parallel else (split.whole_fwd, split.whole_bwd)
        compute[i] = whole_fwd + (1.0 - whole_fwd) / t
        bwd_compute[i] = whole_bwd + (1.0 - whole_bwd) / t
        whole = 0.0 if sequence_parallel else split.whole_share
        saved[i] = whole + (1.0 - whole) / t
        fwd[i], bwd[i] = TP_KINDS[split.kind][0], TP_KINDS[split.kind][1]
        if split.recomputed:
            bwd[i] += fwd[i]
        on_input[i] = TP_KINDS[split.kind][2] == "input"
    return TensorShares(t, compute, params, saved, fwd, bwd, on_input, bwd_compute)


def check_tp_widths(profile: ModelProfile, stage: int, layers: Sequence[int], t: int) -> None:
    """Raise PlanError unless t divides the width of every split layer of the stage (naming the layer and width)."""
    for i in layers:
        split = profile.layers[i].tp
        if split is not None and split.width % t:
            raise PlanError(
                f"stage {stage} (layers {layers[0]}..{layers[-1]}) has tp {t}, which does not divide layer {i} "
                f"({profile.layers[i].name!r}) tp width {split.width} (its {split.kind} split); give tp a divisor of "
                f"{split.width}"
            )


def group_collectives_ms(cluster: Any, devices: tuple[int, ...], t: int, traffic: TensorTraffic) -> tuple[float, float]:
    """(forward ms, backward ms) of a stage's collectives on its slowest group of t (consecutive `devices`).

    Raises:
        ClusterError: two neighbours of a group's ring cannot talk.
    """
    if t < 2 or (traffic.fwd_count == 0 and traffic.bwd_count == 0):
        return 0.0, 0.0
    groups = np.array(devices, dtype=np.int64).reshape(-1, t)
    slowest, longest = ring_group_links(cluster, groups)
    if cluster.tp_allreduce_bytes_per_s is not None:
        nodes = device_nodes(cluster)[groups]
        across = (nodes != nodes[:, :1]).any(axis=1)
        rate, latency = cluster.tp_allreduce_bytes_per_s, cluster.tp_allreduce_latency_ms
        slowest = np.where(across, np.minimum(slowest, rate), rate)
        longest = np.where(across, np.maximum(longest, latency), latency)
    steps = 2 * (t - 1)
    fwd = wire_ms(steps / t * traffic.fwd_bytes, slowest) + traffic.fwd_count * steps * longest
    bwd = wire_ms(steps / t * traffic.bwd_bytes, slowest) + traffic.bwd_count * steps * longest
    g = int(np.argmax(fwd + bwd))  # the slowest group (ties: the first)
    return float(fwd[g]), float(bwd[g])


def split_stage(
    costs: LayerCosts, layers: Sequence[int], microbatch_size: int, replicas: int, speed: float, t: int, sp: bool
) -> tuple[StageWork, TensorTraffic]:
    """LayerCosts.stage for a stage on groups of t (t > 1): per device, each layer's share of its compute, bytes and
    optimizer step (module docstring), and the group's collectives for one microbatch."""
    key = (t, sp)
    shares = costs.split_memo.get(key)
    if shares is None:
        shares = costs.split_memo[key] = tensor_shares(costs.profile, t, sp)
    selected = sorted(set(layers))
    index = np.asarray(selected, dtype=np.int64)
    samples = microbatch_size / replicas
    arrays = costs.arrays(samples)
    compute, bwd_compute = (share[index] for share in compute_shares(costs, shares, samples))

    def total(values: np.ndarray | None, share: np.ndarray) -> float | None:
        return None if values is None else float((values[index] * share).sum()) / speed

    fwd, bwd = total(arrays.fwd, compute), total(arrays.bwd, bwd_compute)
    assert fwd is not None and bwd is not None
    saved_share = shares.saved[index]
    held = float((arrays.saved[index] * saved_share).sum())
    if index.size > 1 and arrays.shared.any():
        inner = np.diff(index) == 1  # layers whose predecessor is in the set hold their shared input once
        held -= float((arrays.shared[index[1:]][inner] * saved_share[1:][inner]).sum())
    param_bytes = np.array([costs.profile.layers[i].param_bytes for i in selected])
    params = float((param_bytes * shares.params[index]).sum())
    if costs.profile.shared_params:
        params -= shares.overlap_bytes(costs.profile.shared_params, set(selected))
    optimizer = float((costs.optimizer_steps_ms[index] * shares.params[index]).sum()) / speed
    bwd_input, bwd_weight = total(arrays.bwd_input, bwd_compute), total(arrays.bwd_weight, bwd_compute)
    work = StageWork(fwd, bwd, bwd_input, bwd_weight, held, params, optimizer)
    return work, _traffic(costs, shares, selected, arrays.activation, microbatch_size, replicas, sp)


def compute_shares(costs: LayerCosts, shares: TensorShares, samples: float) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) share of every layer's time that one device of a group of shares.t runs for `samples`
    samples: `shares`' formula, and a measured share for every layer timed at that t (module docstring)."""
    key = ("timed", id(shares), samples)  # shares live in split_memo as long as costs: their ids stay theirs
    found = costs.split_memo.get(key)
    if found is not None and found[0] is shares:
        return found[1]
    sizes = np.asarray(costs.profile.sizes, dtype=float)
    fwd, bwd = shares.compute, shares.bwd_compute
    for i, layer in enumerate(costs.profile.layers):
        timing = None if layer.tp is None else layer.tp.timing(shares.t)
        if timing is None:
            continue
        curve = layer.curve
        dense_fwd = np.asarray(curve.fwd_ms if curve is not None else (layer.fwd_ms,), dtype=float)
        dense_bwd = np.asarray(curve.bwd_ms if curve is not None else (layer.bwd_ms,), dtype=float)
        if fwd is shares.compute:
            fwd, bwd = fwd.copy(), bwd.copy()
        fwd[i] = _measured_share(sizes, np.asarray(timing.fwd_ms), dense_fwd, samples, fwd[i])
        bwd[i] = _measured_share(sizes, np.asarray(timing.bwd_ms), dense_bwd, samples, bwd[i])
    costs.split_memo[key] = (shares, (fwd, bwd))
    return fwd, bwd


def _measured_share(sizes: np.ndarray, split: np.ndarray, dense: np.ndarray, samples: float, otherwise: float) -> float:
    """split / dense at the sizes where dense > 0, interpolated at `samples` (numpy.interp: held beyond the ends);
    `otherwise` when no size has a dense time."""
    timed = dense > 0
    if not timed.any():
        return otherwise
    return float(np.interp(samples, sizes[timed], split[timed] / dense[timed]))


def _traffic(
    costs: LayerCosts,
    shares: TensorShares,
    selected: list[int],
    activation: np.ndarray,
    microbatch_size: int,
    replicas: int,
    sp: bool,
) -> TensorTraffic:
    """The all-reduces of the split layers among `selected`: of each one's output (activation bytes per device), or of
    its input's gradient (the bytes crossing the cut before it, / replicas; 0 for the first layer of the profile);
    with sequence parallelism (`sp`), its boundary gathers and norm all-reduces too (sim.cost.sequence_traffic)."""
    fwd_bytes = bwd_bytes = 0.0
    fwd_count = bwd_count = 0
    for i in selected:
        f, b = int(shares.fwd_collectives[i]), int(shares.bwd_collectives[i])
        if f == 0 and b == 0:
            continue
        if shares.on_input[i]:
            nbytes = costs.cut_bytes(i - 1, microbatch_size) / replicas if i > 0 else 0.0
        else:
            nbytes = float(activation[i])
        fwd_bytes, fwd_count = fwd_bytes + f * nbytes, fwd_count + f
        bwd_bytes, bwd_count = bwd_bytes + b * nbytes, bwd_count + b
    if not sp:
        return TensorTraffic(fwd_bytes, fwd_count, bwd_bytes, bwd_count)
    return TensorTraffic(
        *sequence_traffic(costs, selected, activation, microbatch_size, replicas, (fwd_bytes, fwd_count, bwd_bytes, bwd_count))
    )
