"""The profiler's pass and timing rounds for a branching model (a ModelSpec with layer_inputs, models.traced.graph).

As for a chain (profiler/measure.py, step 3), every layer is timed in order:
every forward in the graph's order, then every backward in reverse, each on
the gradient its readers produced (summed over them: what autograd gives the
layer's output when they run on one process). A layer's inputs are leaves,
one per reader, that require a gradient when their layer's output does.
There is no zero-bubble split here: a graph's profile has no I and W times.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch
from torch import nn

from pipeplan.core.errors import ProfileError
from pipeplan.core.units import s_to_ms
from pipeplan.models.stage import grad_entry
from pipeplan.models.traced.graph import consumers, run_layers
from pipeplan.profiler.timing import Loss


def graph_inputs(
    layers: Sequence[nn.Module], inputs: Sequence[Sequence[int]], names: Sequence[str], x0: torch.Tensor
) -> list[tuple[torch.Tensor, ...]]:
    """Each layer's arguments from one no-grad pass: the model's input for a layer without inputs, else its inputs'
    outputs as fresh leaves, each requiring a gradient when its layer's output would (it has parameters on its path).

    Raises:
        ProfileError: a layer that does not return one tensor.
    """
    with torch.no_grad():
        outs = run_layers(layers, inputs, x0)
    needs: list[bool] = []
    for i, (layer, out) in enumerate(zip(layers, outs, strict=True)):
        if not isinstance(out, torch.Tensor):
            raise ProfileError(f"layer {names[i]!r} returned {type(out).__name__}; each layer must return one tensor")
        own = any(p.requires_grad for p in layer.parameters())
        needs.append(out.is_floating_point() and (own or any(needs[s] for s in inputs[i])))
    return [
        tuple(outs[s].detach().requires_grad_(needs[s]) for s in inputs[i]) if inputs[i] else (x0,) for i in range(len(layers))
    ]


class GraphTimer:
    """Times every layer of a graph in its order (module docstring); `samples` as ChainTimer's (F and B only)."""

    def __init__(
        self,
        layers: Sequence[nn.Module],
        inputs: Sequence[Sequence[int]],
        args: Sequence[tuple[torch.Tensor, ...]],
        last_grad: torch.Tensor,
        sync: Callable[[], None],
        loss: Loss | None = None,
    ) -> None:
        self.layers, self.inputs, self.args, self.sync, self.loss = layers, inputs, args, sync, loss
        self.last_grad = None if loss is not None else last_grad
        self.readers = consumers(inputs)
        self.samples: dict[str, list[list[float]]] = {op: [[] for _ in layers] for op in "FBIW"}

    def close(self) -> None:
        """Nothing to remove (no hooks): as ChainTimer's."""

    def round(self, keep: bool) -> None:
        """One timing round: every forward in order, then every backward in reverse order."""
        last = len(self.layers) - 1
        leaves: list[tuple[torch.Tensor, ...]] = []
        outs: list[torch.Tensor] = []
        for i, layer in enumerate(self.layers):
            # fresh leaves over copies, entered as a stage enters its input (models.stage.grad_entry): a layer may
            # change its input in place, and the kept inputs stay as they are for the next round
            entered = [grad_entry(a.detach().clone()) if a.requires_grad else _same(a.clone()) for a in self.args[i]]
            args, entries = tuple(leaf for leaf, _ in entered), tuple(arg for _, arg in entered)
            self.sync()
            t0 = time.perf_counter()
            out = layer(*entries)
            if i == last and self.loss is not None:
                out = self.loss[0](out, self.loss[1])
            self.sync()
            if keep:
                self.samples["F"][i].append(s_to_ms(time.perf_counter() - t0))
            leaves.append(args)
            outs.append(out)
        for i in range(last, -1, -1):
            grad = self.last_grad if i == last else self._grad_of(i, leaves)
            if not outs[i].requires_grad or (i != last and grad is None):
                if keep:
                    self.samples["B"][i].append(0.0)
                continue
            self.sync()
            t0 = time.perf_counter()
            torch.autograd.backward(outs[i], grad)
            self.sync()
            if keep:
                self.samples["B"][i].append(s_to_ms(time.perf_counter() - t0))

    def _grad_of(self, layer: int, leaves: list[tuple[torch.Tensor, ...]]) -> torch.Tensor | None:
        """The gradient of `layer`'s output: the sum of the gradients its readers left on their leaves of it."""
        grads = []
        for reader in self.readers[layer]:
            leaf = leaves[reader][self.inputs[reader].index(layer)]
            if leaf.grad is not None:
                grads.append(leaf.grad)
        return None if not grads else grads[0] if len(grads) == 1 else torch.stack(grads).sum(0)


def _same(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x, x
