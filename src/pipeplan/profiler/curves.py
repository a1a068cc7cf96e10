"""A profile over several batch sizes: every layer measured at each size, and each layer's optimizer steps.

Times follow the microbatch size in no simple way on real hardware (kernel
launches, weight reads and low occupancy make small batches cost more per
sample), so `pipeplan profile` measures every layer at several sizes and the
cost model interpolates between them (sim.cost.layers). Activation and saved
bytes are measured at every size too, not assumed linear.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch
from torch import nn

from pipeplan.core.checks import check_positive_int
from pipeplan.core.errors import ProfileError
from pipeplan.core.profile import LayerCurve, LayerProfile, ModelProfile, ProfileSource, check_batch_sizes
from pipeplan.core.units import s_to_ms
from pipeplan.models.specs import ModelSpec
from pipeplan.profiler.measure import Measurement, measure_layers
from pipeplan.profiler.split_timing import timed_split

OPTIMIZERS: dict[str, Callable[[list[nn.Parameter]], torch.optim.Optimizer]] = {
    "sgd": lambda params: torch.optim.SGD(params, lr=1e-12),
    "sgd_momentum": lambda params: torch.optim.SGD(params, lr=1e-12, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=1e-12),
}
"""The optimizer steps a profile times per layer, as `pipeplan train` builds them (a learning rate that leaves the
weights as they are; the work of a step does not depend on it)."""


def default_batch_sizes(batch_size: int) -> tuple[int, ...]:
    """Powers of two from 1 up to batch_size, plus batch_size itself."""
    check_positive_int(ProfileError, "--batch-size", batch_size)
    sizes = []
    b = 1
    while b < batch_size:
        sizes.append(b)
        b *= 2
    return (*sizes, batch_size)


def optimizer_step_ms(layers: Sequence[nn.Module], runs: int = 10, warmup: int = 2) -> list[dict[str, float]]:
    """Median ms of one step of every optimizer of OPTIMIZERS over each layer's parameters (0 without parameters).

    Each round steps every layer in chain order, one optimizer per layer, as a
    training step walks the whole model's parameters: a layer's weights and
    state then come from memory, not from a cache the same step warmed a
    moment ago. Gradients a layer does not have yet are zeros (the step's work
    does not depend on their values).
    """
    owned = [[p for p in layer.parameters() if p.requires_grad] for layer in layers]
    for params in owned:
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
    out: list[dict[str, float]] = [dict.fromkeys(OPTIMIZERS, 0.0) for _ in layers]
    for name, make in OPTIMIZERS.items():
        optimizers = [make(params) if params else None for params in owned]
        samples: list[list[float]] = [[] for _ in layers]
        for r in range(warmup + runs):
            for i, optimizer in enumerate(optimizers):
                if optimizer is None:
                    continue
                t0 = time.perf_counter()
                optimizer.step()
                if r >= warmup:
                    samples[i].append(s_to_ms(time.perf_counter() - t0))
        for i, times in enumerate(samples):
            if times:
                out[i][name] = statistics.median(times)
    return out


def profile_batch_sizes(
    spec: ModelSpec,
    batch_sizes: Sequence[int],
    *,
    runs: int = 10,
    warmup: int = 3,
    threads: int | None = None,
    source: ProfileSource | None = None,
    progress: bool = False,
) -> ModelProfile:
    """Measure `spec` at every size of `batch_sizes` (sizes, times, I and W) and time its optimizer steps.

    The profile's `batch_size` is the largest size; its curves hold the
    medians at every size; `threads` and `source` are recorded as given.

    Raises:
        ProfileError: bad sizes or a layer that does not return one tensor.
    """
    sizes = check_batch_sizes(batch_sizes, "--batch-sizes")
    measured: list[Measurement] = [
        measure_layers(spec, None, b, runs=runs, warmup=warmup, whole=False, split=True, progress=progress) for b in sizes
    ]
    steps = optimizer_step_ms(spec.layers, runs=runs)
    return assemble(spec.name, measured, steps, threads, source)


def assemble(
    name: str,
    measured: Sequence[Measurement],
    steps: Sequence[dict[str, float]],
    threads: int | None,
    source: ProfileSource | None,
) -> ModelProfile:
    """The ModelProfile of measurements at increasing batch sizes (the last is the reference) and optimizer steps."""
    top = measured[-1]
    layers = []
    split = all(m.bwd_input_ms is not None and m.bwd_weight_ms is not None for m in measured)
    shared = any(size.shared_bytes for m in measured for size in m.layers)
    timed = all(m.split_ms is not None for m in measured)
    for i, size in enumerate(top.layers):
        curve = LayerCurve(
            fwd_ms=tuple(m.fwd_ms[i] for m in measured),
            bwd_ms=tuple(m.bwd_ms[i] for m in measured),
            activation_bytes=tuple(float(m.layers[i].activation_bytes) for m in measured),
            saved_bytes=tuple(float(m.layers[i].saved_bytes) for m in measured),
            bwd_input_ms=tuple(m.bwd_input_ms[i] for m in measured) if split else None,  # type: ignore[index]
            bwd_weight_ms=tuple(m.bwd_weight_ms[i] for m in measured) if split else None,  # type: ignore[index]
            shared_bytes=tuple(float(m.layers[i].shared_bytes) for m in measured) if shared else None,
        )
        layers.append(
            LayerProfile(
                name=size.name,
                fwd_ms=curve.fwd_ms[-1],
                bwd_ms=curve.bwd_ms[-1],
                activation_bytes=curve.activation_bytes[-1],
                param_bytes=float(size.param_bytes),
                saved_bytes=curve.saved_bytes[-1],
                flops=float(size.work.flops),
                bytes_moved=float(size.work.bytes_moved),
                bwd_input_ms=None if curve.bwd_input_ms is None else curve.bwd_input_ms[-1],
                bwd_weight_ms=None if curve.bwd_weight_ms is None else curve.bwd_weight_ms[-1],
                optimizer_ms=tuple(sorted(steps[i].items())),
                curve=curve,
                shared_bytes=0.0 if curve.shared_bytes is None else curve.shared_bytes[-1],
                tp=size.tp if not timed else timed_split(size.tp, [m.split_ms[i] for m in measured]),  # type: ignore[index]
            )
        )
    per_size = [m.cuts([float(layer.curve.activation_bytes[k]) for layer in layers]) for k, m in enumerate(measured)]  # type: ignore[union-attr]
    cut_curves = tuple(zip(*per_size, strict=True))
    return ModelProfile(
        name,
        top.batch_size,
        tuple(layers),
        reference_device=top.device,
        cut_bytes=tuple(c[-1] for c in cut_curves),
        measured=True,
        batch_sizes=tuple(m.batch_size for m in measured),
        cut_curves=cut_curves,
        threads=threads,
        source=source,
        layer_inputs=top.layer_inputs,
        shared_params=top.shared,
    )
