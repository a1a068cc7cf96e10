"""Per-layer measurement of a chain of torch modules: times, sizes, saved-for-backward bytes, FLOPs.

Method:
  1. One no-grad pass through the chain records each layer's input (a pipeline
     stage sees exactly these tensors at its boundary).
  2. One counting pass per layer under saved-tensor hooks and the FLOP
     counter gives output bytes, saved bytes, forward and backward FLOPs.
  3. `warmup + runs` timing rounds. Each layer runs as a one-layer stage of
     the runtime (models.stage.StageModule: the code a training run
     executes), and a round runs them as a pipeline stage does, in chain
     order: every forward, layer 0 first, then every backward, the last layer
     first, each on the gradient the layer after it produced (the last layer
     gets a fixed random gradient of its output's shape; a model spec with a
     loss computes it on the last layer's stage, as the last stage of a run
     does, so its time is the last layer's). Timing layers in
     sequence, not each on its own, lets them compete for the caches as they
     do in training. With `split`, a second pass in the same round times the
     zero-bubble halves: every forward again, then every I (input gradient),
     then every W (weight gradient). The whole chain is then timed as one
     model in the same round, so a burst of machine noise hits all alike.
     Times are the medians over the `runs` rounds after warm-up.

A branching model (a ModelSpec with layer_inputs) is measured the same way with its graph: each layer's inputs are
its input layers' outputs, its round runs the layers in graph order (profiler.graph_timing), and each cut's bytes
are its live set's (core.profile.live_cuts); it has no I/W split.

Parameter gradients accumulate across rounds in both the per-layer and the
whole-chain runs, as they do across microbatches in training.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn

from pipeplan.core.checks import check_nonneg_int, check_positive_int
from pipeplan.core.errors import ProfileError
from pipeplan.core.layer_profile import TensorSplit
from pipeplan.core.profile import LayerProfile, ModelProfile, SharedGroup, live_cuts
from pipeplan.models.parameter_sharing import shared_parameters
from pipeplan.models.specs import ModelSpec, layers_of
from pipeplan.models.stage import grad_entry
from pipeplan.profiler.attention import FusedAttentionMode
from pipeplan.profiler.flops import KernelCounter, LayerWork, bytes_moved, flop_counter
from pipeplan.profiler.graph_timing import GraphTimer, graph_inputs
from pipeplan.profiler.norms import single_value_norms
from pipeplan.profiler.saved import SavedTensorMeter, param_bytes, tensor_bytes
from pipeplan.profiler.split_timing import LayerTimes, time_splits, timed_split
from pipeplan.profiler.tensor_splits import layer_splits
from pipeplan.profiler.timing import ChainTimer, Loss, median, run_chain, time_step

SampleInput = torch.Tensor | Callable[[int], torch.Tensor]


@dataclass(frozen=True, slots=True)
class LayerSizes:
    """What one layer holds and does for one batch, independent of timing.

    `shared_bytes`: the part of `saved_bytes` that is the layer's input, saved by the layer before as its output
    too (core.profile.LayerProfile). `tp`: how the runtime splits it over a tensor-parallel group
    (profiler.tensor_splits), None: it does not."""

    name: str
    activation_bytes: int
    param_bytes: int
    saved_bytes: int
    work: LayerWork
    shared_bytes: int = 0
    tp: TensorSplit | None = None


@dataclass(frozen=True, slots=True)
class Measurement:
    """Everything measured about a chain at one batch size: per-layer sizes and median times (I and W when split),
    the whole chain's median times, the parameters several layers hold (`shared`), and each marked block's times
    split over a tensor-parallel group (`split_ms`, profiler.split_timing; None: not timed)."""

    device: str
    batch_size: int
    layers: tuple[LayerSizes, ...]
    fwd_ms: tuple[float, ...]
    bwd_ms: tuple[float, ...]
    whole_fwd_ms: float
    whole_bwd_ms: float
    bwd_input_ms: tuple[float, ...] | None = None
    bwd_weight_ms: tuple[float, ...] | None = None
    layer_inputs: tuple[tuple[int, ...], ...] | None = None
    shared: tuple[SharedGroup, ...] = ()
    split_ms: tuple[LayerTimes, ...] | None = None

    def cuts(self, values: Sequence[float]) -> tuple[float, ...]:
        """Each cut's bytes from per-layer output bytes: a chain's cut i is layer i's output, a graph's the live set
        after layer i (core.dag's rule: every earlier output a later layer reads)."""
        if self.layer_inputs is None:
            return tuple(float(v) for v in values[:-1])
        return live_cuts([float(v) for v in values], self.layer_inputs)

    def to_profile(self, name: str) -> ModelProfile:
        """The measured ModelProfile at this one batch size (a graph's with its layer inputs and live-set cuts)."""
        split = self.bwd_input_ms is not None and self.bwd_weight_ms is not None
        layers = tuple(
            LayerProfile(
                name=s.name,
                fwd_ms=self.fwd_ms[i],
                bwd_ms=self.bwd_ms[i],
                activation_bytes=s.activation_bytes,
                param_bytes=s.param_bytes,
                saved_bytes=s.saved_bytes,
                flops=s.work.flops,
                bytes_moved=s.work.bytes_moved,
                bwd_input_ms=self.bwd_input_ms[i] if split else None,  # type: ignore[index]
                bwd_weight_ms=self.bwd_weight_ms[i] if split else None,  # type: ignore[index]
                shared_bytes=s.shared_bytes,
                tp=s.tp if self.split_ms is None else timed_split(s.tp, [self.split_ms[i]]),
            )
            for i, s in enumerate(self.layers)
        )
        cuts = self.cuts([s.activation_bytes for s in self.layers])
        return ModelProfile(
            name,
            self.batch_size,
            layers,
            reference_device=self.device,
            cut_bytes=cuts,
            measured=True,
            layer_inputs=self.layer_inputs,
            shared_params=self.shared,
        )


def profile_module(
    model: nn.Module | Sequence[nn.Module] | ModelSpec,
    sample_input: SampleInput | None,
    batch_size: int,
    *,
    runs: int = 10,
    warmup: int = 3,
    name: str | None = None,
    progress: bool = False,
) -> ModelProfile:
    """Measure a model layer by layer and return its ModelProfile (reference_device = where it ran, measured=True).

    Args:
        model: an nn.Sequential, a module with blocks (see `specs.layers_of`),
            a sequence of modules composed in order, or a ModelSpec.
        sample_input: a batch of batch_size samples, or a function of the
            batch size making one; None takes the ModelSpec's.
        batch_size: samples per batch (the profile's batch size).
        runs: timed rounds whose median is kept; warmup: rounds discarded first.
        name: the profile's name (default: the spec's name, else "model").
        progress: show a progress bar on stderr.

    Raises:
        ProfileError: bad arguments, or a layer that does not return one tensor.
    """
    measurement = measure_layers(model, sample_input, batch_size, runs=runs, warmup=warmup, progress=progress)
    default = model.name if isinstance(model, ModelSpec) else "model"
    return measurement.to_profile(name or default)


def measure_layers(
    model: nn.Module | Sequence[nn.Module] | ModelSpec,
    sample_input: SampleInput | None,
    batch_size: int,
    *,
    runs: int = 10,
    warmup: int = 3,
    whole: bool = True,
    split: bool = False,
    progress: bool = False,
) -> Measurement:
    """Measure every layer (sizes, FLOPs, median forward/backward ms, I/W with split) and, if whole, the chain as one model.

    runs = 0 skips timing (all times 0): sizes and FLOPs only, as a projection needs. A model built on the
    meta device (`with torch.device("meta"): ...`) is counted without allocating or computing anything, with
    attention modelled as a GPU's fused kernel (see `attention`); it needs runs = 0.
    """
    check_positive_int(ProfileError, "batch_size", batch_size)
    check_nonneg_int(ProfileError, "runs", runs)
    check_nonneg_int(ProfileError, "warmup", warmup)
    names, layers, x0 = _chain(model, sample_input, batch_size)
    device = x0.device
    if device.type == "meta" and runs:
        raise ProfileError(f"runs must be 0 for a model on the meta device (nothing runs there to time), got {runs}")
    sync = torch.cuda.synchronize if device.type == "cuda" else _no_sync
    rounds = warmup + runs if runs else 0
    graph = model.layer_inputs if isinstance(model, ModelSpec) else None
    split = split and graph is None  # a graph's layers are timed without the zero-bubble split (profiler.graph_timing)
    with _progress_bar(progress, len(layers) + rounds) as advance, single_value_norms(layers):
        inputs: Sequence[torch.Tensor | tuple[torch.Tensor, ...]]
        inputs = _layer_inputs(layers, x0) if graph is None else graph_inputs(layers, graph, names, x0)
        sizes, grads = [], []
        loss = _loss_of(model, batch_size, x0.device)
        last = len(layers) - 1
        output_saved = 0
        for i, (layer_name, layer, x) in enumerate(zip(names, layers, inputs, strict=True)):
            size, grad, (input_saved, out_saved) = _count_layer(
                layer_name, layer, x, needs_grad=i > 0, loss=loss if i == last else None
            )
            # shared bytes are a chain's (the layer before saves this one's input too); a graph's are left at 0
            sizes.append(replace(size, shared_bytes=min(input_saved, output_saved)) if i > 0 and graph is None else size)
            output_saved = out_saved
            grads.append(grad)
            advance(f"counting {layer_name}")
        sizes = [replace(size, tp=tp) for size, tp in zip(sizes, layer_splits(layers, names, inputs), strict=True)]
        timer: ChainTimer | GraphTimer
        if graph is None:
            timer = ChainTimer(layers, inputs[0], grads[-1], sync, split, loss)  # type: ignore[arg-type]
        else:
            timer = GraphTimer(layers, graph, inputs, grads[-1], sync, loss)  # type: ignore[arg-type]
        whole_f: list[float] = []
        whole_b: list[float] = []
        try:
            for r in range(rounds):
                timer.round(keep=r >= warmup)
                if whole:
                    x_in = x0.clone()  # a first layer may change its input in place: every round gets the same one
                    f_ms, b_ms = time_step(
                        lambda x_in=x_in: run_chain(layers, x_in, loss, graph), x_in, None if loss else grads[-1], sync
                    )
                    if r >= warmup:
                        whole_f.append(f_ms)
                        whole_b.append(b_ms)
                advance(f"timing round {r + 1}/{rounds}")
        finally:
            timer.close()
        split_ms = None
        if graph is None and rounds:
            dense = ([median(x) for x in timer.samples["F"]], [median(x) for x in timer.samples["B"]])
            split_ms = time_splits(layers, [s.tp for s in sizes], inputs[0], grads[-1], sync, loss, warmup, runs, dense)  # type: ignore[arg-type]
    medians = {key: tuple(median(s) for s in samples) for key, samples in timer.samples.items()}
    return Measurement(
        device=_device_name(device),
        batch_size=batch_size,
        layers=tuple(sizes),
        fwd_ms=medians["F"],
        bwd_ms=medians["B"],
        whole_fwd_ms=median(whole_f),
        whole_bwd_ms=median(whole_b),
        bwd_input_ms=medians["I"] if split else None,
        bwd_weight_ms=medians["W"] if split else None,
        layer_inputs=graph,
        shared=shared_groups(layers, names),
        split_ms=split_ms,
    )


def shared_groups(layers: Sequence[nn.Module], names: Sequence[str]) -> tuple[SharedGroup, ...]:
    """The profile's groups of the parameters several layers hold (models.parameter_sharing finds them: tied weights)."""
    return tuple(SharedGroup(p.name, p.layers, float(p.nbytes)) for p in shared_parameters(layers, names))


def _chain(
    model: nn.Module | Sequence[nn.Module] | ModelSpec, sample_input: SampleInput | None, batch_size: int
) -> tuple[list[str], list[nn.Module], torch.Tensor]:
    """Names, layers and the first input (on the layers' device) of whatever model form was given."""
    if isinstance(model, ModelSpec):
        names, layers = list(model.layer_names), list(model.layers)
        sample_input = model.sample_input if sample_input is None else sample_input
    elif isinstance(model, nn.Module):
        pairs = layers_of(model)
        names, layers = [n for n, _ in pairs], [m for _, m in pairs]
    else:
        layers = list(model)
        if not layers or not all(isinstance(m, nn.Module) for m in layers):
            raise ProfileError("model must be an nn.Module, a ModelSpec, or a non-empty sequence of nn.Module")
        names = [f"{i}-{type(m).__name__.lower()}" for i, m in enumerate(layers)]
    if sample_input is None:
        raise ProfileError("sample_input is required unless model is a ModelSpec")
    x0 = sample_input(batch_size) if callable(sample_input) else sample_input
    if not isinstance(x0, torch.Tensor):
        raise ProfileError(f"sample_input must be a tensor (or make one), got {type(x0).__name__}")
    if x0.dim() == 0 or x0.shape[0] != batch_size:
        raise ProfileError(f"sample_input's first dimension must be the batch size {batch_size}, got shape {tuple(x0.shape)}")
    params = [p for layer in layers for p in layer.parameters()]
    device = params[0].device if params else x0.device
    return names, layers, x0.to(device).detach()


def _layer_inputs(layers: Sequence[nn.Module], x0: torch.Tensor) -> list[torch.Tensor]:
    """Each layer's input from one no-grad pass; inputs after layer 0 are leaves that require a gradient."""
    inputs = [x0]
    with torch.no_grad():
        x = x0
        for i, layer in enumerate(layers[:-1]):
            x = layer(x.clone())  # a copy: a layer that changes its input in place leaves the one kept here as it was
            if not isinstance(x, torch.Tensor):
                raise ProfileError(
                    f"layer {i} ({type(layer).__name__}) returned {type(x).__name__}; each layer must return one tensor"
                )
            inputs.append(x)
    return [x if i == 0 else x.detach().requires_grad_(x.is_floating_point()) for i, x in enumerate(inputs)]


def _loss_of(model: nn.Module | Sequence[nn.Module] | ModelSpec, batch_size: int, device: torch.device) -> Loss | None:
    """The spec's loss and a batch of its sample targets (None without them), as the last stage computes it."""
    if not isinstance(model, ModelSpec) or model.loss_fn is None or model.sample_target is None:
        return None
    loss_fn, target = model.loss_fn, model.sample_target(batch_size).to(device)
    return (lambda out, t: loss_fn(out, t.to(out.dtype) if t.is_floating_point() else t)), target


def _count_layer(
    name: str, layer: nn.Module, x: torch.Tensor | tuple[torch.Tensor, ...], needs_grad: bool, loss: Loss | None = None
) -> tuple[LayerSizes, torch.Tensor, tuple[int, int]]:
    """One forward and backward of layer under the saved-tensor meter and FLOP counter.

    With `loss` (the last layer), its saved bytes also count what the loss keeps for backward (cross-entropy's
    log-probabilities, a squared error's difference): the last stage holds them until its backward, as it holds
    the layer's own (its time is in the timing rounds; its FLOPs are not counted). Returns the layer's sizes and work, a fixed
    random gradient of its output's shape for the timing rounds, and the bytes of its input's and of its output's
    storage among those it saves (0 when not saved). A layer of a graph takes a tuple `x` of its inputs' outputs.
    """
    # fresh leaves over copies (the kept inputs stay as they are), each entered as a stage enters its input
    # (models.stage.grad_entry): a layer may change its input in place, as it may in a run
    entered = [grad_entry(one.detach().clone()) if one.requires_grad else _same(one.clone()) for one in _tuple(x)]
    xs, args = tuple(leaf for leaf, _ in entered), tuple(arg for _, arg in entered)
    fused = FusedAttentionMode() if xs[0].device.type == "meta" else contextlib.nullcontext()
    fwd_kernels, bwd_kernels = KernelCounter(), KernelCounter()
    meter = SavedTensorMeter(exclude=layer.parameters())
    with torch.enable_grad(), fused, flop_counter() as fwd_counter, meter, fwd_kernels:
        out = layer(*args)
    if not isinstance(out, torch.Tensor) or not out.is_floating_point():
        raise ProfileError(f"layer {name!r} must return one floating-point tensor, got {type(out).__name__}")
    ends = (meter.bytes_of(xs[0]), meter.bytes_of(out))  # the storages a neighbouring layer may save too
    loss_value = None
    if loss is not None and out.requires_grad:
        with torch.enable_grad(), meter:
            loss_value = loss[0](out, loss[1])  # kept until the meter is read: its storages must not be reused meanwhile
    grad = torch.randn(out.shape, dtype=out.dtype, device=out.device)
    bwd_flops = 0
    if out.requires_grad:
        with flop_counter() as bwd_counter, bwd_kernels:
            torch.autograd.backward(out, grad)
        bwd_flops = bwd_counter.get_total_flops()
        for one in xs:
            one.grad = None
    p_bytes, in_bytes, out_bytes = param_bytes(layer), tensor_bytes(xs), tensor_bytes(out)
    saved = meter.saved_bytes
    del loss_value
    input_grad = needs_grad and any(one.requires_grad for one in xs)
    fwd_moved, bwd_moved = bytes_moved(p_bytes, in_bytes, out_bytes, saved, input_needs_grad=input_grad)
    work = LayerWork(
        name, int(fwd_counter.get_total_flops()), int(bwd_flops), fwd_moved, bwd_moved, fwd_kernels.count, bwd_kernels.count
    )
    return LayerSizes(name, out_bytes, p_bytes, saved, work), grad, ends


def _tuple(x: torch.Tensor | tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return x if isinstance(x, tuple) else (x,)


def _same(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x, x


def _no_sync() -> None:
    """CPU work is synchronous: nothing to wait for."""


def _device_name(device: torch.device) -> str:
    """'cpu', or the CUDA device's product name."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type


@contextlib.contextmanager
def _progress_bar(enabled: bool, total: int) -> Iterator[Callable[[str], None]]:
    """Yield advance(description): a rich progress bar on stderr when enabled and stderr is a terminal, else a no-op."""
    if not enabled:
        yield lambda _description: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    if not console.is_terminal:  # a log file gets no bar (rich would leave a blank line per refresh)
        yield lambda _description: None
        return
    columns = (TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("profiling", total=total)

        def advance(description: str) -> None:
            bar.update(task, advance=1, description=description)

        yield advance
