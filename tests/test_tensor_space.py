"""`exact` over tensor parallelism and sharding (planner.exact.tensor_space): its answer is the faster of a brute force
over every 3D plan on the server order and exact's t = 1 plan, it is never slower than pipeplan's or the Megatron
grid's plan, and a space too large to simulate is refused."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from pipeplan.api.planning import plan_request
from pipeplan.core.errors import PipeplanError, PlanError
from pipeplan.core.plan import Plan, Stage
from pipeplan.planner.exact import tensor_space
from pipeplan.planner.exact.tensor_space import count_plans, plans
from pipeplan.planner.planners import run_planner
from pipeplan.planner.request import PlanRequest
from pipeplan.sim.cost.memory import check_fits
from pipeplan.sim.plan_sim import simulate_plan

TINY = "gpt:layers=1,hidden=64,heads=8,seq=32,vocab=64"
BIG = "gpt:layers=1,hidden=4096,heads=32,seq=2048,vocab=1024"
"""One block whose compute outweighs its collectives: tensor parallelism and ZeRO win here."""
SCHEDULES = (("1f1b", 1, 1), ("zb-h1", 1, 1), ("kfkb", 2, 1), ("kfkb", 3, 1), ("kfkb", 4, 1), ("gpipe", 1, 1))


def _brute_force(request: PlanRequest) -> float:
    """The fastest plan by hand over t, p, d, b, ZeRO, SP, schedule (exact's and interleaving at v 2 and 4) and every
    cut, on the devices ordered by server, leaving out t = 1 without ZeRO."""
    n, g, layers = request.cluster.num_devices, request.global_batch, request.profile.num_layers
    ids = sorted(range(n), key=lambda i: (request.cluster.devices[i].node, i))
    best = float("inf")
    for t, p in itertools.product((1, 2, 4, 8), (1, 2, 4, 8)):
        if n % (t * p) or p > layers or g % (n // (t * p)):
            continue
        d = n // (t * p)
        groups = [tuple(ids[t * (i + d * s) + k] for i in range(d) for k in range(t)) for s in range(p)]
        for b in (x for x in range(1, g // d + 1) if (g // d) % x == 0):
            m = g // (d * b)
            layouts = [x for x in SCHEDULES if x[0] != "kfkb" or x[1] < m]
            layouts += [("interleaved-1f1b", 1, v) for v in (2, 4) if p > 1 and m % p == 0]
            for zero, sp, (schedule, k, v) in itertools.product((0, 1, 2), (False, True), layouts):
                if (zero and d == 1) or (sp and t == 1) or (t == 1 and zero == 0) or p * v > layers:
                    continue
                for inner in itertools.combinations(range(1, layers), p * v - 1):
                    edges = (0, *inner, layers)
                    stages = tuple(
                        Stage(edges[c], edges[c + 1] - 1, groups[c % p], tp=t, sequence_parallel=sp) for c in range(p * v)
                    )
                    plan = Plan(stages, d, m, b, schedule, k=k, chunks=v, zero=zero)
                    try:
                        check_fits(plan, request.model)
                        best = min(best, simulate_plan(plan, request.model).iteration_time)
                    except PipeplanError:
                        continue
    return best


def _flat(request: PlanRequest) -> PlanRequest:
    """The request with every layer's split removed: exact's t = 1 search alone."""
    layers = tuple(dataclasses.replace(layer, tp=None) for layer in request.profile.layers)
    profile = dataclasses.replace(request.profile, layers=layers)
    return plan_request(profile, request.cluster, request.global_batch, time_budget_s=None)


@pytest.mark.parametrize(
    ("profile", "cluster", "global_batch"), [(TINY, "dgx-a100-8x1", 8), (BIG, "dgx-a100-8x1", 2), (BIG, "v100-8x1", 4)]
)
def test_exact_is_the_faster_of_the_brute_force_and_the_t1_optimum(profile: str, cluster: str, global_batch: int) -> None:
    request = plan_request(profile, cluster, global_batch, time_budget_s=None)
    found = run_planner("exact", request)
    flat = run_planner("exact", _flat(request)).iteration_time
    assert found.iteration_time == pytest.approx(min(_brute_force(request), flat), rel=1e-12, abs=0)
    # never slower than pipeplan's plan (its 3D search walks a subset of this space) nor the Megatron-style grid's
    assert found.iteration_time <= run_planner("pipeplan", request).iteration_time * (1 + 1e-12)
    assert found.iteration_time <= run_planner("megatron", request).iteration_time * (1 + 1e-12)


def test_on_a_big_block_the_best_plan_is_tensor_parallel() -> None:
    request = plan_request(BIG, "dgx-a100-8x1", 2, time_budget_s=None)
    found = run_planner("exact", request)
    assert found.plan.stages[0].tp > 1 and found.extra["tensor_plans_simulated"] > 0
    assert found.iteration_time < run_planner("exact", _flat(request)).iteration_time


def test_the_count_is_the_enumeration_s_length() -> None:
    for cluster, batch in (("dgx-a100-8x1", 8), ("a100-8x2", 4), ("v100-8x1", 3)):
        request = plan_request("gpt:layers=2,hidden=64,heads=8,seq=32,vocab=64", cluster, batch, time_budget_s=None)
        assert count_plans(request) == sum(1 for _ in plans(request)) > 0


def test_a_space_too_large_is_refused_before_any_simulation(monkeypatch: pytest.MonkeyPatch) -> None:
    request = plan_request(TINY, "dgx-a100-8x1", 8, time_budget_s=None)
    monkeypatch.setattr(tensor_space, "MAX_PLANS", 10)
    monkeypatch.setattr(tensor_space, "evaluate", lambda *_: pytest.fail("simulated"))
    with pytest.raises(PlanError, match=f"at most 10 plans .* has {count_plans(request):,}; use --planner pipeplan"):
        run_planner("exact", request)
