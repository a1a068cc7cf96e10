"""`pipeplan probe`: measure the machine a job will run on, as a cluster: device speeds, links, all-reduce, messages.

Every process of the job (under torchrun, or `--local N`) takes part:
1. Links. For every pair of processes in turn (the others wait), ping-pongs
   over the job's backend of several message sizes; a least-squares line
   through the one-way times gives the pair's latency (intercept) and
   bandwidth (1 / slope), each direction measured on its own.
2. With a profile that records how its model was built (`pipeplan profile`
   writes its source), calibration runs of that model by the real executor
   (runtime.measurement.calibrate): each process's speed (the profile's time of the
   forwards and backwards it ran over the time they took), the runtime's
   gradient all-reduce of the whole model, and the overhead and latency of
   a stage-to-stage message (GPipe and 1F1B runs at the profile's smallest
   and middle sizes; on a loaded CPU a message costs far more than an idle
   ping-pong shows: the communication threads wait for a core while every
   core computes). Without a profile every speed is 1.0 and the
   all-reduce is timed on gradient-like buckets of 1 to 32 MB (on GPUs 1 to 256 MB: the bus bandwidth a
   large all-reduce reaches, what nccl-tests reports).
3. Tensor parallelism's all-reduce at its small messages, fitted as a ring's latency and bus bandwidth
   (runtime.measurement.tp_collectives).
4. On a GPU pipeplan knows the peak of (core.hardware.devices), a large bf16 matmul is timed and its
   achieved FLOP rate over that peak is the device's `matmul_fraction` (the share the calibrated presets
   carry from published measurements, presets.calibrated); on a CPU there is no peak and none is written.
Process 0 writes a `pipeplan.cluster/1` file in matrix form. Every wait is
bounded by the timeout: a peer that never answers is an error naming it.

A cluster written here has CPU devices (kind `cpu`, speeds relative to the
CPU the profile was measured on) when the backend is gloo, and the GPU kind
(speed on the GPU scale, V100 = 1) under NCCL.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import statistics
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from pipeplan.core.hardware.cluster import Cluster
from pipeplan.core.profile import ModelProfile
from pipeplan.core.units import (
    bytes_per_s_to_gb_per_s,
    bytes_to_gib,
    gb_per_s_to_bytes_per_s,
    gib_to_bytes,
    ms_to_us,
    s_to_ms,
    us_to_s,
)
from pipeplan.runtime.measurement.calibrate import (
    allreduce_of,
    build_profiled_model,
    data_parallel_plans,
    fit_messages,
    pipeline_plans,
    run_plan,
    speed_of,
)
from pipeplan.runtime.measurement.tp_collectives import fit_tp_allreduce, measure_tp_allreduce, tp_message_bytes
from pipeplan.runtime.rank_errors import RuntimeFault
from pipeplan.runtime.transport.exchange import gather_json

PING_BYTES = (8, 1 << 16, 1 << 20, 1 << 22)
"""Message sizes of the ping-pongs (8 B gives the latency, the larger ones the bandwidth)."""
ALLREDUCE_BYTES = (1 << 20, 1 << 23, 1 << 25)
ALLREDUCE_BYTES_GPU = (1 << 20, 1 << 25, 1 << 28)
"""On GPUs the largest message is 256 MB, where an all-reduce's bus bandwidth levels off (nccl-tests' plateau)."""
MATMUL_SIZE = 8192
"""n of the n x n x n bf16 matmul the probe times: large enough to reach a GPU's matmul plateau."""
MATMUL_ROUNDS = 10
MATMUL_SECONDS = 3.0
"""How long the probe keeps a GPU multiplying, in rounds of MATMUL_ROUNDS matmuls: the rate it reports is the median
round of the second half, the sustained rate once clocks and power settle (the calibrated presets' A100 figure was
measured so: presets.calibrated.A100_MATMUL_FRACTION), not a short burst's."""
HANG_ENV = "PIPEPLAN_PROBE_HANG"
"""Test hook: the process whose rank this names joins the group and then never answers."""


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """What the probe measured (bytes/s, ms), as process 0 knows it."""

    speeds: tuple[float, ...]
    bandwidth_bytes_per_s: tuple[tuple[float, ...], ...]
    latency_ms: tuple[tuple[float, ...], ...]
    allreduce_bytes_per_s: float | None
    allreduce_latency_ms: float
    nodes: tuple[int, ...]
    memory_bytes: tuple[float, ...]
    kind: str
    backend: str
    message_overhead_ms: float = 0.0
    message_latency_ms: float = 0.0
    overhead_alone_ms: float = 0.0  # the one-cost fit (latency 0) on the same runs, reported beside the two-cost fit
    matmul_fractions: tuple[float | None, ...] | None = None  # per process; None: not measured (a CPU)
    tp_allreduce_bytes_per_s: float | None = None  # the TP all-reduce's fit (tp_collectives); None: one process
    tp_allreduce_latency_ms: float = 0.0


def fit_line(sizes: list[float], seconds: list[float]) -> tuple[float, float]:
    """(intercept s, slope s/byte) of a least-squares line through (size, time), both >= 0."""
    slope, intercept = np.polyfit(np.asarray(sizes, dtype=float), np.asarray(seconds, dtype=float), 1)
    return max(float(intercept), 0.0), max(float(slope), 1e-15)


def link_fit(sizes: list[float], seconds: list[float]) -> tuple[float, float]:
    """(latency s, bandwidth bytes/s) of a link from one-way times at several sizes.

    The line's slope is the inverse bandwidth; on a loaded machine the noise in the small messages' latency can
    exceed the large message's transfer time, and the slope then comes out near 0 (an absurd "4,194,304 GB/s").
    The bandwidth is capped at 10x what the largest message alone shows (size / its whole time), so the
    transfer is never predicted as less than a tenth of what was seen at that size.
    """
    intercept, slope = fit_line(sizes, seconds)
    largest = max(range(len(sizes)), key=lambda i: sizes[i])
    seen = sizes[largest] / max(seconds[largest], 1e-12)
    return intercept, min(1.0 / slope, 10.0 * seen)


def _wait(work: Any, timeout_s: float, what: str) -> None:
    """Wait for a point-to-point operation; a peer that does not answer in time is a RuntimeFault naming it."""
    try:
        done = work.wait(timeout=timedelta(seconds=timeout_s))
    except RuntimeError as exc:
        raise RuntimeFault(f"probe: {what} did not complete within {timeout_s:g} s (--timeout): {exc}") from None
    if done is False:
        raise RuntimeFault(f"probe: {what} did not complete within {timeout_s:g} s (--timeout)")


def ping_pong(peer: int, first: bool, nbytes: int, rounds: int, device: torch.device, timeout_s: float) -> float:
    """Median one-way seconds of `rounds` ping-pongs of nbytes with `peer` (`first` sends first)."""
    buf = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=device)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        if first:
            _wait(dist.isend(buf, peer), timeout_s, f"a send to process {peer}")
            _wait(dist.irecv(buf, peer), timeout_s, f"the reply of process {peer}")
        else:
            _wait(dist.irecv(buf, peer), timeout_s, f"a message from process {peer}")
            _wait(dist.isend(buf, peer), timeout_s, f"the reply to process {peer}")
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - t0) / 2)
    return statistics.median(times)


def measure_links(device: torch.device, rounds: int, timeout_s: float) -> tuple[list[list[float]], list[list[float]]]:
    """(bandwidth bytes/s, latency s) for every ordered pair; every process calls it, process 0 gets the matrices.

    Pairs take turns (a barrier between them) so no two pairs share the wire.
    a -> b is fitted from the ping-pongs that a starts, b -> a from those b starts.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    bandwidth = [[0.0] * world for _ in range(world)]
    latency = [[0.0] * world for _ in range(world)]
    for a in range(world):
        for b in range(world):
            if a == b:
                continue
            if rank in (a, b):
                peer = b if rank == a else a
                times = [ping_pong(peer, rank == a, n, rounds, device, timeout_s) for n in PING_BYTES]
                if rank == a:
                    latency[a][b], bandwidth[a][b] = link_fit([float(n) for n in PING_BYTES], times)
            _barrier(timeout_s, f"the link test of processes {a} and {b}")
    rows = torch.tensor([bandwidth, latency], dtype=torch.float64)
    dist.all_reduce(rows)  # each entry was filled on exactly one process
    return rows[0].tolist(), rows[1].tolist()


def measure_allreduce(device: torch.device, rounds: int) -> tuple[float | None, float]:
    """(bus bandwidth bytes/s, per-step latency s) of the group's all-reduce as the runtime does it; (None, 0) for one process.

    A least-squares line through the medians at 1, 8 and 32 MB (on GPUs 1, 32 and 256 MB).

    The runtime sums a stage's gradients as one bucket (runtime.execution.replicas: flatten, all-reduce, copy back), so
    that is what is timed, on four gradient-like tensors: the copies are part of what a plan's all-reduce costs.
    """
    from pipeplan.runtime.execution.replicas import flat_bucket, scatter_back

    world = dist.get_world_size()
    if world < 2:
        return None, 0.0
    sizes = ALLREDUCE_BYTES_GPU if device.type == "cuda" else ALLREDUCE_BYTES
    times = []
    for nbytes in sizes:
        grads = [torch.ones(nbytes // 16, dtype=torch.float32, device=device) for _ in range(4)]
        samples = []
        for _ in range(rounds):
            dist.barrier()
            t0 = time.perf_counter()
            bucket = flat_bucket(grads)
            dist.all_reduce(bucket)
            scatter_back(bucket, grads)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            samples.append(time.perf_counter() - t0)
        times.append(statistics.median(samples))
    result = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(result, op=dist.ReduceOp.MAX)  # the slowest process ends the collective
    steps = 2 * (world - 1)
    intercept, slope = fit_line([float(n) for n in sizes], result.tolist())
    return steps / world / slope, intercept / steps


def matmul_fraction(n: int, seconds: float, peak_tflops: float) -> float:
    """The share of `peak_tflops` an n x n x n matmul (2 n^3 FLOPs) taking `seconds` reached, at most 1."""
    return min(1.0, 2.0 * n**3 / seconds / (peak_tflops * 1e12))


def measure_matmul_fraction(device: torch.device) -> float | None:
    """This GPU's sustained large-matmul share of its kind's bf16 peak (MATMUL_SECONDS of rounds of MATMUL_ROUNDS
    bf16 matmuls of MATMUL_SIZE, the median round of the second half); None on a CPU or a GPU pipeplan has no peak
    for."""
    from pipeplan.core.hardware.devices import GPU_SPECS, kind_of_device_name

    if device.type != "cuda":
        return None
    kind = kind_of_device_name(_device_name(device))
    if kind not in GPU_SPECS:
        return None
    a = torch.randn(MATMUL_SIZE, MATMUL_SIZE, dtype=torch.bfloat16, device=device)
    b = torch.randn(MATMUL_SIZE, MATMUL_SIZE, dtype=torch.bfloat16, device=device)
    torch.matmul(a, b)  # warm-up: the library picks its kernel
    torch.cuda.synchronize(device)
    samples: list[float] = []
    started = time.perf_counter()
    while len(samples) < 2 or time.perf_counter() - started < MATMUL_SECONDS:
        t0 = time.perf_counter()
        for _ in range(MATMUL_ROUNDS):
            torch.matmul(a, b)
        torch.cuda.synchronize(device)
        samples.append((time.perf_counter() - t0) / MATMUL_ROUNDS)
    return matmul_fraction(MATMUL_SIZE, statistics.median(samples[len(samples) // 2 :]), GPU_SPECS[kind].bf16_tflops)


def _barrier(timeout_s: float, what: str) -> None:
    """A barrier bounded by the timeout."""
    work = dist.barrier(async_op=True)
    _wait(work, timeout_s, what)


def probe(
    profile: ModelProfile | None,
    steps: int,
    rounds: int,
    timeout_s: float,
    optimizer: str = "adam",
    module: str | None = None,
) -> ProbeResult | None:
    """Run the probe on this process (module docstring); process 0 gets the result, the others None. `module`: the
    MODULE_SPEC the user named for the profile's model (calibrate.build_profiled_model)."""
    from pipeplan.runtime.transport.process_group import init_distributed

    _, _, device = init_distributed(None, timeout_s)
    rank, world = dist.get_rank(), dist.get_world_size()
    if os.environ.get(HANG_ENV) == str(rank):
        while True:  # the test hook: joined, and never answers again
            time.sleep(3600)
    _barrier(timeout_s, "every process reaching the start of the probe (a peer never answered)")
    bandwidth, latency = measure_links(device, rounds, timeout_s) if world > 1 else ([[0.0]], [[0.0]])
    tp_points = measure_tp_allreduce(device, rounds, tp_message_bytes(profile), timeout_s) if world > 1 else []
    tp_rate, tp_latency = fit_tp_allreduce(tp_points) if tp_points else (None, 0.0)
    speed, pipeline_runs = 1.0, []
    if profile is None:
        allreduce_bw, allreduce_lat = measure_allreduce(device, rounds)
    else:
        model = build_profiled_model(profile, device, module)
        precision = profile.numerics[1]  # the steps timed as the profile was measured (core.precision)
        dp_runs = [
            run_plan(plan, model, device, steps, timeout_s, optimizer, precision) for plan in data_parallel_plans(profile, world)
        ]
        speed = speed_of(profile, dp_runs)
        allreduce_lat = max(max(row) for row in latency)
        allreduce_bw = allreduce_of(dp_runs, profile.total_param_bytes, world, allreduce_lat) if world > 1 else None
        if world > 1:
            pipeline_runs = [
                run_plan(plan, model, device, steps, timeout_s, optimizer, precision) for plan in pipeline_plans(profile, world)
            ]
    host = socket.gethostname()
    mine = {
        "speed": speed, "host": host, "node": node_key(host), "memory": _memory_bytes(device), "device": _device_name(device),
        "matmul": measure_matmul_fraction(device),
    }  # fmt: skip
    everyone: list[dict[str, Any]] | None = gather_json(mine)  # str keys; numbers and strings
    if everyone is None:
        return None
    hosts = list(dict.fromkeys(p["host"] for p in everyone))
    node_keys = list(dict.fromkeys(p["node"] for p in everyone))
    per_host = {h: sum(p["host"] == h for p in everyone) for h in hosts}
    kind = everyone[0]["device"]
    result = ProbeResult(
        speeds=tuple(p["speed"] for p in everyone),
        bandwidth_bytes_per_s=tuple(tuple(row) for row in bandwidth),
        latency_ms=tuple(tuple(s_to_ms(v) for v in row) for row in latency),
        allreduce_bytes_per_s=allreduce_bw,
        allreduce_latency_ms=s_to_ms(allreduce_lat),
        nodes=tuple(node_keys.index(p["node"]) for p in everyone),
        memory_bytes=tuple(p["memory"] / (per_host[p["host"]] if kind == "cpu" else 1) for p in everyone),
        kind=kind,
        backend=dist.get_backend(),
        matmul_fractions=tuple(p["matmul"] for p in everyone),
        tp_allreduce_bytes_per_s=tp_rate,
        tp_allreduce_latency_ms=s_to_ms(tp_latency),
    )
    if pipeline_runs:
        assert profile is not None
        cluster = probe_cluster(result, "probe", profile)
        overhead, latency = fit_messages(profile, cluster, pipeline_runs, optimizer)
        alone, _ = fit_messages(profile, cluster, pipeline_runs, optimizer, with_latency=False)
        result = dataclasses.replace(result, message_overhead_ms=overhead, message_latency_ms=latency, overhead_alone_ms=alone)
    return result


def node_key(host: str, env: dict[str, str] | None = None) -> str:
    """The node a process belongs to: its host and its launcher agent (torchrun's GROUP_RANK, the node rank).

    Two agents on one machine (`torchrun --nnodes 2` twice on one host, as a
    test does) are two nodes, as the launcher and NCCL see them; processes of
    one agent share a node. Memory is still shared per host.
    """
    group = (os.environ if env is None else env).get("GROUP_RANK", "0")
    return f"{host}#{group}"


def _memory_bytes(device: torch.device) -> float:
    """This device's memory: the GPU's, or the machine's RAM (shared by the processes on it)."""
    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def _device_name(device: torch.device) -> str:
    """`cpu`, or the CUDA device's product name."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def probe_cluster(result: ProbeResult, name: str, profile: ModelProfile | None) -> Cluster:
    """The probe's result as a Cluster, every value rounded as its file records it (GB/s to 4 decimals, microseconds
    to 2, 1 for the message costs, GiB to 3, speeds to 4).

    A measured matmul fraction is kept to 3 decimals (a device without one has none).
    CPU processes are kind `cpu` with speeds relative to the profile's CPU. GPUs are their kind when pipeplan knows
    it (else `generic`) with speeds on the GPU scale: the measured ratio times the profile's kind's speed.
    """
    from pipeplan.core.hardware.cluster import Device
    from pipeplan.core.hardware.devices import kind_of_device_name, nominal_speed, speed_scale
    from pipeplan.sim.cost.speeds import profile_kind

    kind = "cpu" if result.kind == "cpu" else (kind_of_device_name(result.kind) or "generic")
    scale = 1.0
    if kind != "cpu" and profile is not None:
        reference = profile_kind(profile)
        scale = (nominal_speed(reference) or 1.0) if reference is not None else 1.0
    fractions = result.matmul_fractions or (None,) * len(result.speeds)
    devices = tuple(
        Device(
            i, kind, gib_to_bytes(round(bytes_to_gib(memory), 3)), round(speed * scale, 4), node,
            None if fraction is None else round(fraction, 3),
        )
        for i, (speed, memory, node, fraction) in enumerate(
            zip(result.speeds, result.memory_bytes, result.nodes, fractions, strict=True)
        )
    )  # fmt: skip
    n = len(devices)

    def rate(value: float) -> float:  # the file's GB/s, 4 decimals
        return gb_per_s_to_bytes_per_s(round(bytes_per_s_to_gb_per_s(value), 4))

    def latency(value_ms: float, digits: int) -> float:  # the file's us, read back as io reads it (through seconds)
        return s_to_ms(us_to_s(round(ms_to_us(value_ms), digits)))

    bandwidth = [[rate(result.bandwidth_bytes_per_s[a][b]) if a != b else 0.0 for b in range(n)] for a in range(n)]
    latency_ms = [[latency(result.latency_ms[a][b], 2) if a != b else 0.0 for b in range(n)] for a in range(n)]
    allreduce, tp = result.allreduce_bytes_per_s, result.tp_allreduce_bytes_per_s
    return Cluster(
        name=name, devices=devices, bandwidth_bytes_per_s=bandwidth, latency_ms=latency_ms, speed_reference=speed_scale(kind),
        allreduce_bytes_per_s=None if allreduce is None else rate(allreduce),
        allreduce_latency_ms=latency(result.allreduce_latency_ms, 2) if allreduce is not None else 0.0,
        message_overhead_ms=latency(result.message_overhead_ms, 1) if result.message_overhead_ms > 0 else 0.0,
        message_latency_ms=latency(result.message_latency_ms, 1) if result.message_latency_ms > 0 else 0.0,
        tp_allreduce_bytes_per_s=None if tp is None else rate(tp),
        tp_allreduce_latency_ms=latency(result.tp_allreduce_latency_ms, 2) if tp is not None else 0.0,
    )  # fmt: skip


def cluster_json(result: ProbeResult, name: str, profile: ModelProfile | None) -> dict[str, Any]:
    """The probe's result as a `pipeplan.cluster/1` object in matrix form (io.cluster_json's, with the probe's notes)."""
    from pipeplan.io.cluster_json import cluster_to_json

    notes = f"measured by pipeplan probe over {result.backend}" + (
        f" against profile {profile.name}" if profile is not None else " (no profile: speeds 1.0)"
    )
    return cluster_to_json(probe_cluster(result, name, profile), notes)
