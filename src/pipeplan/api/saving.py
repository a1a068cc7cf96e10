"""Saving through the API: plan and profile files, written whole or not at all."""

from __future__ import annotations

from pipeplan.api.arguments import PLAN, Instance, Output, Text, check
from pipeplan.core.errors import PlanError, ProfileError
from pipeplan.core.plan import Plan
from pipeplan.core.profile import ModelProfile
from pipeplan.io import file_kinds


def save_plan(plan: Plan, path: str, profile: str, cluster: str) -> None:
    """Write a plan file naming its profile and cluster (a file path, kept relative to the plan, or a built-in name).

    Raises:
        PlanError: naming `plan`, `path`, `profile` or `cluster` and the value (a path that cannot be written: a
            folder that does not exist, a folder or device at it), before anything is written.
    """
    from pipeplan.io.plan_json import write_plan

    named = Text("the file path or built-in name the plan file records (a value has none: save it first)")
    check(PlanError, {"plan": (plan, PLAN), "path": (path, Output(file_kinds.PLAN)), "profile": (profile, named),
                      "cluster": (cluster, named)})  # fmt: skip
    write_plan(plan, path, profile, cluster)


def save_profile(profile: ModelProfile, path: str) -> None:
    """Write a profile file (pipeplan.profile/2 JSON), whole or not at all: what `--profile` reads.

    Raises:
        ProfileError: `profile` is not a ModelProfile, or `path` cannot be written (as save_plan's).
    """
    from pipeplan.io.profile_json import write_profile_json

    check(ProfileError, {"profile": (profile, Instance((ModelProfile,), "a ModelProfile (profile_model's)")),
                         "path": (path, Output(file_kinds.PROFILE))})  # fmt: skip
    write_profile_json(profile, path)
