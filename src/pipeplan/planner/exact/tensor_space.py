"""`exact` over tensor parallelism and sharding (issue 34): every 3D plan on Megatron-LM's device order, simulated.

On a profile with layers that split over a tensor-parallel group, `exact`'s answer is the faster of its t = 1 plan
without sharding (planner.exact.planner: every device order up to twins, by branch and bound) and the best plan of
this space, found by simulating every one of its plans in full: every tensor-parallel degree t of
planner.plan_space.tensor_degrees, p pipeline ranks and d = N / (t p) copies (d dividing the global batch; 1 under
replication "none"), every microbatch size b, every ZeRO stage (planner.search.tensor_grid.zero_stages), sequence
parallelism off and on (t > 1; only one where the request forces it), the schedules exact covers (1f1b, zb-h1, kfkb
k = 2..4 with k < m, gpipe) and interleaved-1f1b at v in tensor_grid.CHUNKS (m a multiple of p), and every
contiguous cut of the layers into p v stages, on the devices in server order (baselines.megatron.server_order: the
tensor-parallel rank fastest, then the copy, then the stage, as tensor_grid places them). Plans with t = 1 and ZeRO
0 are left to the t = 1 search, whose space holds every device order. So the space holds pipeplan's 3D search's
(tensor_grid) and the Megatron-style grid's plans, and exact's plan is never slower than either.

Ties: the first plan found in the order above wins (t, p, b ascending, then ZeRO, sequence parallelism, schedule, cut).
A space of more than MAX_PLANS plans is refused before any simulation (`count_plans`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

from pipeplan.core.errors import PipeplanError, PlanError
from pipeplan.core.plan import Plan, Stage
from pipeplan.planner.baselines.megatron import server_order
from pipeplan.planner.plan_space import EXACT_SCHEDULES, divisors, microbatch_sizes, tensor_degrees
from pipeplan.planner.request import PlanRequest
from pipeplan.planner.search.tensor_grid import CHUNKS, sequence_options, zero_stages
from pipeplan.planner.simulated import evaluate

MAX_PLANS = 20_000
"""Most 3D plans exact simulates (a few ms each on small profiles: about a minute of CPU at most)."""


def layouts(request: PlanRequest, p: int, m: int) -> list[tuple[str, int, int]]:
    """(schedule, k, chunks v) of a shape with p ranks and m microbatches, in exact's order, then interleaving."""
    out = [(s, k, 1) for s, k in EXACT_SCHEDULES if s != "kfkb" or k < m]
    if p > 1 and m % p == 0:
        out += [("interleaved-1f1b", 1, v) for v in CHUNKS]
    if request.schedule != "auto":
        out = [x for x in out if x[0] == request.schedule]
    return out


def shapes(request: PlanRequest) -> Iterator[tuple[int, int, int, int, int]]:
    """(t, p, d, b, m) of the space, in its order."""
    n, g, layers = request.cluster.num_devices, request.global_batch, request.profile.num_layers
    for t in tensor_degrees(request):
        if n % t:
            continue
        for p in divisors(n // t):
            d = n // (t * p)
            if p > layers or g % d or (d > 1 and not request.pipelines_allowed):
                continue
            for b in microbatch_sizes(request, g // d):
                yield t, p, d, b, g // (d * b)


def options(request: PlanRequest, t: int, d: int) -> list[tuple[int, bool]]:
    """(ZeRO stage, sequence parallelism) of a shape, t = 1 without sharding left out (the t = 1 search's); sequence
    parallelism as the request allows it (tensor_grid.sequence_options)."""
    sp = sequence_options(request, t)
    return [(z, s) for z in zero_stages(request, d) for s in sp if t > 1 or z > 0]


def count_plans(request: PlanRequest) -> int:
    """How many plans the space holds (before memory is checked)."""
    layers = request.profile.num_layers
    total = 0
    for t, p, d, _, m in shapes(request):
        cuts = sum(math.comb(layers - 1, p * v - 1) for _, _, v in layouts(request, p, m) if p * v <= layers)
        total += cuts * len(options(request, t, d))
    return total


def cuts(layers: int, parts: int) -> Iterator[tuple[tuple[int, int], ...]]:
    """Every split of `layers` layers into `parts` contiguous non-empty stages, in lexicographic order of the cuts."""
    for inner in itertools.combinations(range(1, layers), parts - 1):
        edges = (0, *inner, layers)
        yield tuple((edges[i], edges[i + 1] - 1) for i in range(parts))


def plans(request: PlanRequest) -> Iterator[Plan]:
    """Every plan of the space, in its order (module docstring)."""
    devices = server_order(request)
    layers = request.profile.num_layers
    for t, p, d, b, m in shapes(request):
        groups = [tuple(devices[t * (i + d * s) + j] for i in range(d) for j in range(t)) for s in range(p)]
        for zero, sp in options(request, t, d):
            for schedule, k, v in layouts(request, p, m):
                if p * v > layers:
                    continue
                for bounds in cuts(layers, p * v):
                    stages = tuple(Stage(a, z, groups[c % p], tp=t, sequence_parallel=sp) for c, (a, z) in enumerate(bounds))
                    yield Plan(stages, d, m, b, schedule, k=k, chunks=v, zero=zero)


def best_tensor_plan(request: PlanRequest) -> tuple[Plan, float, int] | None:
    """The fastest plan of the space that fits (the first on ties), its simulated time and the plans simulated; None
    when none fits.

    Raises:
        PlanError: the space holds more than MAX_PLANS plans.
    """
    size = count_plans(request)
    if size > MAX_PLANS:
        raise PlanError(
            f"planner 'exact' simulates at most {MAX_PLANS:,} plans with tensor parallelism or sharding; "
            f"{request.profile.name} on {request.cluster.name} (global batch {request.global_batch}) has {size:,}; "
            f"use --planner pipeplan"
        )
    best: tuple[Plan, float] | None = None
    simulated = 0
    for plan in plans(request):
        try:
            result, _ = evaluate(request, plan)
        except PipeplanError:
            continue  # does not fit, or cannot run its schedule
        simulated += 1
        if best is None or result.iteration_time < best[1]:
            best = (plan, result.iteration_time)
    return None if best is None else (*best, simulated)
