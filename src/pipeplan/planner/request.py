"""What every planner takes and returns (PlanRequest, PlanResult), and the guard every registered planner runs under."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from pipeplan.core.checks import check_positive_int
from pipeplan.core.dag import stage_layers
from pipeplan.core.errors import PlanError
from pipeplan.core.hardware.cluster import Cluster
from pipeplan.core.limits import SAMPLES
from pipeplan.core.plan import Plan
from pipeplan.core.profile import ModelProfile
from pipeplan.planner.phase_clock import planning_run
from pipeplan.schedules.registry import PLANNABLE
from pipeplan.sim.cost.layers import static_bytes
from pipeplan.sim.cost.memory import GIB
from pipeplan.sim.cost.model import CostModel
from pipeplan.sim.cost.types import Costs
from pipeplan.sim.result import SimResult

SCHEDULE_CHOICES = ("auto", *PLANNABLE)
"""What a request may ask for: auto (the planner chooses) or one schedule a plan may run (schedules.registry)."""
SEQUENCE_PARALLEL_CHOICES = ("auto", "on", "off")
"""Sequence parallelism on a plan's tensor-parallel stages: the faster of on and off by the cost model (auto; off on
ties), always, or never."""
REPLICATION_CHOICES = ("any", "pipelines", "none")
"""What a plan may replicate: anything (stages over several devices, whole pipelines), only whole pipelines (every
stage on one device per pipeline replica: pipeline x data parallelism), or nothing (one pipeline, one device per
stage: a straight pipeline, devices beyond the stage count left idle)."""


@dataclass(frozen=True, slots=True)
class PlanRequest:
    """A planning problem: a model, a cluster and a global batch.

    `microbatch_size` None lets the planner choose; `schedule` "auto" lets it
    choose among all schedules, a name restricts it to that one.
    `optimizer` is the optimizer whose step is part of the iteration;
    `optimizer_factor` its state per parameter byte (None: the optimizer's
    own, 2 for Adam). `batch_scaling` says how layer times follow the
    microbatch size (sim.cost.layers). `model` is the request's cost model;
    `cluster` holds the speeds on the profile's scale (sim.cost.speeds).
    `replication` is one of REPLICATION_CHOICES; every planner honours it.
    `time_budget_s` bounds the planner run's wall time (planner.time_budget: pipeplan's search returns the best
    plan found when it runs out; None or 0: no limit, the default here; `plan` and `compare` default to
    time_budget.DEFAULT_TIME_BUDGET_S).
    `tensor_parallel` forces every stage's tensor-parallel degree t (None: the planner chooses among
    planner.plan_space.tensor_degrees); it must divide every split layer's width (heads, hidden size, vocabulary),
    and may exceed a server (the plan then notes the groups that span servers). `zero` forces the ZeRO stage 0, 1 or
    2 (None: the planner chooses); sharding needs a data-parallel group, so it is refused where no plan can have one.
    `sequence_parallel` (SEQUENCE_PARALLEL_CHOICES) says whether a stage with t > 1 runs sequence parallelism: auto,
    the faster by the cost model (off on ties), on or off. Only planners that search the 3D space honour them:
    pipeplan (on profiles with split layers) and megatron (t and zero; its grid has no sequence parallelism), and
    exact.
    """

    profile: ModelProfile
    cluster: Cluster
    global_batch: int
    microbatch_size: int | None = None
    schedule: str = "auto"
    optimizer_factor: float | None = None
    optimizer: str = "adam"
    batch_scaling: str = "auto"
    replication: str = "any"
    time_budget_s: float | None = None
    tensor_parallel: int | None = None
    zero: int | None = None
    sequence_parallel: str = "auto"
    model: CostModel = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_positive_int(PlanError, "global_batch", self.global_batch)
        SAMPLES.check(PlanError, "global_batch", self.global_batch)
        devices = self.cluster.num_devices
        if devices > 1 and not self.cluster.bandwidth_bytes_per_s.off_diagonal_max() > 0:
            raise PlanError(
                f"cluster {self.cluster.name!r} has {devices} devices and no link between any two (every bandwidth is 0): "
                "give the links' bandwidth_gb_per_s"
            )
        if self.microbatch_size is not None:
            check_positive_int(PlanError, "microbatch_size", self.microbatch_size)
            if self.global_batch % self.microbatch_size:
                raise PlanError(f"global_batch {self.global_batch} is not a multiple of microbatch_size {self.microbatch_size}")
        if self.schedule not in SCHEDULE_CHOICES:
            raise PlanError(f"schedule must be one of {', '.join(SCHEDULE_CHOICES)}, got {self.schedule!r}")
        if self.sequence_parallel not in SEQUENCE_PARALLEL_CHOICES:
            raise PlanError(
                f"sequence_parallel must be one of {', '.join(SEQUENCE_PARALLEL_CHOICES)}, got {self.sequence_parallel!r}"
            )
        if self.replication not in REPLICATION_CHOICES:
            raise PlanError(f"replication must be one of {', '.join(REPLICATION_CHOICES)}, got {self.replication!r}")
        budget = self.time_budget_s
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int | float) or not 0 <= budget < math.inf):
            raise PlanError(f"time_budget_s must be a finite number >= 0 (seconds; 0 or None: no limit), got {budget!r}")
        self._check_tensor()
        model = CostModel.build(self.profile, self.cluster, self.batch_scaling, self.optimizer, self.optimizer_factor)
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "cluster", model.cluster)
        object.__setattr__(self, "optimizer_factor", model.optimizer_factor)
        self._check_shared()

    def _check_tensor(self) -> None:
        """Refuse a forced tensor-parallel degree the profile or cluster cannot take, and sharding with no replica to
        shard over (one line each, naming the field, its value and the way out)."""
        t, zero = self.tensor_parallel, self.zero
        if t is not None:
            check_positive_int(PlanError, "tensor_parallel", t)
            split = [(i, layer) for i, layer in enumerate(self.profile.layers) if layer.tp is not None]
            if t > 1 and not split:
                raise PlanError(
                    f"tensor_parallel {t}: profile {self.profile.name!r} has no layer that splits over a tensor-parallel "
                    "group (no layer has a tp split); drop the tensor-parallel degree or use a profile with tp splits "
                    "(e.g. gpt:layers=..)"
                )
            for i, layer in split:
                assert layer.tp is not None
                if layer.tp.width % t:
                    widths = math.gcd(*(x.tp.width for _, x in split if x.tp is not None))
                    raise PlanError(
                        f"tensor_parallel {t} does not divide layer {i} ({layer.name!r}) tp width {layer.tp.width} "
                        f"(its {layer.tp.kind} split: heads, hidden size or vocabulary); give a divisor of {widths}"
                    )
            if t > self.cluster.num_devices:
                raise PlanError(
                    f"tensor_parallel {t} needs {t} devices per group, cluster {self.cluster.name!r} has "
                    f"{self.cluster.num_devices}; give at most {self.cluster.num_devices}"
                )
        if zero is not None:
            if isinstance(zero, bool) or zero not in (0, 1, 2):
                raise PlanError(f"zero must be 0 (none), 1 (optimizer state) or 2 (and gradients), got {zero!r}")
            group = t or 1
            if zero > 0 and (self.replication == "none" or self.global_batch < 2 or self.cluster.num_devices < 2 * group):
                why = (
                    "replication 'none' allows one copy of each stage"
                    if self.replication == "none"
                    else f"global batch {self.global_batch} cannot be split over copies"
                    if self.global_batch < 2
                    else f"{self.cluster.num_devices} devices leave room for one copy of a {group}-device stage"
                )
                raise PlanError(
                    f"zero {zero} shards state over a stage's data-parallel replicas, but no plan can have two: {why}; "
                    "give zero 0, or more devices or a larger global batch"
                )

    def _check_shared(self) -> None:
        """Refuse a shared parameter no device can hold: every stage holding one of its layers keeps a whole copy
        with its gradient and optimizer state, however the layers are split."""
        largest = max(d.memory_bytes for d in self.cluster.devices)
        for g in self.profile.shared_params:
            need = static_bytes(g.param_bytes, self.model.optimizer_factor, self.model.holding)
            if need > largest:
                raise PlanError(
                    f"no plan fits in memory: shared parameter {g.name!r} of {self.profile.name} ({g.param_bytes / GIB:.2f} "
                    f"GiB, held by layers {', '.join(map(str, g.layers))}) needs {need / GIB:.2f} GiB for its weights, "
                    f"gradients and {self.optimizer} state on every device holding a copy (one stage or several), but the "
                    f"largest device of {self.cluster.name} has {largest / GIB:.2f} GiB; try devices with more memory or "
                    "an optimizer with less state (--optimizer sgd)"
                )

    @property
    def stage_replicas_allowed(self) -> bool:
        """Whether a stage may run on several devices of one pipeline replica."""
        return self.replication == "any"

    @property
    def pipelines_allowed(self) -> bool:
        """Whether the pipeline may be replicated (data parallelism over whole pipelines)."""
        return self.replication != "none"

    def replication_violation(self, plan: Plan) -> str | None:
        """Why `plan` breaks the request's replication rule, or None when it keeps it."""
        if not self.pipelines_allowed and plan.pipeline_replicas > 1:
            return f"it runs {plan.pipeline_replicas} pipeline replicas"
        if not self.stage_replicas_allowed:
            wide = [s for s in range(len(plan.stages)) if plan.replicas_of(s) > 1]
            if wide:
                return f"stage {wide[0]} runs on {plan.replicas_of(wide[0])} devices per pipeline replica"
        return None


@dataclass(frozen=True, slots=True)
class PlanResult:
    """A planner's answer: the plan, its simulated iteration (with its timeline), its costs, memory per device and how
    long planning took: what `plan` prints and draws, without pricing or simulating the plan again."""

    plan: Plan
    planner: str
    sim: SimResult
    costs: Costs
    memory_per_device: tuple[float, ...]
    planning_seconds: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def iteration_time(self) -> float:
        """Simulated iteration time in ms."""
        return self.sim.iteration_time

    def to_json(self, profile_name: str, cluster_name: str, profile: ModelProfile | None = None) -> dict[str, Any]:
        """The `plan --json` object: the plan file's fields plus planner, iteration_time, memory_per_device and
        planning_seconds (`profile` names a DAG plan's stage layers; with shared parameters, `shared_parameters`;
        with the planner's phases timed, `planning`: seconds, CPU seconds and peak memory per phase)."""
        from pipeplan.io.plan_json import plan_to_json

        obj = plan_to_json(self.plan, profile_name, cluster_name, profile)
        obj.update(
            planner=self.planner,
            iteration_time=self.iteration_time,
            memory_per_device=list(self.memory_per_device),
            planning_seconds=self.planning_seconds,
        )
        if "planning" in self.extra:
            obj["planning"] = self.extra["planning"]
        if "tensor" in self.extra:  # pipeplan's 3D search (planner.search.tensor_grid): what it chose and why
            obj["tensor_search"] = {**self.extra["tensor"], "flat_ms": self.extra.get("flat_ms"),
                                    "flat_searched": self.extra.get("flat_searched")}  # fmt: skip
            obj["notes"] = list(self.extra.get("notes", []))
        if profile is not None and profile.shared_params:
            obj["shared_parameters"] = shared_json(self.plan, profile, self.costs)
        return obj


def shared_json(plan: Plan, profile: ModelProfile, costs: Costs) -> list[dict[str, Any]]:
    """Each shared parameter of `profile` under `plan`: its layers and bytes, the stages holding a copy and the time
    of its gradient exchange (0 when one stage holds all its layers)."""
    owner = {u: s for s, layers in enumerate(stage_layers(plan)) for u in layers}
    split = {x.name: x for x in costs.shared}
    out = []
    for g in profile.shared_params:
        x = split.get(g.name)
        out.append(
            {
                "name": g.name,
                "layers": list(g.layers),
                "param_bytes": int(g.param_bytes) if g.param_bytes.is_integer() else g.param_bytes,
                "stages": sorted({owner[u] for u in g.layers}),
                "exchange_ms": 0.0 if x is None else x.exchange_ms,
                "exchange_devices": 0 if x is None else x.devices,
            }
        )
    return out


Progress = Callable[[str, float], None]
"""Called with (message, fraction of the current phase) while a planner works."""

Planner = Callable[..., PlanResult]
"""A planner: planner(request, progress=None) -> PlanResult (planner.planners holds them by name); pipeplan's also
takes baselines= (planner.compare)."""


def guarded(name: str, fn: Callable[..., PlanResult]) -> Planner:
    """`fn` as a registered planner: under numpy's errstate that lets a missing link (bandwidth 0) divide to inf
    without a warning (an infinite transfer time is the cost model's answer for "no path", not a fault), and with its
    plan checked against the request's replication rule (every planner filters its candidates; this is the net under
    them). Keyword options (pipeplan's `baselines`) pass through to `fn`. The outermost planner call times its
    phases (planner.phase_clock) into the result's extra["planning"] under the request's time budget
    (planner.time_budget); a planner called inside it (a seed) counts as its phase "seeds".

    Raises:
        PlanError: the planner's plan breaks the request's replication rule.
    """

    @functools.wraps(fn)
    def planner(request: PlanRequest, progress: Progress | None = None, **options: Any) -> PlanResult:
        with planning_run(time_budget_s=request.time_budget_s) as clock, np.errstate(divide="ignore", invalid="ignore"):
            result = fn(request, progress, **options)
        broken = request.replication_violation(result.plan)
        if broken is not None:
            raise PlanError(f"planner {name!r} returned a plan against replication {request.replication!r}: {broken}")
        if clock is not None:  # the outermost planner: its phases (phase_clock) for plan --json's "planning"
            result = replace(result, extra={**result.extra, "planning": clock.to_json()})
        return result

    return planner
