"""Pure values of pipeplan: profiles, clusters, plans, schedules and their errors.

`Cluster` and `Device` load on first use (their link matrices need numpy), so importing an error class, as every
command's startup does, stays light.
"""

from typing import Any

from pipeplan.core.errors import (
    ClusterError,
    CostError,
    DeadlockError,
    PipeplanError,
    PlanError,
    ProfileError,
    ScheduleError,
)
from pipeplan.core.plan import Plan, Stage
from pipeplan.core.profile import LayerProfile, ModelProfile
from pipeplan.core.schedule import OPS, Action, Schedule
from pipeplan.core.validate import validate

__all__ = [
    "OPS",
    "Action",
    "Cluster",
    "ClusterError",
    "CostError",
    "DeadlockError",
    "Device",
    "LayerProfile",
    "ModelProfile",
    "PipeplanError",
    "Plan",
    "PlanError",
    "ProfileError",
    "Schedule",
    "ScheduleError",
    "Stage",
    "validate",
]


def __getattr__(name: str) -> Any:
    if name in ("Cluster", "Device"):
        from pipeplan.core.hardware import cluster

        return getattr(cluster, name)
    raise AttributeError(f"module 'pipeplan.core' has no attribute {name!r}")
