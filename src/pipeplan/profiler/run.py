"""What `pipeplan profile` runs: a model built as `pipeplan train` builds it, measured at several batch sizes."""

from __future__ import annotations

import torch

from pipeplan.core.errors import ProfileError
from pipeplan.core.profile import ModelProfile, ProfileSource
from pipeplan.models.allocator import steady_cpu_allocator
from pipeplan.models.build import build_model
from pipeplan.profiler.curves import profile_batch_sizes


def torch_device(name: str) -> torch.device:
    """The torch.device for --device, checked to exist here.

    Raises:
        ProfileError: not cpu, cuda or cuda:N, or no CUDA device.
    """
    try:
        target = torch.device(name)
    except (RuntimeError, ValueError):
        raise ProfileError(f"--device must be cpu, cuda or cuda:N, got {name!r}") from None
    if target.type not in ("cpu", "cuda"):
        raise ProfileError(f"--device must be cpu, cuda or cuda:N, got {name!r}")
    if target.type == "cuda" and not torch.cuda.is_available():
        raise ProfileError(f"--device {name!r}: no CUDA device is available")
    return target


def measure_model(
    module_spec: str,
    options: dict[str, str],
    dataset: str,
    sizes: tuple[int, ...],
    device: str,
    runs: int,
    warmup: int,
    threads: int,
    quiet: bool,
) -> ModelProfile:
    """Build the model as `pipeplan train` does and measure it at every size on its own data."""
    steady_cpu_allocator()  # the allocator train runs with (models.allocator)
    target = torch_device(device)
    model = build_model(module_spec, dict(options), dataset)
    for layer in model.layers:
        layer.to(target)
    spec = model.chain_spec()
    source = ProfileSource(module_spec, tuple(sorted(options.items())), model.dataset.name, "float32")
    return profile_batch_sizes(spec, sizes, runs=runs, warmup=warmup, threads=threads, source=source, progress=not quiet)
