"""placed_bounds.fill_bound and exact.filled: the warm-up and drain bound, on complete plans and on first stages."""

from __future__ import annotations

import dataclasses
import random

from pipeplan.core.plan import Plan, Stage
from pipeplan.planner.bound.best_rings import Rings
from pipeplan.planner.bound.placed_bounds import Placed, compute_bound, drain_counts, fill_bound
from pipeplan.planner.bound.shape_bounds import ShapeBounds
from pipeplan.planner.bound.suffix_table import SuffixBound
from pipeplan.planner.exact import SCHEDULES
from pipeplan.planner.exact.filled import filled
from pipeplan.planner.exact.search_tables import tables_for
from pipeplan.planner.exact.stages import StageCosts
from pipeplan.planner.request import PlanRequest
from pipeplan.sim.plan_sim import simulate_plan
from planner_instances import random_cluster, random_profile


def random_plan(rng: random.Random, trial: int) -> tuple[PlanRequest, list[Placed], int, int, int, str, int]:
    """A random instance and plan: any split, 1-2 pipelines, stages of 1-2 replicas, any m and schedule."""
    layers, devices = rng.randint(2, 7), rng.randint(2, 7)
    request = PlanRequest(random_profile(trial, layers), random_cluster(trial, devices), 16)
    rp = rng.choice([r for r in (1, 2) if r <= devices])
    m = rng.choice([m for m in (1, 2, 4, 8) if 16 // rp // m >= 1])
    size = 16 // rp // m
    count = rng.randint(1, min(layers, devices // rp))
    cuts = [0, *sorted(rng.sample(range(1, layers), count - 1)), layers]
    free = list(range(devices))
    rng.shuffle(free)
    costs, placed = StageCosts(request), []
    for s in range(count):
        spare = len(free) - (count - s - 1) * rp  # devices this stage may take, leaving rp for each later one
        r = rng.choice([r for r in (1, 2) if r * rp <= spare and size % r == 0])
        group = tuple(free.pop() for _ in range(r * rp))
        placed.append(costs.place(cuts[s], cuts[s + 1] - 1, group, rp, size, placed[-1] if placed else None))
    name, k = rng.choice([sch for sch in SCHEDULES if sch[0] != "kfkb" or sch[1] < m])
    return request, placed, rp, m, size, name, k


def simulated_plan(rng: random.Random, trial: int) -> tuple[PlanRequest, list[Placed], int, int, int, str, int, float]:
    """random_plan and its simulated iteration time."""
    request, placed, rp, m, size, name, k = random_plan(rng, trial)
    plan = Plan(tuple(Stage(st.first, st.last, st.devices) for st in placed), rp, m, size, name, k=k)
    return request, placed, rp, m, size, name, k, simulate_plan(plan, request.model, record=False).iteration_time


def test_fill_bound_never_exceeds_the_simulation() -> None:
    """On 300 random plans (replicated stages, 1-2 pipelines, every schedule, kfkb k = 2..4) the bound of the whole
    plan, and of each of its first stages with the suffix table's way up and back (all widths, the widths the later
    stages may take, and those with Tables.hop's transfers; and with the table's part of the last stage), is <= the
    simulated time."""
    rng = random.Random(23)
    checked = 0
    for trial in range(300):
        request, placed, rp, m, size, name, k, simulated = simulated_plan(rng, trial)
        p = len(placed)
        assert fill_bound(placed, m, name, k, p) <= simulated * (1 + 1e-9)
        table = SuffixBound(ShapeBounds(request), Rings(ShapeBounds(request)), rp, m, size, SCHEDULES)
        tables = tables_for(request, SCHEDULES)
        for j in range(p - 1):
            widest = max(len(st.devices) // rp for st in placed[j + 1 :])  # the later stages' most devices per pipeline
            left = tuple(d for d in range(request.cluster.num_devices) if all(d not in st.devices for st in placed[: j + 1]))
            width = len(placed[j].devices) // rp
            hop = tables.hop(placed[j].devices[0], placed[j].last, min(width, widest), left, size)
            for trip in (table.after, table.trip(widest), table.trip(widest) + hop):
                assert fill_bound(placed[: j + 1], m, name, k, p, float(trip[placed[j].last])) <= simulated * (1 + 1e-9)
            _, b2, w2, _, b3, w3 = drain_counts(name, p, m, k)[-1][3:]
            finish = float(table.top(widest, name == "zb-h1", b2 + b3, w2 + w3)[placed[j].last + 1])
            assert fill_bound(placed[: j + 1], m, name, k, p, 0.0, None, finish) <= simulated * (1 + 1e-9)
            checked += 1
    assert checked > 100


def test_fill_bound_counts_the_warm_up_and_drain_bubbles() -> None:
    """The first of three stages (F 1, B 2, no transfers) under 1f1b, m 8: three warm-up forwards, idle until the
    first gradient is back (at 1 + 6: F and B of the two stages above), B and F alternating to the last forward
    (at 22), idle again until its gradient is back (6 more), then the last B: 30, the simulated (m + p - 1)(F + B),
    where its compute alone gives 24."""
    stage = Placed(0, 0, (0,), fwd=1.0, bwd=2.0, inp=1.0, wgt=1.0, allreduce=0.0, static=0, act=0, memory=1, arrive=0.0)
    assert compute_bound(stage, 8) == 24.0
    assert fill_bound([stage], 8, "1f1b", 1, 3, rest=6.0) == 30.0
    assert fill_bound([stage], 8, "gpipe", 1, 3, rest=6.0) == 8.0 + 6.0 + 16.0  # all 8 forwards first, then 8 B


def test_filled_answers_from_its_memos_as_computed_afresh() -> None:
    """exact.filled without hop keeps its answers (and fill_bound's values, the fits, the table's terms) by what
    they read; on random first stages, every span of ends after them and two incumbents, one search that keeps them
    all answers as a new search (no memos yet) computes each one."""
    rng = random.Random(7)
    answers = []
    for trial in range(80):
        request, placed, rp, m, size, _, _, simulated = simulated_plan(rng, trial)
        if len(placed) < 2:
            continue
        tables = tables_for(request, SCHEDULES)
        devices = request.cluster.num_devices
        for scale in (0.6, 0.9):
            best = scale * simulated
            for j in range(len(placed) - 1):
                stages = placed[: j + 1]
                left = tuple(d for d in range(devices) if all(d not in st.devices for st in stages))
                table = tables.table((rp, m, size), left)
                for upto in range(stages[-1].last, request.profile.num_layers - 1):
                    kept = filled(tables, best, stages, m, table, left, rp, size, hop=False, upto=upto)
                    fresh = tables_for(request, SCHEDULES)  # no memos yet
                    assert kept == filled(fresh, best, stages, m, table, left, rp, size, hop=False, upto=upto)
                    answers.append(kept)
    assert 50 < sum(answers) < len(answers) - 50


UNSPLIT = tuple(schedule for schedule in SCHEDULES if schedule[0] != "zb-h1")


def test_filled_tells_twins_apart_by_what_they_differ_in() -> None:
    """Twins of a partial plan that differ only in what fill_bound reads of a lower stage (its chain down to stage
    0, read under a backward that sends the gradient down after its whole B: UNSPLIT) or in what fits reads (memory)
    get their own answers from one search that keeps its answers, as from a new one; and the twins do change
    answers."""
    rng = random.Random(11)
    changed = 0
    for trial in range(80):
        request, placed, rp, m, size, _, _, simulated = simulated_plan(rng, trial)
        if len(placed) < 3:
            continue
        tables, best = tables_for(request, UNSPLIT), 0.9 * simulated
        stages = placed[:2]
        left = tuple(d for d in range(request.cluster.num_devices) if all(d not in st.devices for st in stages))
        table = tables.table((rp, m, size), left)
        slow = [dataclasses.replace(stages[0], chain=stages[0].chain + simulated), stages[1]]
        cramped = [dataclasses.replace(st, memory=st.static) for st in stages]
        answers = []
        for twin in (stages, slow, cramped):
            kept = filled(tables, best, twin, m, table, left, rp, size, hop=False)
            assert kept == filled(tables_for(request, UNSPLIT), best, twin, m, table, left, rp, size, hop=False)
            answers.append(kept)
        changed += answers[1] != answers[0]
        assert answers[2]  # no schedule fits: nothing to beat the best with
    assert changed > 3
