"""Peak numbers of the GPU kinds pipeplan knows: the one list of known device kinds.

Note:
    All figures are the vendor's peak *dense* rates (no 2:4 sparsity) of the
    SXM module unless the kind says otherwise. `memory_gib` is the marketed
    size read as GiB (2**30 bytes): a "16 GB" V100 reports 16160 MiB in
    nvidia-smi, within 2% of 16 GiB, and pipeplan uses GiB for every
    `memory_gb` field. `bf16_tflops` is the 16-bit tensor-core peak; the V100
    has no bf16, so its entry is the fp16 tensor-core figure (what a
    mixed-precision run on it gets).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeplan.core.errors import ClusterError


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """Peak rates of one GPU kind: TFLOP/s (10^12/s), HBM GB/s (10^9 bytes/s), memory GiB."""

    name: str
    fp32_tflops: float
    bf16_tflops: float
    hbm_gb_per_s: float
    memory_gib: float


GPU_SPECS: dict[str, GpuSpec] = {
    # NVIDIA Tesla V100 SXM2 datasheet (2017): 15.7 TFLOPS fp32, 125 TFLOPS fp16 tensor, 900 GB/s HBM2, 16/32 GB.
    "V100": GpuSpec("V100", fp32_tflops=15.7, bf16_tflops=125.0, hbm_gb_per_s=900.0, memory_gib=16.0),
    # NVIDIA A100 datasheet (2020), SXM4 40GB: 19.5 fp32, 312 bf16 dense, 1555 GB/s HBM2.
    "A100": GpuSpec("A100", fp32_tflops=19.5, bf16_tflops=312.0, hbm_gb_per_s=1555.0, memory_gib=40.0),
    # Same datasheet, SXM4 80GB: faster HBM2e, 2039 GB/s.
    "A100-80GB": GpuSpec("A100-80GB", fp32_tflops=19.5, bf16_tflops=312.0, hbm_gb_per_s=2039.0, memory_gib=80.0),
    # NVIDIA H100 datasheet (2023), SXM5: 67 fp32, 989 bf16 dense (1979 with sparsity), 3.35 TB/s HBM3, 80 GB.
    "H100": GpuSpec("H100", fp32_tflops=67.0, bf16_tflops=989.0, hbm_gb_per_s=3350.0, memory_gib=80.0),
    # NVIDIA H200 datasheet (2024), SXM: same compute as H100, 4.8 TB/s HBM3e, 141 GB.
    "H200": GpuSpec("H200", fp32_tflops=67.0, bf16_tflops=989.0, hbm_gb_per_s=4800.0, memory_gib=141.0),
    # NVIDIA L4 datasheet (2023), PCIe: 30.3 fp32, 121 bf16 dense (242 with sparsity), 300 GB/s GDDR6, 24 GB.
    "L4": GpuSpec("L4", fp32_tflops=30.3, bf16_tflops=121.0, hbm_gb_per_s=300.0, memory_gib=24.0),
}

GENERIC_KIND = "generic"
"""A device with no spec entry: its file must give memory_gb and speed explicitly."""

DEVICE_KINDS: tuple[str, ...] = (*GPU_SPECS, GENERIC_KIND)
"""Every device kind a cluster file may name (case-insensitive)."""


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
        ClusterError: when kind is unknown or `generic` (which has no spec).
    """
    name = canonical_kind(kind)
    if name not in GPU_SPECS:
        raise ClusterError(f"device kind {kind!r} has no GPU spec; known GPUs: {', '.join(GPU_SPECS)}")
    return GPU_SPECS[name]
