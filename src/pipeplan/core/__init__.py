"""Pure values of pipeplan: profiles, clusters, plans, schedules and their errors."""

from pipeplan.core.cluster import Cluster, Device
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
