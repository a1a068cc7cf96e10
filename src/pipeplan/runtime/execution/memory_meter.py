"""What a training step really holds in memory: weights, gradients, optimizer state, and the peak of saved activations.

How it is measured (the quantity the cost model predicts, on any device):
- static bytes: every parameter, its gradient and every tensor of the
  optimizer's state, counted by storage after the step (each storage once);
- activation bytes: during one step, every tensor autograd saves for a
  backward is recorded by storage (saved-tensor hooks) with a weak
  reference; after each action the storages still alive are summed, and the
  largest sum is the peak. A storage saved by two layers (one layer's output
  that the next layer keeps as its input) counts once, as in memory.
The sum is the rank's peak. Temporaries that live inside one operator and
the communication buffers of messages in flight are not counted (the cost
model leaves them out too); on a CUDA device `torch.cuda.max_memory_allocated`
reports everything the allocator handed out, for comparison.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from pipeplan.profiler.saved import SavedTensorHooks
from pipeplan.runtime.execution.replicas import local_tensor


class SavedMemoryMeter(SavedTensorHooks):
    """Records the storages autograd saves while it is active (but those of `exclude`, the weights), by weak
    reference; `sample()` after each action updates the peak."""

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        super().__init__(exclude)
        self._storages: dict[int, tuple[StorageWeakRef, int]] = {}
        self.peak_bytes = 0

    def _record(self, key: int, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        self._storages.setdefault(key, (StorageWeakRef(storage), storage.nbytes()))

    def sample(self) -> int:
        """Bytes of the recorded storages still alive now; dead ones are forgotten. Updates `peak_bytes`."""
        alive = 0
        for key, (ref, nbytes) in list(self._storages.items()):
            if ref.expired():
                del self._storages[key]
            else:
                alive += nbytes
        self.peak_bytes = max(self.peak_bytes, alive)
        return alive


def static_bytes(params: Iterable[torch.Tensor], optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the parameters, their gradients and the optimizer's state tensors, each storage once (a DTensor's:
    its local shard's)."""
    seen: dict[int, int] = {}

    def add(tensor: object) -> None:
        if isinstance(tensor, torch.Tensor) and tensor.numel():
            storage = local_tensor(tensor).untyped_storage()  # a tensor-parallel weight: this process's shard
            seen.setdefault(StorageWeakRef(storage).cdata, storage.nbytes())

    for p in params:
        add(p)
        add(p.grad)
    for state in optimizer.state.values():
        for value in state.values():
            add(value)
    return sum(seen.values())
