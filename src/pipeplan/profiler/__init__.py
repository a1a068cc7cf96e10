"""pipeplan.profiler: per-layer measurement of torch modules, FLOP counting and roofline projection onto a GPU.

With `models` and `runtime`, the only packages that import torch; the models it measures come from `models`.
"""

from pipeplan.profiler.flops import LayerWork
from pipeplan.profiler.measure import LayerSizes, Measurement, measure_layers, profile_module
from pipeplan.profiler.projection import project_profile, resolve_gpu, roofline_ms

__all__ = [
    "LayerSizes",
    "LayerWork",
    "Measurement",
    "measure_layers",
    "profile_module",
    "project_profile",
    "resolve_gpu",
    "roofline_ms",
]
