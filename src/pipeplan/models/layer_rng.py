"""Randomness that does not depend on the plan: each layer call of a training forward draws from torch's generator
seeded by (the run's seed, the step, the first sample of the microbatch in the step's global batch, the layer).

So the same layer on the same samples draws the same dropout mask (or any other random numbers) wherever the plan
puts it: on any stage, rank, schedule, pipeline replica or order of actions. The generator's state from before
the forward is restored after it, so the caller's random numbers go on as if the forward had drawn none.

The seed of one layer call, reproducible in a plain loop (docs/architecture.md, "Randomness"):

    seed = int.from_bytes(sha256(f"{run_seed}:{step}:{first_sample}:{layer}".encode()).digest()[:8], "big") >> 1

set with `torch.manual_seed(seed)` (here: the CPU generator's `manual_seed`, and on a GPU that device's, which
is what `torch.manual_seed` does for them, without its cost of ~0.1 ms) just before the layer is called.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from types import TracebackType

import torch


def layer_seed(run_seed: int, step: int, first_sample: int, layer: int) -> int:
    """The seed torch's generator holds when `layer` (its index in the model) starts its forward on the microbatch
    whose first sample is `first_sample` of step `step`'s global batch: 63 bits of a SHA-256 of the four numbers."""
    digest = hashlib.sha256(f"{run_seed}:{step}:{first_sample}:{layer}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


@dataclass(frozen=True, slots=True)
class RngKey:
    """Which forward a stage runs, in plan-free terms: the run's seed, the step and the microbatch's first sample
    (its row in the step's global batch)."""

    run_seed: int
    step: int
    first_sample: int


class LayerSeeding:
    """For one forward of a stage: `seed(layer)` before each layer call; the generators' states restored at exit.

    Seeds torch's CPU generator and, when `device` is a GPU, that device's generator (dropout on a GPU draws from it).
    """

    def __init__(self, key: RngKey, device: torch.device) -> None:
        self.key = key
        self.generators: list[torch.Generator] = [torch.default_generator]
        if device.type == "cuda":
            torch.cuda.init()
            index = device.index if device.index is not None else torch.cuda.current_device()
            self.generators.append(torch.cuda.default_generators[index])
        self._saved: list[torch.Tensor] = []

    def __enter__(self) -> LayerSeeding:
        self._saved = [g.get_state() for g in self.generators]
        return self

    def seed(self, layer: int) -> None:
        """Seed the generators for `layer`'s call (module docstring's formula)."""
        value = layer_seed(self.key.run_seed, self.key.step, self.key.first_sample, layer)
        for g in self.generators:
            g.manual_seed(value)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        for g, state in zip(self.generators, self._saved, strict=True):
            g.set_state(state)
        self._saved = []
