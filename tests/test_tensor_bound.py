"""The proven lower bound over every plan, tensor-parallel and sharded included (planner.bound.tensor_bound): no plan
of a brute-force walk over t, stage replicas, pipeline copies, microbatch size, ZeRO, sequence parallelism, schedule,
cut and device order simulates below it, and it is never above the t = 1 bound it loosens."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
from pathlib import Path

import pytest

from pipeplan.api.planning import plan_request
from pipeplan.core.errors import PipeplanError
from pipeplan.core.plan import Plan, Stage
from pipeplan.planner.bound.plan_bound import EVERY_3D, Bounds
from pipeplan.planner.bound.shape_bounds import ShapeBounds, lower_bound
from pipeplan.planner.bound.tensor_bound import path_shares, shape_counts, tensor_lower_bound
from pipeplan.planner.planners import run_planner
from pipeplan.planner.request import PlanRequest
from pipeplan.sim.cost.memory import check_fits
from pipeplan.sim.plan_sim import simulate_plan
from planner_instances import every_cut

TINY = "gpt:layers=1,hidden=64,heads=8,seq=32,vocab=64"
TWO = "gpt:layers=2,hidden=128,heads=8,seq=64,vocab=256"
BIG = "gpt:layers=1,hidden=4096,heads=32,seq=2048,vocab=1024"
"""One block whose compute dwarfs its collectives: at one microbatch a group of 8 runs near 1/8 of the path."""
SCHEDULES = (("1f1b", 1), ("gpipe", 1), ("zb-h1", 1), ("interleaved-1f1b", 2))


def _plans(request: PlanRequest, order: list[int]) -> list[Plan]:
    """Every plan of p equal-width stages (each on rp x r groups of t devices taken from `order`), every b, ZeRO stage,
    sequence parallelism, schedule and cut, that fits in memory."""
    n, g, layers = request.cluster.num_devices, request.global_batch, request.profile.num_layers
    plans = []
    for t, r, p, rp in itertools.product((1, 2, 4, 8), (1, 2), (1, 2, 4), (1, 2, 4)):
        width = t * r * rp
        if width * p > n or g % rp or p > layers:
            continue
        groups = [tuple(order[s * width : (s + 1) * width]) for s in range(p)]
        for b in (x for x in range(1, g // rp + 1) if (g // rp) % x == 0 and x % r == 0):
            m = g // (rp * b)
            for zero, sp, (schedule, v) in itertools.product((0, 1, 2), (False, True), SCHEDULES):
                if (zero and r * rp == 1) or (sp and t == 1) or (v > 1 and (p == 1 or m % p)) or p * v > layers:
                    continue
                for cut in every_cut(layers, p * v):
                    stages = tuple(Stage(a, z, groups[c % p], tp=t, sequence_parallel=sp) for c, (a, z) in enumerate(cut))
                    plan = Plan(stages, rp, m, b, schedule, chunks=v, zero=zero)
                    try:
                        check_fits(plan, request.model)
                    except PipeplanError:
                        continue
                    plans.append(plan)
    return plans


@pytest.mark.parametrize(
    ("profile", "cluster", "global_batch", "seed"),
    [
        (TINY, "dgx-a100-8x1", 8, 0),
        (TWO, "dgx-a100-8x1", 4, 1),
        pytest.param(TWO, "dgx-a100-8x2", 4, 2, marks=pytest.mark.slow),
        (TINY, "a100-8x2", 8, 3),
        (BIG, "dgx-a100-8x1", 1, 4),
        (BIG, "dgx-a100-8x1", 2, 5),
    ],
)
def test_no_plan_simulates_below_the_bound(profile: str, cluster: str, global_batch: int, seed: int) -> None:
    request = plan_request(profile, cluster, global_batch, time_budget_s=None)
    bound = tensor_lower_bound(request)
    assert 0 < bound.ms < math.inf
    order = list(range(request.cluster.num_devices))
    random.Random(seed).shuffle(order)  # groups on any devices, not only a server's neighbours
    plans = _plans(request, order) + _plans(request, sorted(order))
    assert len(plans) > 100
    times = [simulate_plan(plan, request.model).iteration_time for plan in plans]
    assert min(times) >= bound.ms * (1 - 1e-12)

    assert any(plan.zero or plan.stages[0].tp > 1 for plan in plans)


def test_the_path_share_is_the_largest_degree_a_width_allows() -> None:
    request = plan_request(TINY, "dgx-a100-8x1", 8, time_budget_s=None)
    widths = [layer.tp.width if layer.tp is not None else None for layer in request.profile.layers]
    expected = [1.0 if w is None else 1.0 / max(t for t in range(1, 9) if w % t == 0) for w in widths]
    assert path_shares(request).tolist() == expected


@pytest.mark.parametrize("profile", [TWO, "dapple/bert-24"])
def test_it_never_exceeds_the_flat_bound(profile: str) -> None:
    # the same compute and path terms with the layers' shares of a group and the optimizer over every copy: looser
    request = plan_request(profile, "dgx-a100-8x1", 16, time_budget_s=None)
    assert tensor_lower_bound(request).ms <= lower_bound(request).ms * (1 + 1e-12)


def test_pipeplan_s_3d_plan_is_measured_against_it() -> None:
    request = plan_request("gpt:layers=24,hidden=2048,heads=16,seq=2048,vocab=51200", "dgx-a100-8x1", 8, time_budget_s=None)
    result = run_planner("pipeplan", request)
    measured = Bounds(request).of(result.plan, result.iteration_time)
    if result.plan.zero or any(s.tp > 1 for s in result.plan.stages):
        assert measured.of == EVERY_3D
    assert measured.gap >= 1 - 1e-12


def test_a_pipeline_need_hold_only_the_working_weights(tmp_path: Path) -> None:
    """16 devices of 215 kB each and a bf16 gpt profile (241,408 parameter bytes, counted as the fp32 master copy):
    no device holds the master's bytes, but 16 pipeline copies of one device under ZeRO-2 fit (each holds half of them
    as bf16 working weights, the rest sharded 16 ways): the bound counts that shape and is below that plan's time."""
    n = 16
    cluster = {"format": "pipeplan.cluster/1", "name": "tight-16", "devices": [{"kind": "a100", "memory_gb": 215e3 / 2**30}] * n,
               "bandwidth_gb_per_s": [[0 if i == j else 100 for j in range(n)] for i in range(n)],
               "latency_us": [[0 if i == j else 5 for j in range(n)] for i in range(n)]}  # fmt: skip
    (tmp_path / "tight.json").write_text(json.dumps(cluster))
    request = plan_request(TINY, str(tmp_path / "tight.json"), n, time_budget_s=None)
    weights = sum(layer.param_bytes for layer in request.profile.layers)
    assert weights == 241408.0 > request.cluster.devices[0].memory_bytes
    plan = Plan((Stage(0, request.profile.num_layers - 1, tuple(range(n))),), n, 1, 1, "1f1b", zero=2)
    check_fits(plan, request.model)  # 0.5 + (1 + 1 + 2) / 16 of the bytes, and one sample's activations
    with pytest.raises(PipeplanError):
        check_fits(dataclasses.replace(plan, zero=1), request.model)
    bounds = ShapeBounds(request)
    assert shape_counts(bounds, n)
    assert tensor_lower_bound(request).ms <= simulate_plan(plan, request.model).iteration_time * (1 + 1e-12)
