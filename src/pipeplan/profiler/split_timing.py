"""A tensor-parallel block's time as it will run on one device of a group of t (issue 34).

The cost model prices a split layer's compute from its dense time (sim.cost.tensor_parallel: time / t). A block the
runtime splits runs sharded modules whose every operator goes through DTensor's dispatch (placements, sharding
propagation, the redistributions around each collective): on a small block that costs more than the compute it
splits (a charlm block of width 128 on a CPU: 2.8 ms fwd+bwd dense, 5.8 ms on one device of a group of 2). So for
every zoo encoder block (models.tp_block) the profiler marks, and every t up to tensor_splits.MAX_CHECKED that
divides its width, it times the block as a TP rank runs it: the runtime's own split (models.tp_block.shard_block,
what runtime.execution.tp_layers runs), in the profiler's timing rounds (profiler.timing.ChainTimer: the chain in
order, the other layers dense as a TP stage runs them replicated), with this process as rank 0 of a group of t.
Each round runs the chain dense and then split, back to back; the block's split time is its dense time (the
profile's median) times the ratio of the fastest split round to the fastest dense round (_ratios): a ratio that
holds while a loaded machine's speed drifts between the profile's rounds and these, and its spikes come and go.

The group is torch's `fake` process group (torch.testing._internal.distributed.fake_pg registers it: torch's own
tool for running one rank of a distributed program alone): one process is rank 0 of t, and every collective
returns at once without moving data. The shapes, the dispatch and the code are a TP rank's; the collectives' own time is not in it
(it is the cluster's, priced from what `pipeplan probe` measures: runtime.measurement.tp_collectives). The values
the block computes are wrong (nothing is summed), which timing does not read.

Note:
    Skipped (the layer keeps no timing; the cost model then uses time / t): a process that already has a default
    process group (the fake one cannot be made beside it), a branching model (profiler.graph_timing) and captured
    Llama-style blocks (models.traced.split_graph: their f and g collectives live in the runtime).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from pipeplan.core.layer_profile import SplitTiming, TensorSplit
from pipeplan.models.tp_block import encoder_of, shard_block
from pipeplan.profiler.tensor_splits import MAX_CHECKED
from pipeplan.profiler.timing import ChainTimer, Loss

LayerTimes = tuple[tuple[int, float, float], ...]
"""One layer's split times at one batch size: (t, forward ms, backward ms) per degree, ascending t."""


def degrees(split: TensorSplit | None, layer: nn.Module) -> list[int]:
    """The degrees a layer is timed split at: each t in 2..MAX_CHECKED dividing its width, for a zoo encoder block."""
    if split is None or encoder_of(layer) is None:
        return []
    return [t for t in range(2, min(split.width, MAX_CHECKED) + 1) if split.width % t == 0]


def time_splits(
    layers: Sequence[nn.Module],
    splits: Sequence[TensorSplit | None],
    x0: torch.Tensor,
    last_grad: torch.Tensor,
    sync: Callable[[], None],
    loss: Loss | None,
    warmup: int,
    runs: int,
    dense: tuple[Sequence[float], Sequence[float]],
) -> tuple[LayerTimes, ...] | None:
    """Each layer's split times (module docstring), () for a layer not timed; None when nothing was (no block to
    time, no rounds, or this process has a process group already). `dense`: every layer's measured (forward,
    backward) medians; a split time is the dense one times the ratio of split to dense (_ratios)."""
    wanted = [degrees(split, layer) for split, layer in zip(splits, layers, strict=True)]
    every = sorted({t for ts in wanted for t in ts})
    if not every or runs == 0 or dist.is_initialized():
        return None
    found: list[list[tuple[int, float, float]]] = [[] for _ in layers]
    for t in every:
        ratios = _ratios(layers, [t in ts for ts in wanted], t, x0, last_grad, sync, loss, warmup, runs)
        for i, (fwd, bwd) in ratios.items():
            found[i].append((t, dense[0][i] * fwd, dense[1][i] * bwd))
    return tuple(tuple(times) for times in found)


def _ratios(
    layers: Sequence[nn.Module],
    chosen: Sequence[bool],
    t: int,
    x0: torch.Tensor,
    last_grad: torch.Tensor,
    sync: Callable[[], None],
    loss: Loss | None,
    warmup: int,
    runs: int,
) -> dict[int, tuple[float, float]]:
    """Per chosen layer, (forward, backward) split over a fake group of t / dense: the fastest round of each. Each
    round times the whole chain dense, then with the chosen layers split, back to back, so both see the same
    machine; the fastest rounds are the ones another process did not interrupt (noise only adds time), so their
    ratio is the split's own cost on a loaded machine too, where a ratio of medians takes the load's spikes in."""
    device = x0.device
    from torch.testing._internal.distributed import fake_pg  # noqa: F401 (registers the `fake` backend with c10d)

    dist.init_process_group("fake", store=dist.HashStore(), rank=0, world_size=t)
    timers: list[ChainTimer] = []
    try:
        mesh = DeviceMesh(device.type, list(range(t)))
        run: list[nn.Module] = []
        for layer, split in zip(layers, chosen, strict=True):
            found = encoder_of(layer) if split else None
            run.append(layer if found is None else shard_block(found[0], found[1], t, mesh, device, layer.training))
        timers = [ChainTimer(layers, x0, last_grad, sync, False, loss), ChainTimer(run, x0, last_grad, sync, False, loss)]
        for r in range(warmup + runs):
            for timer in timers:
                timer.round(keep=r >= warmup)
    finally:
        for timer in timers:
            timer.close()
        dist.destroy_process_group()
    dense, split = timers[0].samples, timers[1].samples

    def ratio(op: str, i: int) -> float:
        fastest = min(dense[op][i], default=0.0)
        return min(split[op][i]) / fastest if fastest > 0 else 0.0

    return {i: (ratio("F", i), ratio("B", i)) for i, split_it in enumerate(chosen) if split_it}


def timed_split(split: TensorSplit | None, per_size: Sequence[LayerTimes]) -> TensorSplit | None:
    """`split` with its `timed` from one layer's split times at each batch size (ascending): the degrees timed at
    every size (None and unmarked layers pass through)."""
    if split is None or not per_size:
        return split
    common = sorted(set.intersection(*({t for t, _, _ in times} for times in per_size)))
    timed = tuple(
        SplitTiming(
            t,
            tuple(next(f for d, f, _ in times if d == t) for times in per_size),
            tuple(next(b for d, _, b in times if d == t) for times in per_size),
        )
        for t in common
    )
    return dataclasses.replace(split, timed=timed)
