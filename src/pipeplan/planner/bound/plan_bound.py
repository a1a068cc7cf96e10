"""The proven lower bound a plan is measured against: the bound of its plan's class (`plan --bound`, `compare --bound`).

Three bounds hold for a request (planner.bound.shape_bounds's and planner.bound.tensor_bound's docstrings give each
term's argument):

- every plan: `lower_bound(request)`, for every plan with tp 1 and no sharding the simulator scores (interleaved and
  chunked `list` plans, any layer order of a DAG profile);
- one stage per rank: `stage_bound_over_orders(request)`, for plans whose ranks each run one stage contiguous in
  the profile's layer order or in one of the DAG orders pipeplan's search plans on (planner.bound.over_orders); it adds
  the stage DP's term, so it is the tighter of the two where it applies;
- every plan, tensor-parallel and sharded included: `tensor_lower_bound(request)`, the loosest (compute and path
  only), the class of a plan with a stage of tp > 1 or zero > 0.

A plan's class is the third when it has tensor parallelism or sharding, the second when it has one chunk per rank and
its layer order is one of those orders, else the first. Its gap is its time over its class's bound: 1.0 would prove
it optimal; a gap of 1.08 says no plan of its class is more than 8 % faster (benchmarks/bound_gap.py reports this over
the planner-quality instances).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipeplan.core.plan import Plan
from pipeplan.planner.bound.over_orders import search_orders, stage_bound_over_orders
from pipeplan.planner.bound.shape_bounds import LowerBound, lower_bound
from pipeplan.planner.bound.tensor_bound import tensor_lower_bound
from pipeplan.planner.request import PlanRequest

EVERY_PLAN = "every plan"
ONE_STAGE = "plans of one stage per rank"
EVERY_3D = "every plan, tensor-parallel and sharded included"
"""The class a plan with tensor parallelism or ZeRO is measured against: planner.bound.tensor_bound's bound, looser
than the every-plan bound (which prices a stage's layers whole on each device, so covers t = 1 plans without
sharding only)."""


@dataclass(frozen=True, slots=True)
class PlanBound:
    """A plan's time against its class's proven lower bound."""

    plan_ms: float
    bound: LowerBound
    of: str  # EVERY_PLAN, ONE_STAGE or EVERY_3D: the plans the bound holds for

    @property
    def gap(self) -> float:
        """The plan's time over the bound (>= 1 up to rounding: the bound holds for the plan)."""
        return self.plan_ms / self.bound.ms

    def to_json(self) -> dict[str, Any]:
        """The bound, the plans it holds for, where it binds and the gap (`--json` with `--bound`)."""
        return {
            "ms": self.bound.ms,
            "holds_for": self.of,
            "term": self.bound.term,
            "pipelines": self.bound.pipelines,
            "microbatch_size": self.bound.microbatch_size,
            "gap": self.gap,
        }


@dataclass(slots=True)
class Bounds:
    """Both bounds of one request, each computed at most once (a `compare` asks for several plans)."""

    request: PlanRequest
    _every: LowerBound | None = field(default=None, init=False)
    _stages: LowerBound | None = field(default=None, init=False)
    _tensor: LowerBound | None = field(default=None, init=False)
    _orders: list[tuple[int, ...] | None] | None = field(default=None, init=False)

    def one_stage_class(self, plan: Plan) -> bool:
        """Whether the one-stage-per-rank bound holds for `plan`: one chunk per rank, a layer order pipeplan searches."""
        if plan.chunks != 1:
            return False
        if self._orders is None:
            self._orders = search_orders(self.request)
        return plan.layer_order in self._orders

    def every_plan(self) -> LowerBound:
        """The bound over every plan the simulator scores."""
        if self._every is None:
            self._every = lower_bound(self.request)
        return self._every

    def one_stage(self) -> LowerBound:
        """The bound over one-stage-per-rank plans in pipeplan's layer orders."""
        if self._stages is None:
            self._stages = stage_bound_over_orders(self.request)
        return self._stages

    def every_3d_plan(self) -> LowerBound:
        """The bound over every plan, tensor-parallel and sharded included."""
        if self._tensor is None:
            self._tensor = tensor_lower_bound(self.request)
        return self._tensor

    def of(self, plan: Plan, plan_ms: float) -> PlanBound:
        """`plan` (simulated at `plan_ms`) against the bound of its class (EVERY_3D for a plan with tensor
        parallelism or sharding)."""
        if plan.zero or any(s.tp > 1 for s in plan.stages):
            return PlanBound(plan_ms, self.every_3d_plan(), EVERY_3D)
        if self.one_stage_class(plan):
            return PlanBound(plan_ms, self.one_stage(), ONE_STAGE)
        return PlanBound(plan_ms, self.every_plan(), EVERY_PLAN)
