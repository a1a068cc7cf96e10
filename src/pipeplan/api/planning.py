"""Planning through the API: the request every planner takes, one planner's plan, and every planner compared."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeplan.api.arguments import (
    PROGRESS,
    Choice,
    Instance,
    Integer,
    Number,
    check,
    check_sources,
    cost_arguments,
    load_cluster,
    load_profile,
)
from pipeplan.core.cluster import Cluster
from pipeplan.core.errors import PlanError, ProfileError
from pipeplan.core.profile import ModelProfile

if TYPE_CHECKING:
    from pipeplan.planner.compare import Row
    from pipeplan.planner.request import PlanRequest, PlanResult

Progress = Callable[[str, float], None]


def plan_request(
    profile: ModelProfile | str,
    cluster: Cluster | str,
    global_batch: int,
    *,
    microbatch_size: int | None = None,
    schedule: str = "auto",
    batch_scaling: str = "auto",
    optimizer: str = "adam",
    optimizer_factor: float | None = None,
    replication: str = "any",
) -> PlanRequest:
    """The planning problem every planner takes: model, cluster, global batch and the options of `pipeplan plan`.

    Raises:
        PlanError, ProfileError, ClusterError: naming the bad argument and its value.
    """
    from pipeplan.core.limits import OPTIMIZER_FACTOR, SAMPLES
    from pipeplan.planner.request import REPLICATION_CHOICES, SCHEDULE_CHOICES, PlanRequest

    check_sources(profile, cluster)
    check(PlanError, {"global_batch": (global_batch, Integer(1, SAMPLES)),
                      "microbatch_size": (microbatch_size, Integer(1, SAMPLES, optional=True)),
                      "schedule": (schedule, Choice(SCHEDULE_CHOICES))})  # fmt: skip
    check(ProfileError, cost_arguments(batch_scaling, optimizer))
    check(PlanError, {"optimizer_factor": (optimizer_factor, Number(0.0, limit=OPTIMIZER_FACTOR, optional=True)),
                      "replication": (replication, Choice(REPLICATION_CHOICES))})  # fmt: skip
    return PlanRequest(load_profile(profile), load_cluster(cluster), global_batch, microbatch_size, schedule,
                       optimizer=optimizer, batch_scaling=batch_scaling, optimizer_factor=optimizer_factor,
                       replication=replication)  # fmt: skip


def run_planner(planner: str, request: PlanRequest, progress: Progress | None = None) -> PlanResult:
    """Run planner `planner` (pipeplan, dapple, pipedream, balanced, exact) on `request`.

    Raises:
        PlanError: naming an unknown planner, or why no plan fits.
    """
    from pipeplan.planner import registry
    from pipeplan.planner.request import PlanRequest

    check(PlanError, {"planner": (planner, Choice(tuple(sorted(registry.PLANNERS)))),
                      "request": (request, Instance((PlanRequest,), "a PlanRequest (plan_request's)")),
                      "progress": (progress, PROGRESS)})  # fmt: skip
    return registry.run_planner(planner, request, progress)


def plan(
    profile: ModelProfile | str,
    cluster: Cluster | str,
    global_batch: int,
    *,
    planner: str = "pipeplan",
    progress: Progress | None = None,
    **options: Any,
) -> PlanResult:
    """The fastest plan that fits: stages, devices, replicas, microbatches and schedule (`pipeplan plan`).

    `options` are plan_request's (microbatch_size, schedule, batch_scaling, optimizer, optimizer_factor,
    replication). The result holds `.plan`, `.iteration_time` (ms), `.memory_per_device` and `.sim`.

    Raises:
        PlanError, ProfileError, ClusterError: naming the bad argument and its value, or why no plan fits.
    """
    from pipeplan.planner import registry

    check(PlanError, {"planner": (planner, Choice(tuple(sorted(registry.PLANNERS)))), "progress": (progress, PROGRESS)})
    _check_option_names(options)
    return run_planner(planner, plan_request(profile, cluster, global_batch, **options), progress)


def _check_option_names(options: dict[str, Any]) -> None:
    """plan's and compare's `options` are plan_request's keyword arguments.

    Raises:
        PlanError: naming the first unknown option.
    """
    import inspect

    known = [n for n, p in inspect.signature(plan_request).parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    for name in options:
        if name not in known:
            raise PlanError(f"unknown option {name!r}; the options are {', '.join(known)}")


@dataclass(frozen=True)
class PlannerComparison:
    """Every planner's row on one request (a PlanResult, or a PlannerFailure with its reason), all simulated alike."""

    request: PlanRequest
    rows: list[Row]

    @property
    def best(self) -> PlanResult | None:
        """The fastest plan found, or None when no planner found one."""
        from pipeplan.planner.compare import best_row

        return best_row(self.rows)


def compare(
    profile: ModelProfile | str,
    cluster: Cluster | str,
    global_batch: int,
    *,
    planners: Sequence[str] | None = None,
    progress: Progress | None = None,
    **options: Any,
) -> PlannerComparison:
    """Run several planners (all registered when `planners` is None) on one problem (`pipeplan compare`).

    Raises:
        PlanError: naming an unknown or repeated planner, or a bad option.
    """
    from pipeplan.planner.compare import compare as compare_planners
    from pipeplan.planner.compare import planner_names

    if planners is not None and (not isinstance(planners, list | tuple) or not all(isinstance(p, str) for p in planners)):
        raise PlanError(f"planners must be a list of planner names, got {planners!r}")
    check(PlanError, {"progress": (progress, PROGRESS)})
    _check_option_names(options)
    try:
        names = planner_names(list(planners) if planners is not None else None)
    except PlanError as exc:
        raise PlanError(f"planners {list(planners or [])!r}: {exc}") from None
    request = plan_request(profile, cluster, global_batch, **options)
    return PlannerComparison(request, list(compare_planners(request, names, progress)))
