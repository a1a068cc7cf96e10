"""Saving through the API: plan and profile files, written whole or not at all."""

from __future__ import annotations

from pipeplan.api.arguments import given
from pipeplan.core.errors import PlanError, ProfileError
from pipeplan.core.plan import Plan
from pipeplan.core.profile import ModelProfile


def save_plan(plan: Plan, path: str, profile: str, cluster: str) -> None:
    """Write a plan file naming its profile and cluster (a file path, kept relative to the plan, or a built-in name).

    Raises:
        PlanError: `profile` or `cluster` is not a name or path (a value has none: save it first).
    """
    from pipeplan.io.plan_json import write_plan

    if not isinstance(plan, Plan):
        raise PlanError(f"plan must be a Plan, got {given(plan)}")
    for name, value in (("profile", profile), ("cluster", cluster)):
        if not isinstance(value, str) or not value:
            raise PlanError(f"{name} must be the file path or built-in name the plan file records, got {given(value)}")
    write_plan(plan, path, profile, cluster)


def save_profile(profile: ModelProfile, path: str) -> None:
    """Write a profile file (pipeplan.profile JSON), whole or not at all: what `--profile` reads.

    Raises:
        ProfileError: `profile` is not a ModelProfile.
    """
    from pipeplan.io.profile_json import write_profile_json

    if not isinstance(profile, ModelProfile):
        raise ProfileError(f"profile must be a ModelProfile (profile_model's), got {given(profile)}")
    write_profile_json(profile, path)
