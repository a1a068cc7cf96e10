"""One profiling session: a MODULE_SPEC measured at several batch sizes on this machine, or projected onto a GPU."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pipeplan.core.errors import ProfileError, TrainConfigError
from pipeplan.core.model_source import USER_DATA
from pipeplan.core.precision import MEASURED_DTYPES, check_profile_numerics
from pipeplan.core.profile import ModelProfile, ProfileSource, check_batch_sizes


def torch_device(name: str, label: str = "device") -> torch.device:
    """The torch.device `name`, checked to exist here (`label` names the argument or flag in errors).

    Raises:
        ProfileError: not cpu, cuda or cuda:N, or no CUDA device.
    """
    try:
        target = torch.device(name)
    except (RuntimeError, ValueError):
        raise ProfileError(f"{label} must be cpu, cuda or cuda:N, got {name!r}") from None
    if target.type not in ("cpu", "cuda"):
        raise ProfileError(f"{label} must be cpu, cuda or cuda:N, got {name!r}")
    if target.type == "cuda" and not torch.cuda.is_available():
        raise ProfileError(f"{label} {name!r}: no CUDA device is available")
    return target


def session_batch_sizes(batch_size: int, given: Sequence[int] | None, name: str = "batch_sizes") -> tuple[int, ...]:
    """The sizes to measure: `given` checked (increasing, ending at batch_size), or powers of two up to batch_size.

    Raises:
        ProfileError: naming `name` and the sizes.
    """
    from pipeplan.profiler.curves import default_batch_sizes

    if given is None:
        return default_batch_sizes(batch_size)
    sizes = check_batch_sizes(list(given), name)
    if sizes[-1] != batch_size:
        raise ProfileError(f"{name} must end at the batch size {batch_size} (the reference size), got {list(sizes)}")
    return sizes


def profile_spec(module_spec: str, batch_size: int, options: dict[str, object], dataset: str,
                 batch_sizes: Sequence[int] | None, project_to: str | None, dtype: str, efficiency: float, runs: int,
                 warmup: int, threads: int, progress: bool, device: str = "cpu",
                 precision: str = "full", data: str | None = None, loss: str | None = None) -> ModelProfile:  # fmt: skip
    """Build MODULE_SPEC as `pipeplan train` does (in `dtype`, on your `data` and `loss` when given) and measure it at
    every size (one `threads` count), its forwards under `precision`'s autocast, or project it.

    With `data` (models.user_data) every size measures the first samples of the user's data (cycled when it holds
    fewer), and the source records the dataset as `data` (the factory itself is never recorded: a profile does not
    choose code to run); `loss` replaces the spec's loss.

    Raises:
        ProfileError: a bad dtype, precision, GPU, efficiency or size, or a model that is not a chain of tensors.
    """
    from pipeplan.profiler.projection import project_curves, resolve_gpu

    check_profile_numerics(dtype, precision, project_to is not None)
    sizes = session_batch_sizes(batch_size, batch_sizes)
    texts = {key: str(value) for key, value in options.items()}  # as a profile's source records them: train builds alike
    from pipeplan.models.allocator import set_cpu_threads

    set_cpu_threads(threads)
    if project_to is not None:
        resolve_gpu(project_to)
        return project_curves(module_spec, texts, dataset, sizes, project_to, dtype, efficiency)
    from pipeplan.models.allocator import steady_cpu_allocator
    from pipeplan.models.build import build_model
    from pipeplan.profiler.curves import profile_batch_sizes

    steady_cpu_allocator()  # the allocator train runs with (models.allocator)
    from pipeplan.models.autocast import autocast

    try:
        model = build_model(module_spec, dict(texts), dataset, MEASURED_DTYPES[dtype], data=data, loss=loss)
    except TrainConfigError as exc:
        if data is None and loss is None:
            raise
        raise ProfileError(str(exc)) from None  # the user's data or loss refused (models.user_data), as profile says it
    target = torch_device(device)
    for layer in model.layers:
        layer.to(target)
    recorded = USER_DATA if data is not None else model.dataset.name
    source = ProfileSource(module_spec, tuple(sorted(texts.items())), recorded, MEASURED_DTYPES[dtype], precision)
    with autocast(precision, target):  # forwards and backwards alike: their gradients are the same (test_precision)
        return profile_batch_sizes(model.chain_spec(), sizes, runs=runs, warmup=warmup, threads=threads, source=source,
                                   progress=progress)  # fmt: skip
