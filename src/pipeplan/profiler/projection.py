"""Roofline projection of per-layer work onto a GPU from its spec sheet, so a laptop can plan for an H100 cluster.

For each layer, each direction (forward, backward) and each batch size:

    time_ms = max(1e3 · flops / (peak_flops_per_s · efficiency), 1e3 · bytes_moved / hbm_bytes_per_s,
                  kernels · launch_ms)

with the peak of the chosen dtype (`fp32`: the fp32 rate; `bf16`: the 16-bit
tensor-core rate) from `pipeplan.core.hardware.devices.GPU_SPECS`. `kernels` counts the
operators that launch a kernel (flops.KernelCounter), so a layer at a small
batch costs at least its launches: projected at every batch size, the times
follow the batch size as a GPU's do, not linearly (`project_curves`).

Note:
    `efficiency` (default 1.0) scales the compute peak only; 1.0 gives the
    roofline's ideal, a lower bound on time. Large matrix products reach
    roughly 0.6–0.8 of the dense peak in practice, so `--efficiency 0.7` is a
    reasonable planning value. Elementwise FLOPs (see `flops`) are not
    modelled; their memory traffic is in the bytes term.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from pipeplan.core.errors import ProfileError
from pipeplan.core.hardware.devices import GPU_SPECS, GpuSpec
from pipeplan.core.profile import ModelProfile
from pipeplan.core.units import gb_per_s_to_bytes_per_s, s_to_ms, us_to_ms
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


def roofline_ms(
    flops: float, bytes_moved: float, gpu: GpuSpec, dtype: str = "fp32", efficiency: float = 1.0, kernels: int = 0
) -> float:
    """Milliseconds for work of flops and bytes_moved in `kernels` launches on gpu: the slowest of compute, memory
    and the launches."""
    _check_efficiency(efficiency)
    compute_s = flops / (peak_flops_per_s(gpu, dtype) * efficiency)
    memory_s = bytes_moved / gb_per_s_to_bytes_per_s(gpu.hbm_gb_per_s)
    return max(s_to_ms(compute_s), s_to_ms(memory_s), us_to_ms(kernels * gpu.launch_us))


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
            fwd_ms=roofline_ms(w.fwd_flops, w.fwd_bytes, spec, dtype, efficiency, w.fwd_kernels),
            bwd_ms=roofline_ms(w.bwd_flops, w.bwd_bytes, spec, dtype, efficiency, w.bwd_kernels),
            flops=float(w.flops),
            bytes_moved=float(w.bytes_moved),
        )
        for layer, w in zip(profile.layers, work, strict=True)
    )
    return replace(profile, layers=layers, reference_device=spec.name, measured=False)


def project_curves(
    module: str,
    options: dict[str, str],
    dataset: str,
    batch_sizes: Sequence[int],
    gpu: str,
    dtype: str = "fp32",
    efficiency: float = 1.0,
) -> ModelProfile:
    """Build MODULE_SPEC on the meta device as `pipeplan train` would, count its work at every batch size and project
    each onto `gpu`: a profile with a curve per layer, reference_device = the GPU, measured = False.

    Nothing is allocated or computed (the model lives on the meta device); optimizer steps are left to the cost
    model's estimate from the GPU's memory bandwidth.

    Raises:
        ProfileError: unknown GPU, dtype or efficiency, or a model that is not a chain of tensors.
    """
    import torch

    from pipeplan.core.profile import ProfileSource
    from pipeplan.models.build import build_model
    from pipeplan.models.specs import ModelSpec
    from pipeplan.profiler.curves import assemble
    from pipeplan.profiler.measure import measure_layers

    spec_gpu = resolve_gpu(gpu)
    peak_flops_per_s(spec_gpu, dtype)
    _check_efficiency(efficiency)
    with torch.device("meta"):
        model = build_model(module, dict(options), dataset)
    layers = model.layers
    if dtype == "bf16":
        for layer in layers:
            layer.to(torch.bfloat16)

    def sample(b: int) -> torch.Tensor:
        x = model.batch(b).to("meta")
        return x.to(torch.bfloat16) if dtype == "bf16" and x.is_floating_point() else x

    def target(b: int) -> torch.Tensor:
        return model.targets(b).to("meta")

    chain = ModelSpec(
        model.spec.name,
        layers,
        model.layer_names,
        sample_input=sample,
        sample_target=target,
        loss_fn=model.loss_fn,
        layer_inputs=model.layer_inputs,
    )
    measured = []
    for b in batch_sizes:
        counted = measure_layers(chain, None, b, runs=0, whole=False)
        work = [size.work for size in counted.layers]
        fwd = tuple(roofline_ms(w.fwd_flops, w.fwd_bytes, spec_gpu, dtype, efficiency, w.fwd_kernels) for w in work)
        bwd = tuple(roofline_ms(w.bwd_flops, w.bwd_bytes, spec_gpu, dtype, efficiency, w.bwd_kernels) for w in work)
        measured.append(replace(counted, device=spec_gpu.name, fwd_ms=fwd, bwd_ms=bwd))
    source = ProfileSource(module, tuple(sorted(options.items())), model.dataset.name, dtype)
    profile = assemble(model.spec.name, measured, [{} for _ in layers], None, source)
    return replace(profile, measured=False)


def _check_efficiency(efficiency: float) -> None:
    """Raise ProfileError unless 0 < efficiency <= 1."""
    if isinstance(efficiency, bool) or not isinstance(efficiency, (int, float)) or not 0 < efficiency <= 1:
        raise ProfileError(f"efficiency must be in (0, 1], got {efficiency!r}")
