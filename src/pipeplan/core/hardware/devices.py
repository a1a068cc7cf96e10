"""The device kinds pipeplan knows: peak numbers of each GPU, the CPU, and what a device's `speed` is relative to.

Note:
    All GPU figures are the vendor's peak *dense* rates (no 2:4 sparsity) of
    the SXM module unless the kind says otherwise. `memory_gib` is the
    marketed size read as GiB (2**30 bytes): a "16 GB" V100 reports 16160 MiB
    in nvidia-smi, within 2% of 16 GiB, and pipeplan uses GiB for every
    `memory_gb` field. `bf16_tflops` is the 16-bit tensor-core peak; the V100
    has no bf16, so its entry is the fp16 tensor-core figure (what a
    mixed-precision run on it gets).

    Speeds. A device's `speed` is its training throughput relative to a
    reference kind. GPUs (and `generic` devices) share one scale, V100 = 1.0;
    `speed` is each GPU kind's estimate on it (sources in
    presets/clusters.py). CPUs have a scale of their own, `cpu` = 1.0 being
    the CPU a profile was measured on (`pipeplan probe` measures each
    process's speed against it). A profile measured on (or projected to)
    kind X runs on a device of kind Y at speed(Y) / speed(X); a CPU profile
    on GPUs, or the reverse, is refused (sim.cost.speeds).

    `launch_us` is the least time one kernel (one operator, on the CPU)
    takes however small its input: launch and dispatch overhead of an eager
    framework. It is an order-of-magnitude figure: CUDA launches take about
    5 us and PyTorch's eager dispatch adds about as much again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pipeplan.core.errors import ClusterError


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """Peak rates of one device kind: TFLOP/s (10^12/s), memory GB/s (10^9 bytes/s), memory GiB, speed, launch floor."""

    name: str
    fp32_tflops: float
    bf16_tflops: float
    hbm_gb_per_s: float
    memory_gib: float
    speed: float = 1.0
    launch_us: float = 10.0


GPU_SPECS: dict[str, GpuSpec] = {
    # NVIDIA Tesla V100 SXM2 datasheet (2017): 15.7 TFLOPS fp32, 125 TFLOPS fp16 tensor, 900 GB/s HBM2, 16/32 GB.
    "V100": GpuSpec("V100", fp32_tflops=15.7, bf16_tflops=125.0, hbm_gb_per_s=900.0, memory_gib=16.0, speed=1.0),
    # NVIDIA A100 datasheet (2020), SXM4 40GB: 19.5 fp32, 312 bf16 dense, 1555 GB/s HBM2.
    "A100": GpuSpec("A100", fp32_tflops=19.5, bf16_tflops=312.0, hbm_gb_per_s=1555.0, memory_gib=40.0, speed=2.0),
    # Same datasheet, SXM4 80GB: faster HBM2e, 2039 GB/s.
    "A100-80GB": GpuSpec("A100-80GB", fp32_tflops=19.5, bf16_tflops=312.0, hbm_gb_per_s=2039.0, memory_gib=80.0, speed=2.0),
    # NVIDIA H100 datasheet (2023), SXM5: 67 fp32, 989 bf16 dense (1979 with sparsity), 3.35 TB/s HBM3, 80 GB.
    "H100": GpuSpec("H100", fp32_tflops=67.0, bf16_tflops=989.0, hbm_gb_per_s=3350.0, memory_gib=80.0, speed=5.0),
    # NVIDIA H200 datasheet (2024), SXM: same compute as H100, 4.8 TB/s HBM3e, 141 GB; speed: the H100's, the
    # memory-bound part of training 1.4x faster (NVIDIA quotes 1.1-1.2x for LLM training): 5.5.
    "H200": GpuSpec("H200", fp32_tflops=67.0, bf16_tflops=989.0, hbm_gb_per_s=4800.0, memory_gib=141.0, speed=5.5),
    # NVIDIA L4 datasheet (2023), PCIe: 30.3 fp32, 121 bf16 dense (242 with sparsity), 300 GB/s GDDR6, 24 GB;
    # speed 0.6: the V100's tensor peak, a third of its memory bandwidth.
    "L4": GpuSpec("L4", fp32_tflops=30.3, bf16_tflops=121.0, hbm_gb_per_s=300.0, memory_gib=24.0, speed=0.6),
}

CPU_KIND = "cpu"
"""A CPU process: speeds relative to the CPU its profile was measured on; memory_gb must be given."""

CPU_SPEC = GpuSpec(CPU_KIND, fp32_tflops=0.1, bf16_tflops=0.1, hbm_gb_per_s=10.0, memory_gib=0.0, speed=1.0, launch_us=10.0)
"""Nominal single-thread figures of a CPU for the floor of one-size CPU profiles (sim.cost.layers): 10 GB/s of
memory traffic and 10 us per operator (PyTorch's eager dispatch); the FLOP rates are placeholders, never projected to."""

GENERIC_KIND = "generic"
"""A device with no spec entry: its file must give memory_gb and speed explicitly (speed on the GPU scale)."""

DEVICE_KINDS: tuple[str, ...] = (*GPU_SPECS, CPU_KIND, GENERIC_KIND)
"""Every device kind a cluster file may name (case-insensitive)."""

GPU_SCALE = "V100"
"""The kind whose speed is 1.0 on the GPU scale."""


def canonical_kind(kind: object, field: str = "kind") -> str:
    """Return the canonical spelling of a device kind (case-insensitive match).

    Raises:
        ClusterError: naming field and value and listing the known kinds.
    """
    if isinstance(kind, str):
        for known in DEVICE_KINDS:
            if known.lower() == kind.strip().lower():
                return known
    raise ClusterError(f"{field} must be one of {', '.join(DEVICE_KINDS)}, got {kind!r}")


def gpu_spec(kind: str) -> GpuSpec:
    """Return the spec of a GPU kind (case-insensitive).

    Raises:
        ClusterError: when kind is unknown, `cpu` or `generic` (which have no GPU spec).
    """
    name = canonical_kind(kind)
    if name not in GPU_SPECS:
        raise ClusterError(f"device kind {kind!r} has no GPU spec; known GPUs: {', '.join(GPU_SPECS)}")
    return GPU_SPECS[name]


def device_spec(kind: str) -> GpuSpec | None:
    """The spec of a known kind (GPU or cpu), None for generic or anything else."""
    if kind == CPU_KIND:
        return CPU_SPEC
    return GPU_SPECS.get(kind)


def speed_scale(kind: str) -> str:
    """The scale a kind's speed is on: `cpu` for CPUs, `V100` for GPUs and generic devices."""
    return CPU_KIND if kind == CPU_KIND else GPU_SCALE


def nominal_speed(kind: str) -> float | None:
    """A kind's speed on its scale (cpu and V100: 1.0), None for generic (its files give the speed)."""
    spec = device_spec(kind)
    return None if spec is None else spec.speed


def kind_of_device_name(name: object) -> str | None:
    """The known kind a device name stands for: a kind (`h100`), `cpu`, or a product name (`NVIDIA H100 80GB HBM3`).

    None when the name is no known kind (`unknown`, `local`, or a GPU pipeplan has no figures for).
    """
    if not isinstance(name, str):
        return None
    text = name.strip().upper()
    for known in (*GPU_SPECS, CPU_KIND):
        if text == known.upper():
            return known
    words = set(re.split(r"[^A-Z0-9]+", text))
    if "A100" in words:
        return "A100-80GB" if "80GB" in words else "A100"
    return next((kind for kind in ("H200", "H100", "V100", "L4") if kind in words), None)
