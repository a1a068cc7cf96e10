"""exact's optimum with its shape pruning switched off, so that a test of planner.bound.shape_bounds against it is no circle."""

from __future__ import annotations

from unittest import mock

from pipeplan.planner.bound.shape_bounds import ShapeBounds
from pipeplan.planner.exact import plan_exact
from pipeplan.planner.request import PlanRequest


class Unpruned(ShapeBounds):
    """ShapeBounds whose terms are 0: exact then searches every shape whose weights fit."""

    def terms(self, rp: int, b: int) -> tuple[float, float, float]:
        """No pruning."""
        return 0.0, 0.0, 0.0

    def stages(self, rp: int, b: int) -> float:
        """No pruning."""
        return 0.0


def exact_ms(request: PlanRequest) -> float:
    """exact's optimum (ms) found without pruning shapes by the bound under test (exact's own suffix table, tested
    against simulation in test_exact_parts, still prunes)."""
    with mock.patch("pipeplan.planner.exact.search_tables.ShapeBounds", Unpruned):
        return plan_exact(request).iteration_time
