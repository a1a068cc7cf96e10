"""planner.baselines.megatron: the plan of a t x p x d grid point in closed form, and the grid search's pick against
a brute force over its own grid."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeplan.core.errors import PlanError
from pipeplan.planner.baselines.megatron import GridPoint, grid, megatron_plan, plan_megatron
from pipeplan.planner.compare import compare, planner_names
from pipeplan.planner.request import PlanRequest
from pipeplan.presets.resolve import load_cluster, load_profile
from pipeplan.sim.cost.memory import check_fits
from pipeplan.sim.plan_sim import simulate_plan
from planner_instances import random_cluster

TINY = "gpt:layers=4,hidden=64,heads=4,seq=16,vocab=64"


def request(batch: int = 16, **options: object) -> PlanRequest:
    """The tiny GPT (10 layers: embedding, 4 x attention + mlp, head) on one DGX A100 server (8 devices)."""
    return PlanRequest(load_profile(TINY), load_cluster("dgx-a100-8x1"), batch, **options)  # type: ignore[arg-type]


def test_a_grid_point_is_uniform_blocks_with_the_embedding_first_and_the_head_last() -> None:
    """t 2 x p 2 x d 2, b 2: two blocks per stage (embedding + 2 blocks = layers 0..4, 2 blocks + head = 5..9), each
    group of 2 on consecutive devices, tensor rank fastest, then copy, then stage; 16 / (2 x 2) = 4 microbatches."""
    plan = megatron_plan(request(), GridPoint(tp=2, pp=2, dp=2, micro=2))
    assert [(s.first_layer, s.last_layer) for s in plan.stages] == [(0, 4), (5, 9)]
    assert [s.devices for s in plan.stages] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert all(s.tp == 2 and not s.sequence_parallel for s in plan.stages)
    assert (plan.pipeline_replicas, plan.microbatches, plan.microbatch_size, plan.schedule) == (2, 4, 2, "1f1b")
    assert plan.zero == 0 and plan.chunks == 1


def test_blocks_that_do_not_divide_count_the_embedding_and_head_as_blocks() -> None:
    """4 blocks over 3 stages: 6 units of 2 (embedding + 1 block, 2 blocks, 1 block + head), as BLOOM split 70 over 12."""
    plan = megatron_plan(request(), GridPoint(tp=1, pp=3, dp=2, micro=1))
    assert [(s.first_layer, s.last_layer) for s in plan.stages] == [(0, 2), (3, 6), (7, 9)]
    assert [s.devices for s in plan.stages] == [(0, 1), (2, 3), (4, 5)]


def test_interleaving_puts_chunk_c_on_stage_c_mod_p_and_zero_1_shards() -> None:
    """v 2 over p 2: four chunks of one block (the first with the embedding, the last with the head), chunk c on the
    devices of stage c mod 2; ZeRO-1 with d 2."""
    plan = megatron_plan(request(), GridPoint(tp=2, pp=2, dp=2, micro=1, chunks=2, zero=1))
    assert [(s.first_layer, s.last_layer) for s in plan.stages] == [(0, 2), (3, 4), (5, 6), (7, 9)]
    assert [s.devices for s in plan.stages] == [(0, 1, 2, 3), (4, 5, 6, 7)] * 2
    assert (plan.schedule, plan.chunks, plan.zero) == ("interleaved-1f1b", 2, 1)


def test_the_grid_is_every_t_p_d_the_module_names() -> None:
    """t in {1, 2, 4} (8 per server; heads 4), p dividing 4 or 6 blocks-plus-two, t p | 8: the (t, p, d) set."""
    got = {(g.tp, g.pp, g.dp) for g in grid(request())}
    assert got == {(1, 1, 8), (1, 2, 4), (1, 4, 2), (2, 1, 4), (2, 2, 2), (2, 4, 1), (4, 1, 2), (4, 2, 1)}
    assert all(g.micro & (g.micro - 1) == 0 and 16 % (g.dp * g.micro) == 0 for g in grid(request()))
    assert {g.chunks for g in grid(request()) if g.pp == 1} == {1}


def test_the_search_returns_the_brute_force_best_of_its_grid() -> None:
    """plan_megatron's plan is the fastest fitting plan over every point of its grid, simulated one by one."""
    req = request()
    times = []
    for point in grid(req):
        plan = megatron_plan(req, point)
        check_fits(plan, req.model)
        times.append((simulate_plan(plan, req.model, record=False).iteration_time, plan))
    best_ms, best_plan = min(times, key=lambda pair: pair[0])
    result = plan_megatron(req)
    assert result.iteration_time == best_ms and result.plan == best_plan


def test_compare_runs_it_when_named_and_not_by_default() -> None:
    """`compare --planners megatron` plans it; the default comparison leaves it out (compare.OPT_IN)."""
    (row,) = compare(request(), ["megatron"])
    assert row.planner == "megatron"  # type: ignore[union-attr]
    assert "megatron" not in planner_names()


def test_refusals_are_one_plan_error_and_interleaved_keeps_v_2() -> None:
    """A schedule it does not run, a grid no t p d fits (5 devices, batch 3) and a model no point holds are refused
    by name; asked for interleaved-1f1b it searches only v 2."""
    with pytest.raises(PlanError, match="runs 1f1b or interleaved-1f1b only, got schedule 'gpipe'"):
        plan_megatron(request(schedule="gpipe"))
    big = load_profile("gpt:layers=96,hidden=12288,heads=96,seq=2048,vocab=51200")
    with pytest.raises(PlanError, match=r"no t x p x d grid fits 5 devices and global batch 3"):
        plan_megatron(PlanRequest(load_profile(TINY), random_cluster(1, 5), 3))
    with pytest.raises(PlanError, match=r"no grid point fits \(40 tried"):
        plan_megatron(PlanRequest(big, load_cluster("dgx-a100-8x1"), 8))
    assert plan_megatron(request(schedule="interleaved-1f1b")).plan.chunks == 2


@given(st.integers(1, 40), st.integers(1, 42))
def test_stage_bounds_are_uniform_blocks_for_any_depth(blocks: int, parts: int) -> None:
    """Any l blocks over P chunk-stages: contiguous and covering; P | l gives each l / P blocks (the embedding on the
    first, the head on the last); otherwise, counting the embedding and head as a block each, the units per stage
    differ by at most one; more stages than l + 2 units is a PlanError."""
    from pipeplan.planner.baselines.megatron import stage_bounds

    profile = load_profile(f"gpt:layers={blocks},hidden=64,heads=4,seq=16,vocab=64")
    if parts > blocks + 2:
        with pytest.raises(PlanError, match="more than the profile's"):
            stage_bounds(profile, parts)
        return
    bounds = stage_bounds(profile, parts)
    assert bounds[0][0] == 0 and bounds[-1][1] == 2 * blocks + 1
    assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(bounds))
    sizes = [last - first + 1 for first, last in bounds]
    units = [(size + (i == 0) + (i == parts - 1)) / 2 for i, size in enumerate(sizes)]
    if blocks % parts == 0:
        assert [size - (i == 0) - (i == parts - 1) for i, size in enumerate(sizes)] == [2 * blocks // parts] * parts
    else:
        assert all(u == int(u) for u in units) and max(units) - min(units) <= 1 and sum(units) == blocks + 2
