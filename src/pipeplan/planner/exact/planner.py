"""`exact`: the best plan under pipeplan's simulator over its part of planner.plan_space, by branch and bound.

Tie rule: among plans of equal simulated time the first found wins: the seeds (exact.search; each new best plan
is polished at once, its cuts moved while faster), then a cut-short search of every shape, then the full
searches: shapes (rp, m) in increasing order of their bound (rp ascending, then m descending on equal bounds),
each seeded with its suffix table's split before its search; stages by last layer, width, device tuple. On
clusters with twins the plan may name other (twin) devices than a search without the twin rule would, and on ties
it may be another plan of the same time.
"""

from __future__ import annotations

import time

from pipeplan.core.errors import PipeplanError, PlanError
from pipeplan.planner.exact.search import BranchAndBound
from pipeplan.planner.exact.space import search_space
from pipeplan.planner.exact.symmetry import MAX_GROUP, automorphisms
from pipeplan.planner.exact.tensor_space import best_tensor_plan
from pipeplan.planner.plan_space import EXACT_COVERED as COVERED
from pipeplan.planner.plan_space import EXACT_SCHEDULES as SCHEDULES
from pipeplan.planner.request import PlanRequest, PlanResult
from pipeplan.planner.search.refine import twin_classes
from pipeplan.planner.search.tensor_grid import has_tensor_layers
from pipeplan.planner.simulated import evaluate
from pipeplan.schedules.registry import names_text
from pipeplan.sim.cost.layers import static_bytes
from pipeplan.sim.cost.memory import GIB
from pipeplan.sim.cost.plan_costs import plan_costs

MAX_ORDERS = 10080
"""Most orders of the devices up to twins and symmetries (n! over the product of the twin classes' sizes!, over
the automorphism group's size on clusters without twins) accepted: 7 distinct devices pass, and the v100-8x1 preset
(8! over 4 symmetries: 10,080), where 25 of its 26 shared instances at global batch 256 and 25 of 26 at 2048
take 1-10 s of CPU, gnmt-32 at 256 ~36 s and nasnetalarge at 2048 ~11 s (BENCHMARKS.md); 16 distinct devices do
not. The layers set no limit: the suffix table's bound prunes stage ends (4 identical GPUs take any
shared profile, 1,251 layers included; BENCHMARKS.md)."""


def device_orders(classes: tuple[int, ...], limit: int) -> int:
    """n! over the product of the twin classes' sizes!, or a number above `limit` as soon as it passes it."""
    sizes: dict[int, int] = {}
    orders = 1
    for d, twin in enumerate(classes):
        sizes[twin] = sizes.get(twin, 0) + 1
        orders = orders * (d + 1) // sizes[twin]  # the multinomial, built one device at a time (always an integer)
        if orders > limit:
            return orders
    return orders


def plan_exact(request: PlanRequest) -> PlanResult:
    """The plan with the smallest simulated iteration time over exact's space (exact.space's docstring); on a profile
    with tensor-parallel splits, or a forced ZeRO stage, the faster of that and the best 3D plan (exact.tensor_space;
    the t = 1 plan on ties).

    Raises:
        PlanError: the instance is too large, the schedule is not one the
            exact search covers, or no plan fits in memory.
    """
    started = time.perf_counter()
    layers, devices = request.profile.num_layers, request.cluster.num_devices
    classes = twin_classes(request.cluster)
    orders = device_orders(classes, MAX_ORDERS * MAX_GROUP)
    group = automorphisms(request.cluster) if len(set(classes)) == devices else ()
    if orders > MAX_ORDERS * (len(group) + 1):
        raise PlanError(  # the symmetries divide the orders (docstring); the message is the one the docs show
            f"planner 'exact' handles at most {MAX_ORDERS:,} device orders up to twins; {devices} devices in "
            f"{len(set(classes))} twin classes give more; use --planner pipeplan"
        )
    space = search_space(layers, devices, limit=10**12)
    if request.schedule == "auto":
        schedules = SCHEDULES
    elif request.schedule in COVERED:
        schedules = tuple(s for s in SCHEDULES if s[0] == request.schedule)
    else:
        raise PlanError(f"planner 'exact' covers {names_text(COVERED, 'and')}, got schedule {request.schedule!r}")
    search = BranchAndBound(request, schedules, classes, group)
    three_d = has_tensor_layers(request) or request.zero is not None
    if not three_d or ((request.tensor_parallel or 1) == 1 and not request.zero):
        search.run()  # the t = 1 plans without sharding (a forced t > 1 or ZeRO stage leaves only the 3D space)
    best = search.best_plan
    tensor = best_tensor_plan(request) if three_d else None
    if tensor is not None and tensor[1] < search.best_time:  # the t = 1 plan's simulated time (inf: none fits)
        best = tensor[0]
    if best is None:
        copies = ", ".join(
            f"{g.name!r} {static_bytes(g.param_bytes, request.model.optimizer_factor, request.model.holding) / GIB:.2f} GiB"
            for g in request.profile.shared_params
        )
        note = f" (a device holding a layer of a shared parameter keeps a whole copy: {copies})" if copies else ""
        raise PlanError(
            f"planner 'exact' found no plan that fits in memory for {request.profile.name} on "
            f"{request.cluster.name} (global batch {request.global_batch}){note}; try more devices or a smaller batch"
        )
    try:
        result, memory = evaluate(request, best, record=True)
    except PipeplanError as exc:  # the search checked memory the same way; this would be a bug
        raise PlanError(f"planner 'exact' chose a plan that does not fit: {exc}") from exc
    extra = {
        "simulated": search.simulated,
        "search_nodes": search.nodes,
        "shapes_searched": search.shapes_searched,
        "search_space": space,
    }
    if tensor is not None:
        extra["tensor_plans_simulated"] = tensor[2]
    costs = plan_costs(best, request.model)
    return PlanResult(best, "exact", result, costs, memory, time.perf_counter() - started, extra)
