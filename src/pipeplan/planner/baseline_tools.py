"""What the baseline planners share: layer blocks, microbatch sizes, and scoring plans with the simulator."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pipeplan.core.errors import PipeplanError, PlanError
from pipeplan.core.plan import Plan, Stage
from pipeplan.core.profile import LayerProfile, ModelProfile
from pipeplan.planner.base import PlanRequest, PlanResult
from pipeplan.sim.memory import check_fits
from pipeplan.sim.result import SimResult
from pipeplan.sim.stage_costs import simulate_plan


@dataclass(frozen=True, slots=True)
class Blocks:
    """A profile whose consecutive layers were merged into blocks, and where each block starts.

    `starts[b]` is the first original layer of block b; block b ends just
    before `starts[b + 1]` (or at the last layer).
    """

    profile: ModelProfile
    starts: tuple[int, ...]
    num_layers: int

    def layer_range(self, first_block: int, last_block: int) -> tuple[int, int]:
        """Original (first_layer, last_layer) covered by blocks first_block..last_block."""
        end = self.starts[last_block + 1] - 1 if last_block + 1 < len(self.starts) else self.num_layers - 1
        return self.starts[first_block], end


def merge_layers(profile: ModelProfile, max_blocks: int) -> Blocks:
    """Group consecutive layers into at most `max_blocks` blocks of about equal fwd+bwd time.

    A profile with at most `max_blocks` layers is returned as it is (one
    layer per block). Cuts fall where the running compute first reaches the
    next multiple of total / max_blocks, so a block may hold one heavy layer
    only; zero-cost layers join the block before them.

    Note:
        The DP baselines (DAPPLE, PipeDream) are cubic or worse in the number
        of layers; profiles of hundreds of layers (nasnet, densenet) are
        planned over blocks. A stage boundary can then only fall between blocks.
    """
    n = profile.num_layers
    if n <= max_blocks:
        return Blocks(profile, tuple(range(n)), n)
    costs = [layer.fwd_ms + layer.bwd_ms for layer in profile.layers]
    total = sum(costs) or 1.0
    starts = [0]
    running = 0.0
    for i in range(n - 1):
        running += costs[i]
        blocks_left = max_blocks - len(starts)
        layers_left = n - 1 - i
        target = total * len(starts) / max_blocks
        if blocks_left > 0 and (running >= target or layers_left <= blocks_left):
            starts.append(i + 1)
    layers = []
    for b, first in enumerate(starts):
        last = starts[b + 1] - 1 if b + 1 < len(starts) else n - 1
        group = profile.layers[first : last + 1]
        layers.append(
            LayerProfile(
                name=group[0].name if len(group) == 1 else f"{group[0].name}..{group[-1].name}",
                fwd_ms=sum(layer.fwd_ms for layer in group),
                bwd_ms=sum(layer.bwd_ms for layer in group),
                activation_bytes=group[-1].activation_bytes,
                param_bytes=sum(layer.param_bytes for layer in group),
                saved_bytes=sum(layer.saved_bytes or 0.0 for layer in group) - sum(layer.shared_bytes for layer in group[1:]),
                shared_bytes=group[0].shared_bytes,
            )
        )
    cuts = tuple(profile.cut_bytes[starts[b + 1] - 1] for b in range(len(starts) - 1))  # type: ignore[index]
    merged = ModelProfile(profile.name, profile.batch_size, tuple(layers), profile.reference_device, cuts, profile.measured)
    return Blocks(merged, tuple(starts), n)


def prefix_sums(values: Iterable[float]) -> list[float]:
    """[0, v0, v0+v1, ...]: the sum of values[i..j] is out[j + 1] - out[i]."""
    out = [0.0]
    for v in values:
        out.append(out[-1] + v)
    return out


def powers_of_two_dividing(n: int) -> list[int]:
    """1, 2, 4, ... up to n, keeping those that divide n."""
    out = []
    b = 1
    while b <= n:
        if n % b == 0:
            out.append(b)
        b *= 2
    return out


def microbatch_sizes(request: PlanRequest, replica_batch: int, max_microbatches: int = 512) -> list[int]:
    """Microbatch sizes a baseline tries for one pipeline replica's batch, largest first.

    The request's size when it sets one (if it divides the batch); else the
    powers of two dividing the batch, plus the profile's own batch size, that
    give at most `max_microbatches` microbatches.
    """
    if request.microbatch_size is not None:
        return [request.microbatch_size] if replica_batch % request.microbatch_size == 0 else []
    sizes = set(powers_of_two_dividing(replica_batch))
    if replica_batch % request.profile.batch_size == 0:
        sizes.add(request.profile.batch_size)
    return sorted((b for b in sizes if replica_batch // b <= max_microbatches), reverse=True)


def require_schedule(request: PlanRequest, planner: str, schedule: str) -> None:
    """Raise PlanError unless the request lets `planner` run its own `schedule`."""
    if request.schedule not in ("auto", schedule):
        raise PlanError(
            f"planner {planner!r} runs {schedule} only, got schedule {request.schedule!r}; "
            "use --planner pipeplan or exact to choose among schedules"
        )


def evaluate(request: PlanRequest, plan: Plan, record: bool = False) -> tuple[SimResult, tuple[float, ...]]:
    """Simulate `plan` and check it fits; return the result and memory per device.

    Raises:
        PlanError: the plan does not fit in memory (naming stage, device and excess).
    """
    memory = check_fits(plan, request.model)
    result = simulate_plan(plan, request.model, record=record)
    return result, memory


def best_of(
    request: PlanRequest,
    planner: str,
    plans: Iterable[Plan],
    started: float,
    extra: dict[str, Any] | None = None,
) -> PlanResult:
    """Simulate each plan that fits and return the fastest (first on ties) as a PlanResult.

    Raises:
        PlanError: no plan was given, or none fits (the error of the last one tried).
    """
    best: tuple[float, Plan] | None = None
    last_error: PipeplanError | None = None
    tried = 0
    for plan in plans:
        tried += 1
        try:
            result, _ = evaluate(request, plan)
        except PipeplanError as exc:
            last_error = exc
            continue
        if best is None or result.iteration_time < best[0]:
            best = (result.iteration_time, plan)
    if best is None:
        if last_error is not None:
            raise PlanError(f"planner {planner!r} found no plan that fits: {last_error}")
        raise PlanError(f"planner {planner!r} found no candidate plan for global batch {request.global_batch}")
    result, memory = evaluate(request, best[1], record=True)
    info = {"candidates_simulated": tried, **(extra or {})}
    return PlanResult(best[1], planner, result, memory, time.perf_counter() - started, info)


def straight_stages(bounds: Sequence[int], devices: Sequence[int]) -> tuple[Stage, ...]:
    """Stages from layer bounds [0, b1, ..., L] with one device each, in the given device order."""
    return tuple(Stage(bounds[i], bounds[i + 1] - 1, (devices[i],)) for i in range(len(bounds) - 1))


def ceil_div(a: int, b: int) -> int:
    """ceil(a / b) for positive ints."""
    return -(-a // b)


def finite(value: float) -> bool:
    """True for a finite float."""
    return not (math.isinf(value) or math.isnan(value))
