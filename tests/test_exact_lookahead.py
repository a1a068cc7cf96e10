"""exact.lookahead: a span of stage ends is ruled out only when each of its ends is."""

from __future__ import annotations

import random

from pipeplan.planner.exact import SCHEDULES
from pipeplan.planner.exact.lookahead import hopeless, open_ends, span_stage
from pipeplan.planner.exact.search_tables import tables_for
from pipeplan.planner.request import PlanRequest
from planner_instances import random_cluster, random_profile


def test_a_span_of_stage_ends_is_ruled_out_only_when_each_end_is() -> None:
    """lookahead.span_stage on random instances, spans of stage ends and incumbents: whenever it rules a span out,
    lookahead.hopeless (no look-ahead) rules out every end in it alone; and open_ends keeps every end hopeless keeps."""
    rng = random.Random(41)
    spans = 0
    for trial in range(60):
        layers, devices = rng.randint(4, 9), rng.randint(3, 5)
        request = PlanRequest(random_profile(trial, layers), random_cluster(trial, devices), 16)
        tables = tables_for(request, SCHEDULES)
        m, size = rng.choice([(2, 8), (4, 4), (8, 2)])
        shape, free = (1, m, size), tuple(range(devices))
        tables.table(shape, free)
        first = tables.costs.place(0, 0, (0,), 1, size, None)
        rest = tuple(range(1, devices))
        tables.table(shape, rest)
        best = rng.uniform(0.5, 1.5) * first.arrive + rng.uniform(20.0, 200.0)
        for _ in range(5):
            low = rng.randint(1, layers - 2)
            high = rng.randint(low, layers - 2)
            r = 1
            alone = [hopeless(tables, best, [first], 1, e, r, rest, devices - 1, shape, look=0) for e in range(low, high + 1)]
            if span_stage(tables, best, [first], 1, (low, high), r, rest, devices - 1, shape) is None:
                spans += 1
                assert all(alone)
            kept = open_ends(tables, best, [first], 1, list(range(low, high + 1)), r, rest, devices - 1, shape)
            assert {e for e, out in zip(range(low, high + 1), alone, strict=True) if not out} <= {e for e, _ in kept}
    assert spans > 20
