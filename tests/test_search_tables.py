"""exact.search_tables: one suffix table per shape and set of free devices (or per shape), kept; frozen tables."""

from __future__ import annotations

import dataclasses
import random

import pytest

from pipeplan.planner.bound.best_rings import Rings
from pipeplan.planner.bound.shape_bounds import ShapeBounds
from pipeplan.planner.exact import SCHEDULES
from pipeplan.planner.exact.search_tables import tables_for
from pipeplan.planner.request import PlanRequest
from planner_instances import random_cluster, random_profile


def test_a_table_is_built_once_per_shape_and_ring_signature() -> None:
    """With distinct devices (narrow) each set of free devices gets the table of its best rings, built once per ring
    signature; with twins (not narrow) one table per shape serves every set."""
    rng = random.Random(3)
    for trial in range(10):
        devices = rng.randint(3, 5)
        request = PlanRequest(random_profile(trial, 5), random_cluster(trial, devices), 16)
        narrow = tables_for(request, SCHEDULES, tuple(range(devices)))
        wide = tables_for(request, SCHEDULES, (0,) * devices)
        assert narrow.narrow and not wide.narrow
        shape = (1, 4, 4)
        sets = [tuple(range(devices)), tuple(range(1, devices)), tuple(range(devices - 1))]
        for free in sets:
            table = narrow.table(shape, free)
            assert narrow.table(shape, free) is table
            signature = Rings(ShapeBounds(request), free).signature()
            assert narrow.suffixes[shape, signature] is table
            assert wide.table(shape, free) is wide.table(shape, sets[0])
        assert len(wide.suffixes) == 1


def test_tables_are_frozen_and_filled_starts_with_the_schedules_order() -> None:
    """The search cannot swap a table out; filled's first schedule order is the search's."""
    request = PlanRequest(random_profile(1, 4), random_cluster(1, 3), 16)
    tables = tables_for(request, SCHEDULES)
    with pytest.raises(dataclasses.FrozenInstanceError):
        tables.layers = 3  # type: ignore[misc]
    assert tables.memos.lead == SCHEDULES and tables.layers == 4
