"""Bytes a layer keeps for backward, measured with autograd's saved-tensor hooks.

Note:
    What stays in memory between a layer's forward and its backward is the
    set of *storages* autograd holds on to. A tensor saved twice (or two views
    of one buffer, such as q, k and v split from one projection) is one
    storage and is counted once, at the storage's full size. Storages of the
    layer's parameters (and views of them, e.g. a transposed weight) are
    excluded: they stay in memory anyway and are accounted as param_bytes.
    The layer's input counts when the layer saves it (a Linear does): in a
    pipeline it is the previous stage's output that this stage keeps alive.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Self

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef


def storage_key(tensor: torch.Tensor) -> int:
    """An identity for the storage behind tensor (equal for views of one buffer)."""
    return StorageWeakRef(tensor.untyped_storage()).cdata


def tensor_bytes(value: object) -> int:
    """Bytes of the tensors in value (a tensor, or a tuple/list of them; other items count 0)."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(tensor_bytes(v) for v in value)
    return 0


def param_bytes(layer: nn.Module) -> int:
    """Bytes of layer's parameters, each shared parameter counted once."""
    return sum(p.numel() * p.element_size() for p in layer.parameters())


class SavedTensorHooks:
    """Saved-tensor hooks that hand every storage autograd saves (but those of `exclude`) to `_record`, as a context
    manager that may be entered again (what it records adds up). The profiler's meter (SavedTensorMeter) and the
    runtime's (runtime.execution.memory_meter) differ only in what they record."""

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        self._exclude = {storage_key(t) for t in exclude}
        self._hooks: list[torch.autograd.graph.saved_tensors_hooks] = []

    def _record(self, key: int, tensor: torch.Tensor) -> None:
        raise NotImplementedError

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        key = storage_key(tensor)
        if key not in self._exclude:  # weights (and views of them) are static bytes, not activations
            self._record(key, tensor)
        # a detached alias, not the tensor: an op that saves its own output would otherwise hold its own node
        # (output -> grad_fn -> saved output), a cycle autograd frees only when the backward frees its buffers,
        # never after a retain_graph=True backward (the zero-bubble I): a meter must not keep what it measures
        return tensor.detach()

    @staticmethod
    def _unpack(tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def __enter__(self) -> Self:
        hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        hooks.__enter__()
        self._hooks.append(hooks)
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.pop().__exit__(*exc)


class SavedTensorMeter(SavedTensorHooks):
    """Context manager recording the distinct non-parameter storages autograd saves inside it.

    Usage: `with SavedTensorMeter(exclude=layer.parameters()) as meter: out = layer(x)`;
    then `meter.saved_bytes`. Keep `out` alive until reading the meter: the
    hooks only see what is packed while the graph is built.
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        super().__init__(exclude)
        self._sizes: dict[int, int] = {}

    def _record(self, key: int, tensor: torch.Tensor) -> None:
        self._sizes[key] = tensor.untyped_storage().nbytes()

    @property
    def saved_bytes(self) -> int:
        """Sum of the sizes of the distinct storages saved so far."""
        return sum(self._sizes.values())

    def bytes_of(self, tensor: torch.Tensor) -> int:
        """The size of tensor's storage if it was saved, else 0."""
        return self._sizes.get(storage_key(tensor), 0)
