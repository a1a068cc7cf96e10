"""What sequence parallelism adds to a tensor-parallel stage's collectives (sim.cost.tensor_parallel prices the rest).

With sequence parallelism a stage also runs what runtime.execution.sequence_parallel adds to each block's
collectives (it sends whole tensors between stages, as priced here), over the group's ring:

- where a run of consecutive sequence-split layers (the kinds of SEQUENCE_NORMS) of the stage ends, an all-gather of
  the last one's output in the forward; where it starts, an all-gather of the gradient of its input in the backward
  (nothing before the profile's first layer). An all-gather of n bytes over t devices is (t-1)/t x n / rate +
  (t-1) x latency, half a ring all-reduce of n: it counts as an all-reduce of n/2 bytes and half a latency count. A
  recomputed layer (TensorSplit.recomputed) reruns its forward's gather in the backward, as its other collectives;
- in the backward, per layer and microbatch, one all-reduce of each of its norms' weight gradients (SEQUENCE_NORMS:
  two per block, runtime.execution.sequence_parallel.SummedNorm): TensorSplit.norm_bytes each (the norm's weight
  and bias in the profile's param_bytes unit) x the gradient bytes per parameter byte the profile holds
  (sim.cost.holding.Holding.grads: 1 for fp32 gradients, 1/2 for 16-bit ones). A split without norm_bytes (0: a
  profile written before) prices them at their latency only. Megatron-LM all-reduces these
  gradients once per iteration, after the last microbatch; the runtime (and so this model) once per microbatch.
"""

from __future__ import annotations

import numpy as np

from pipeplan.sim.cost.holding import holding
from pipeplan.sim.cost.layers import LayerCosts

SEQUENCE_NORMS = {"block": 2, "attention": 1, "mlp": 1}
"""The tensor-parallel kinds sequence parallelism splits along the sequence (their norms, dropouts and residual adds,
TP_KINDS' whole share) and their norms, each of whose weight gradients is all-reduced over the group per microbatch
under sequence parallelism (runtime.execution.sequence_parallel.SummedNorm): a block has two, its halves one each."""

Traffic = tuple[float, float, float, float]
"""(forward bytes, forward all-reduce count, backward bytes, backward count) of one microbatch on one device."""


def sequence_traffic(
    costs: LayerCosts, selected: list[int], activation: np.ndarray, microbatch_size: int, replicas: int, traffic: Traffic
) -> Traffic:
    """`traffic` plus what sequence parallelism adds for the layers `selected` (module docstring): per run of
    consecutive SEQUENCE_NORMS layers, the all-gather of its last output (forward; again in the backward if that
    layer is recomputed) and of its input's gradient (backward), each as half an all-reduce; and each such layer's
    norm all-reduces (backward). Sums run in a fixed order, so equal inputs give equal floats."""
    fwd_bytes, fwd_count, bwd_bytes, bwd_count = traffic
    layers = costs.profile.layers
    grads = holding(costs.profile).grads
    runs: list[list[int]] = []
    for i in selected:
        split = layers[i].tp
        if split is None or split.kind not in SEQUENCE_NORMS:
            continue
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
        norms = SEQUENCE_NORMS[split.kind]
        bwd_count += norms
        if split.norm_bytes:
            bwd_bytes += norms * split.norm_bytes * grads
    for run in runs:
        first, last = run[0], run[-1]
        out = float(activation[last]) / 2
        fwd_bytes, fwd_count = fwd_bytes + out, fwd_count + 0.5
        split = layers[last].tp
        if split is not None and split.recomputed:
            bwd_bytes, bwd_count = bwd_bytes + out, bwd_count + 0.5
        if first > 0:
            bwd_bytes, bwd_count = bwd_bytes + costs.cut_bytes(first - 1, microbatch_size) / replicas / 2, bwd_count + 0.5
    return fwd_bytes, fwd_count, bwd_bytes, bwd_count
