"""A module that is no chain of blocks, as graph layers: traced with torch.fx, else captured with torch.export.

torch.fx gives one layer per computing node (models.traced.graph) and needs no
sample input; it cannot trace data-dependent Python (Hugging Face models
among them, which go straight to the export). torch.export runs the model on
a sample batch and gives one layer per module of its hierarchy
(models.traced.capture). An exported graph fixes the dtypes it casts to, so a
captured model is captured again when it is converted to another dtype
(ModelSpec.recapture).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from pipeplan.core.errors import ProfileError
from pipeplan.models.model_spec import SampleFn

CaptureResult = tuple[
    tuple[nn.Module, ...],
    tuple[str, ...],
    tuple[tuple[int, ...], ...],
    Callable[[torch.dtype], tuple[nn.Module, ...]] | None,
]
EXPORT_BATCH = 2
"""The sample batch the export runs on (its batch dimension is dynamic; 1 would be specialised)."""


def capture(module: nn.Module, name: str, sample_input: SampleFn | None, not_chain: str) -> CaptureResult:
    """The layers, names and inputs of `module` as a graph, and how to capture it again in another dtype (None
    for an fx graph, whose layers convert as they are).

    Args:
        module: the user's module, not a chain of blocks.
        name: the model's name, for errors.
        sample_input: makes a batch of the model's input (needed by the export), or None.
        not_chain: why it is no chain of blocks, for the error when nothing captures it.

    Raises:
        ProfileError: neither fx nor the export can capture it; one line naming each reason and the way out.
    """
    from pipeplan.models.traced.capture import export_layers
    from pipeplan.models.traced.graph import trace_layers
    from pipeplan.models.zoo.stock import call_model, is_transformers_model

    if is_transformers_model(module):
        fx_reason = "torch.fx cannot trace transformers models"
    else:
        try:
            return (*trace_layers(module, name), None)
        except ProfileError as not_graph:
            fx_reason = str(not_graph)
    if sample_input is None:
        raise ProfileError(
            f"{not_chain}; nor does it trace as a graph: {fx_reason}; to capture it with torch.export give the module "
            "a sample_input(batch_size) method or put a sample_input(batch_size) function beside the factory"
        )
    sample = _sample(sample_input, module)
    try:
        layers, names, inputs = export_layers(module, name, sample, call_model)
    except ProfileError as not_exported:
        raise ProfileError(f"{not_chain}; nor does it trace as a graph: {fx_reason}; {not_exported}") from None

    def recapture(dtype: torch.dtype) -> tuple[nn.Module, ...]:
        module.to(dtype)
        again, _, _ = export_layers(module, name, _sample(sample_input, module), call_model)
        return again

    return layers, names, inputs, recapture


def _sample(sample_input: SampleFn, module: nn.Module) -> torch.Tensor:
    """A batch of EXPORT_BATCH inputs, floating ones in the dtype of the module's parameters."""
    x = sample_input(EXPORT_BATCH)
    floating = next((p.dtype for p in module.parameters() if p.is_floating_point()), None)
    return x.to(floating) if floating is not None and x.is_floating_point() else x
