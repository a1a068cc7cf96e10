"""`pipeplan probe`'s measurement of tensor parallelism's collectives: the all-reduce at the small messages a TP group
sends, fitted as a ring's per-step latency and bus bandwidth (Cluster.tp_allreduce_latency_ms / _bytes_per_s).

A tensor-parallel block all-reduces one microbatch's activations, 4 times per block and microbatch (a Megatron
block: core.layer_profile.TP_KINDS). Those messages are small (charlm's: 32-256 KiB), where a collective's fixed
cost rules: on gloo a call costs ~0.5 ms between two processes of one machine (measured: 525 us at 4 KiB, 580 us at
64 KiB, load 2 on 2 cores), more than the ring of ping-pong latencies the links would give. So the probe times
the all-reduce itself at TP's sizes, on groups of every size t that divides the job (consecutive processes, every
group at once, as a TP stage's groups run), and fits the ring's formula, the one the cost model prices a group's
all-reduce with (sim.cost.tensor_parallel.group_collectives_ms):

    time(t, n) = 2 (t - 1) x latency + 2 (t - 1) / t x n / bus bandwidth,

least squares over every (t, n) measured, the slowest process's median per point (the last to finish ends it).
"""

from __future__ import annotations

import statistics
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from pipeplan.core.profile import ModelProfile

TP_BYTES = (1 << 12, 1 << 16, 1 << 20)
"""Message sizes without a profile that marks a split layer: 4 KiB to 1 MiB, the activations of one microbatch of
small to mid-sized blocks (charlm's: 32-256 KiB)."""
SIZES = 4
"""At most this many sizes are timed: the split layers' activations at the profile's smallest and largest batch
sizes and, spread between them in log scale, the rest."""


def tp_message_bytes(profile: ModelProfile | None) -> tuple[int, ...]:
    """The sizes to time: a split layer's output bytes from the profile's smallest to its largest batch size (SIZES,
    log-spaced), else TP_BYTES."""
    if profile is None:
        return TP_BYTES
    values = [
        value
        for layer in profile.layers
        if layer.tp is not None
        for value in (layer.curve.activation_bytes if layer.curve is not None else (layer.activation_bytes,))
        if value > 0
    ]
    if not values:
        return TP_BYTES
    low, high = min(values), max(values)
    if high <= low:
        return (int(low),)
    return tuple(sorted({round(float(v)) for v in np.geomspace(low, high, SIZES)}))


def tp_degrees(world: int) -> list[int]:
    """Group sizes timed: every t >= 2 that divides the job's process count."""
    return [t for t in range(2, world + 1) if world % t == 0]


def measure_tp_allreduce(
    device: torch.device, rounds: int, sizes: tuple[int, ...], timeout_s: float
) -> list[tuple[int, int, float]]:
    """(t, bytes, seconds) per group size and message size: the slowest process's median all-reduce over its group of
    t consecutive processes, every group at once. A collective call: every process of the job calls it (it creates
    the groups); [] on one process."""
    world, rank = dist.get_world_size(), dist.get_rank()
    points: list[tuple[int, int, float]] = []
    for t in tp_degrees(world):
        mine = None
        for first in range(0, world, t):
            made = dist.new_group(list(range(first, first + t)), timeout=timedelta(seconds=timeout_s))
            if first <= rank < first + t:
                mine = made
        medians = []
        for nbytes in sizes:
            buf = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
            dist.all_reduce(buf, group=mine)  # warm-up: the group's first call connects its pairs
            samples = []
            dist.barrier()
            for _ in range(rounds):
                t0 = time.perf_counter()
                dist.all_reduce(buf, group=mine)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                samples.append(time.perf_counter() - t0)
            medians.append(statistics.median(samples))
        slowest = torch.tensor(medians, dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        points += [(t, n, s) for n, s in zip(sizes, slowest.tolist(), strict=True)]
    return points


def fit_tp_allreduce(points: list[tuple[int, int, float]]) -> tuple[float, float]:
    """(bus bandwidth bytes/s, per-step latency s) of the ring formula (module docstring) through (t, bytes, seconds).

    Least squares in the two unknowns (latency, 1 / bandwidth), both held >= 0: where the unconstrained fit gives a
    negative one, it is 0 and the other is fitted alone. The bandwidth is capped at 10x what the largest message
    alone shows (its bytes moved over its whole time), so noise in the small messages cannot make it absurd
    (runtime.measurement.probe.link_fit's rule).
    """
    steps = np.array([2.0 * (t - 1) for t, _, _ in points])
    moved = np.array([2.0 * (t - 1) / t * n for t, n, _ in points])
    seconds = np.array([s for _, _, s in points])
    design = np.column_stack([steps, moved])
    scale = np.linalg.norm(design, axis=0)  # columns of unit norm: steps (~1) and bytes (~1e6) apart, lstsq loses digits
    (latency, per_byte), *_ = np.linalg.lstsq(design / scale, seconds, rcond=None)
    latency, per_byte = latency / scale[0], per_byte / scale[1]
    if latency < 0:
        latency, per_byte = 0.0, float(moved @ seconds / (moved @ moved))
    if per_byte <= 0:
        per_byte, latency = 0.0, float(steps @ seconds / (steps @ steps))
    largest = int(np.argmax(moved))
    seen = moved[largest] / max(seconds[largest], 1e-12)
    rate = 10.0 * seen if per_byte <= 0 else min(1.0 / per_byte, 10.0 * seen)
    return float(rate), float(latency)
