"""pipeplan.profiler: per-layer measurement of torch modules, FLOP counting and roofline projection onto a GPU.

The only package besides `runtime` that imports torch.
"""

from pipeplan.profiler.flops import LayerWork
from pipeplan.profiler.measure import LayerSizes, Measurement, measure_layers, profile_module
from pipeplan.profiler.projection import project_profile, resolve_gpu, roofline_ms
from pipeplan.profiler.specs import ModelSpec, layers_of, resolve_module_spec, spec_from_module

__all__ = [
    "LayerSizes",
    "LayerWork",
    "Measurement",
    "ModelSpec",
    "layers_of",
    "measure_layers",
    "profile_module",
    "project_profile",
    "resolve_gpu",
    "resolve_module_spec",
    "roofline_ms",
    "spec_from_module",
]
