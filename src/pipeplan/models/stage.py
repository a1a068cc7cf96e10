"""One pipeline stage on one process: its layers, and forward / backward / split backward per microbatch.

The runtime runs its stages with this class and the profiler times layers
through it, so a profile measures exactly the code a training run executes.

Note:
    The zero-bubble split works at the granularity of parameter-holding
    modules. During F, the output of every module with its own parameters is
    kept (a "weight point"). I asks autograd for the gradients of the stage
    input and of every weight point's output only, so no weight gradient is
    computed and the graph is retained. W then asks, module by module, for
    the gradients of that module's own parameters from its output gradient;
    each call walks only that module's part of the graph. Parameters whose
    module output is not a single tensor, or that are shared between
    modules, fall back to one call from the stage output at W.

    A forward given an `RngKey` seeds torch's generator before each layer call
    from the key and the layer's index in the model (models.layer_rng), so
    dropout draws the same masks on any plan; without one (the profiler), the
    layers draw from the generator as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from pipeplan.models.layer_rng import LayerSeeding, RngKey

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class _Entry(torch.autograd.Function):
    """The identity from a stage's input leaf into its graph: the output shares the leaf's storage (no copy) but is
    not the leaf, nor a view of it, so the stage's first layer may change it in place (`ReLU(inplace=True)`), which
    autograd refuses on a leaf that requires a gradient; the gradient reaching it is the leaf's."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, leaf: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return leaf.detach()

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return grad


def grad_entry(inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(leaf, entry): a leaf requiring a gradient over `inputs`' storage, whose `.grad` is the input gradient, and
    what the layers run on (the leaf itself when it cannot take a gradient: an integer tensor). The one way a stage,
    and the profiler timing a layer as one, takes a tensor that needs its gradient (see _Entry)."""
    if not inputs.is_floating_point():
        return inputs, inputs
    leaf = inputs.detach().requires_grad_(True)
    return leaf, _Entry.apply(leaf)


@dataclass
class _Saved:
    """What a microbatch leaves on a stage between its forward and its (last) backward."""

    inputs: torch.Tensor | None
    output: torch.Tensor
    points: list[tuple[nn.Module, torch.Tensor]] = field(default_factory=list)
    point_grads: list[torch.Tensor | None] = field(default_factory=list)
    grad_output: torch.Tensor | None = None


class StageModule:
    """Layers of one stage with per-microbatch saved state; the last stage also computes the loss.

    The loss of a piece of n samples is `loss_fn(output, target) * n / global_batch`,
    so summing over microbatches and replicas gives the mean over the global batch.
    """

    def __init__(
        self,
        index: int,
        layers: Sequence[nn.Module],
        is_first: bool,
        is_last: bool,
        split_backward: bool,
        layer_ids: Sequence[int] | None = None,
    ) -> None:
        self.index = index
        self.module = nn.Sequential(*layers)
        self.layer_ids: tuple[int, ...] = tuple(layer_ids) if layer_ids is not None else tuple(range(len(layers)))
        """The model's index of each of `layers` (the layer's part of the RNG seed; default 0, 1, ...)."""
        self._seed: Callable[[int], None] = _unseeded
        self.is_first = is_first
        self.is_last = is_last
        self.params = [p for p in self.module.parameters() if p.requires_grad]
        self._saved: dict[int, _Saved] = {}
        self._capture: list[tuple[nn.Module, torch.Tensor]] | None = None
        self._point_modules: list[nn.Module] = []
        self._hooks: list[torch.utils.hooks.RemovableHandle] = []
        if split_backward:
            self._install_weight_points()

    def _install_weight_points(self) -> None:
        """Hook every module owning parameters not shared with another module."""
        owners: dict[int, int] = {}
        for m in self.module.modules():
            for p in m.parameters(recurse=False):
                owners[id(p)] = owners.get(id(p), 0) + 1
        for m in self.module.modules():
            own = [p for p in m.parameters(recurse=False) if p.requires_grad]
            if own and all(owners[id(p)] == 1 for p in own):
                self._hooks.append(m.register_forward_hook(self._hook))
                self._point_modules.append(m)

    def close(self) -> None:
        """Remove the weight-point hooks from the modules (the profiler's stages are temporary; a run's are not)."""
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        self._point_modules.clear()

    def _hook(self, module: nn.Module, args: object, output: object) -> None:
        if self._capture is not None and isinstance(output, torch.Tensor) and output.requires_grad:
            self._capture.append((module, output))

    @property
    def inflight(self) -> int:
        """Microbatches whose forward ran and whose last backward has not."""
        return len(self._saved)

    def forward(
        self,
        microbatch: int,
        inputs: torch.Tensor,
        target: torch.Tensor | None,
        loss_fn: LossFn | None,
        loss_scale: float,
        key: RngKey | None = None,
    ) -> torch.Tensor:
        """Run the layers on `inputs`; on the last stage return the scaled loss, else the output activation.

        With `key`, each layer call draws from torch's generator seeded by the key and the layer's index (module
        docstring); the generator's state is restored afterwards.
        """
        entry = inputs
        if not self.is_first and inputs.is_floating_point():
            inputs, entry = grad_entry(inputs)
        self._capture = [] if self._point_modules else None
        try:
            if key is None:
                output = self.run(entry)
            else:
                with LayerSeeding(key, inputs.device) as seeding:
                    self._seed = seeding.seed
                    output = self.run(entry)
        finally:
            points, self._capture = self._capture or [], None
            self._seed = _unseeded
        if self.is_last:
            assert loss_fn is not None and target is not None
            output = loss_fn(output, target) * loss_scale
        self._saved[microbatch] = _Saved(inputs if inputs.requires_grad else None, output, points)
        return output

    def run(self, inputs: torch.Tensor) -> torch.Tensor:
        """The stage's layers on `inputs` (a chain: composed in order); the output the next stage receives."""
        for layer_id, layer in zip(self.layer_ids, self.module, strict=True):
            self._seed(layer_id)
            inputs = layer(inputs)
        return inputs

    def output_of(self, microbatch: int) -> torch.Tensor:
        """What the forward of `microbatch` returned (on the last stage: its scaled loss), until its last backward."""
        return self._saved[microbatch].output

    def backward(self, microbatch: int, grad_output: torch.Tensor | None) -> torch.Tensor | None:
        """Full backward (op B): accumulate weight gradients, return the input gradient (None on the first stage)."""
        saved = self._saved.pop(microbatch)
        if saved.output.requires_grad:  # not when nothing before the cut has weights (a graph's input alone)
            torch.autograd.backward(saved.output, grad_output)
        return None if saved.inputs is None else saved.inputs.grad

    def backward_input(self, microbatch: int, grad_output: torch.Tensor | None) -> torch.Tensor | None:
        """Input-gradient half (op I): return the input gradient and keep what W needs; no weight gradient is formed."""
        saved = self._saved[microbatch]
        wanted = ([saved.inputs] if saved.inputs is not None else []) + [out for _, out in saved.points]
        saved.grad_output = grad_output
        if not wanted:
            return None
        grads = torch.autograd.grad(saved.output, wanted, grad_output, retain_graph=True, allow_unused=True)
        offset = 1 if saved.inputs is not None else 0
        saved.point_grads = list(grads[offset:])
        return grads[0] if saved.inputs is not None else None

    def backward_weight(self, microbatch: int) -> None:
        """Weight-gradient half (op W): accumulate the gradients of every parameter, then free the microbatch."""
        saved = self._saved.pop(microbatch)
        covered: set[int] = set()
        for (module, out), grad in zip(saved.points, saved.point_grads, strict=False):
            own = [p for p in module.parameters(recurse=False) if p.requires_grad]
            covered.update(id(p) for p in own)
            if grad is None:
                continue
            _accumulate(own, torch.autograd.grad(out, own, grad, retain_graph=True, allow_unused=True))
        rest = [p for p in self.params if id(p) not in covered]
        if rest:
            _accumulate(rest, torch.autograd.grad(saved.output, rest, saved.grad_output, retain_graph=True, allow_unused=True))

    def clear(self) -> None:
        """Drop every saved microbatch (after a failed or aborted iteration)."""
        self._saved.clear()


def _unseeded(layer: int) -> None:
    """A forward without an RngKey: the layers draw from torch's generator as it stands."""


def _accumulate(params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor | None]) -> None:
    """Add grads into params' .grad as autograd's own accumulation would."""
    for p, g in zip(params, grads, strict=True):
        if g is None:
            continue
        if p.grad is None:
            p.grad = g.detach().clone()
        else:
            p.grad.add_(g)
