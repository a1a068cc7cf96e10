"""Roofline projection of per-layer work onto a GPU from its spec sheet, so a laptop can plan for an H100 cluster.

For each layer and each direction (forward, backward):

    time_ms = 1e3 · max(flops / (peak_flops_per_s · efficiency), bytes_moved / hbm_bytes_per_s)

with the peak of the chosen dtype (`fp32`: the fp32 rate; `bf16`: the 16-bit
tensor-core rate) from `pipeplan.presets.gpus.GPU_SPECS`.

Note:
    `efficiency` (default 1.0) scales the compute peak only; 1.0 gives the
    roofline's ideal, a lower bound on time. Large matrix products reach
    roughly 0.6–0.8 of the dense peak in practice, so `--efficiency 0.7` is a
    reasonable planning value. Kernel-launch latency and elementwise FLOPs
    (see `flops`) are not modelled; their memory traffic is in the bytes term.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from pipeplan.core.errors import ProfileError
from pipeplan.core.profile import ModelProfile
from pipeplan.presets.gpus import GPU_SPECS, GpuSpec
from pipeplan.profiler.flops import LayerWork

DTYPES = ("fp32", "bf16")
"""Training dtypes a projection knows: each selects a peak rate of the spec."""


def resolve_gpu(kind: str) -> GpuSpec:
    """The spec of a GPU kind, matched case-insensitively (`a100`, `H100`).

    Raises:
        ProfileError: naming the value and the known kinds.
    """
    if isinstance(kind, str):
        for name, spec in GPU_SPECS.items():
            if name.lower() == kind.strip().lower():
                return spec
    raise ProfileError(f"--project-to must be one of {', '.join(GPU_SPECS)}, got {kind!r}")


def peak_flops_per_s(gpu: GpuSpec, dtype: str) -> float:
    """The dense peak FLOP/s of gpu for dtype.

    Raises:
        ProfileError: for a dtype other than fp32 or bf16.
    """
    if dtype == "fp32":
        return gpu.fp32_tflops * 1e12
    if dtype == "bf16":
        return gpu.bf16_tflops * 1e12
    raise ProfileError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")


def roofline_ms(flops: float, bytes_moved: float, gpu: GpuSpec, dtype: str = "fp32", efficiency: float = 1.0) -> float:
    """Milliseconds for work of flops and bytes_moved on gpu: the slower of compute and memory."""
    _check_efficiency(efficiency)
    compute_s = flops / (peak_flops_per_s(gpu, dtype) * efficiency)
    memory_s = bytes_moved / (gpu.hbm_gb_per_s * 1e9)
    return max(compute_s, memory_s) * 1e3


def project_profile(
    profile: ModelProfile, work: Sequence[LayerWork], gpu: str, dtype: str = "fp32", efficiency: float = 1.0
) -> ModelProfile:
    """profile with every layer's times replaced by its roofline time on gpu; reference_device = the GPU, measured = False.

    Sizes (activation, parameter, saved, cut bytes) are kept: they depend on the
    dtype the model was profiled in, not on the device.

    Raises:
        ProfileError: unknown GPU or dtype, efficiency outside (0, 1], or
            work that does not match the profile's layers.
    """
    spec = resolve_gpu(gpu)
    peak_flops_per_s(spec, dtype)
    _check_efficiency(efficiency)
    if len(work) != profile.num_layers or any(w.name != layer.name for w, layer in zip(work, profile.layers, strict=False)):
        raise ProfileError(
            f"work for {len(work)} layers does not match profile {profile.name!r} with {profile.num_layers} layers"
        )
    layers = tuple(
        replace(
            layer,
            fwd_ms=roofline_ms(w.fwd_flops, w.fwd_bytes, spec, dtype, efficiency),
            bwd_ms=roofline_ms(w.bwd_flops, w.bwd_bytes, spec, dtype, efficiency),
            flops=float(w.flops),
            bytes_moved=float(w.bytes_moved),
        )
        for layer, w in zip(profile.layers, work, strict=True)
    )
    return replace(profile, layers=layers, reference_device=spec.name, measured=False)


def _check_efficiency(efficiency: float) -> None:
    """Raise ProfileError unless 0 < efficiency <= 1."""
    if isinstance(efficiency, bool) or not isinstance(efficiency, (int, float)) or not 0 < efficiency <= 1:
        raise ProfileError(f"efficiency must be in (0, 1], got {efficiency!r}")
