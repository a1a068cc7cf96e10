"""The memory budget of adaptive k: the most any device may hold at any candidate k, its default and its check."""

from __future__ import annotations

import math
from collections.abc import Sequence

from pipeplan.adapt.pipeline import PipelineModel
from pipeplan.adapt.predict import stage_peak_bytes
from pipeplan.core.errors import AdaptError
from pipeplan.core.plan import MEMORY_MARGIN
from pipeplan.schedules.kfkb import kfkb

GIB = float(1 << 30)


def default_budget(memory_limit_bytes: Sequence[float]) -> float:
    """The budget when none is given: the smallest device's memory less MEMORY_MARGIN."""
    return (1.0 - MEMORY_MARGIN) * min(memory_limit_bytes)


def one_f_one_b_peaks(pipeline: PipelineModel) -> tuple[float, ...]:
    """Each stage's peak bytes under k = 1 (1F1B): the least any candidate k holds."""
    return stage_peak_bytes(pipeline, kfkb(pipeline.num_stages, pipeline.microbatches, 1))


def check_budget(pipeline: PipelineModel, budget: float, name: str = "memory_budget_bytes") -> float:
    """Return `budget` when it is a finite number > 0 that holds k = 1 (1F1B) on every stage.

    Raises:
        AdaptError: naming `name` (the flag or field that gave it), the budget, 1F1B's peak, the stage and by how much,
            with the way out.
    """
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not math.isfinite(budget) or budget <= 0:
        raise AdaptError(f"{name} must be a finite number of bytes > 0, got {budget!r}")
    peaks = one_f_one_b_peaks(pipeline)
    s = max(range(len(peaks)), key=lambda i: peaks[i])
    if peaks[s] > budget:
        raise AdaptError(
            f"{name} {_size(budget)} is below 1F1B's peak: k=1 holds {_size(peaks[s])} on stage {s} "
            f"({_size(peaks[s] - budget)} over the budget); give at least {math.ceil(peaks[s] / 2**20)}MiB, "
            f"or leave it out (default: the device memory less {MEMORY_MARGIN:.0%})"
        )
    return float(budget)


def _size(nbytes: float) -> str:
    """Bytes in GiB from 1 GiB up, else in MiB, 3 significant digits (a message's sizes)."""
    return f"{nbytes / GIB:.3g} GiB" if nbytes >= GIB else f"{nbytes / 2**20:.3g} MiB"


def resolve_budget(pipeline: PipelineModel, given: float | None, name: str = "memory_budget_bytes") -> float:
    """The budget a command adapts with: `given` (checked by check_budget), else default_budget of the pipeline's
    devices, raised to 1F1B's peak where that alone holds more (the default never refuses a plan its devices hold;
    it only caps the k above 1).

    Raises:
        AdaptError: a given budget that is not a number > 0 or is below 1F1B's peak (check_budget).
    """
    if given is not None:
        return check_budget(pipeline, given, name)
    return max(default_budget(pipeline.memory_limit_bytes), max(one_f_one_b_peaks(pipeline)))
