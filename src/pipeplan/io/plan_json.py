"""Plan files: the Plan fields plus profile and cluster names, no timings, deterministic bytes."""

from __future__ import annotations

import json
import os
from typing import Any

from pipeplan.core.errors import PipeplanError, PlanError
from pipeplan.core.plan import Plan, Stage
from pipeplan.core.schedule import Action
from pipeplan.io.files import something_at
from pipeplan.io.json_fields import Fields, load_json_file

PLAN_FORMAT = "pipeplan.plan/1"
"""Value of the "format" key of a plan JSON file."""

PLAN_KEYS = (
    "format",
    "profile",
    "cluster",
    "stages",
    "pipeline_replicas",
    "microbatches",
    "microbatch_size",
    "schedule",
    "k",
    "chunks",
    "order",
)
STAGE_KEYS = ("first_layer", "last_layer", "devices")


def plan_to_json(plan: Plan, profile_name: str, cluster_name: str) -> dict[str, Any]:
    """The JSON object of a plan: its fields, the profile and cluster names; `order` null unless `list`."""
    return {
        "format": PLAN_FORMAT,
        "profile": profile_name,
        "cluster": cluster_name,
        "stages": [{"first_layer": s.first_layer, "last_layer": s.last_layer, "devices": list(s.devices)} for s in plan.stages],
        "pipeline_replicas": plan.pipeline_replicas,
        "microbatches": plan.microbatches,
        "microbatch_size": plan.microbatch_size,
        "schedule": plan.schedule,
        "k": plan.k,
        "chunks": plan.chunks,
        "order": None if plan.order is None else [[str(a) for a in rank] for rank in plan.order],
    }


def plan_dumps(plan: Plan, profile_name: str, cluster_name: str) -> str:
    """The plan file's text: sorted keys, two-space indentation, a final newline."""
    return json.dumps(plan_to_json(plan, profile_name, cluster_name), indent=2, sort_keys=True) + "\n"


def write_plan(plan: Plan, path: str | os.PathLike[str], profile_name: str, cluster_name: str) -> None:
    """Write a plan file (whole or not at all); the same plan gives the same bytes.

    A profile or cluster given as a file path is recorded relative to the plan
    file's folder (read_plan resolves it from there), a built-in name as it is.
    """
    from pipeplan.io.atomic import write_text_atomic

    folder = os.path.dirname(os.path.abspath(path))
    names = [os.path.relpath(os.path.abspath(n), folder) if os.path.isfile(n) else n for n in (profile_name, cluster_name)]
    write_text_atomic(path, plan_dumps(plan, names[0], names[1]))


def _stage(obj: object, where: str) -> Stage:
    """One stage object."""
    fields = Fields(obj, where, PlanError)
    fields.check_keys(STAGE_KEYS)
    devices = fields.array("devices", 1)
    for i, d in enumerate(devices):
        if isinstance(d, bool) or not isinstance(d, int) or d < 0:
            raise PlanError(f"{where}: devices[{i}] must be a device id >= 0, got {d!r}")
    return Stage(fields.integer("first_layer", 0), fields.integer("last_layer", 0), tuple(devices))


def _order(value: object, where: str) -> tuple[tuple[Action, ...], ...] | None:
    """The per-rank order: null, or a list of lists of action strings such as '2F0'."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(rank, list) for rank in value):
        raise PlanError(f"{where}: field 'order' must be null or a list of lists of actions, got {type(value).__name__}")
    ranks = []
    for r, rank in enumerate(value):
        actions = []
        for i, cell in enumerate(rank):
            if not isinstance(cell, str):
                raise PlanError(f"{where}: order[{r}][{i}] must be an action string such as '2F0', got {cell!r}")
            try:
                actions.append(Action.parse(cell))
            except PipeplanError:
                raise PlanError(f"{where}: order[{r}][{i}] is not an action (e.g. '2F0'): {cell!r}") from None
        ranks.append(tuple(actions))
    return tuple(ranks)


def plan_from_json(obj: object, source: str = "<plan>") -> tuple[Plan, dict[str, str]]:
    """Build a Plan from a plan JSON object.

    Returns:
        (plan, meta) where meta holds the "profile" and "cluster" names.

    Raises:
        PlanError: naming the source, the field and the bad value.
    """
    fields = Fields(obj, source, PlanError)
    fields.check_keys(PLAN_KEYS)
    fmt = fields.string("format")
    if fmt != PLAN_FORMAT:
        raise PlanError(f"{source}: field 'format' must be {PLAN_FORMAT!r}, got {fmt!r}")
    stages = tuple(_stage(s, f"{source}: stages[{i}]") for i, s in enumerate(fields.array("stages", 1)))
    meta = {"profile": fields.string("profile"), "cluster": fields.string("cluster")}
    try:
        plan = Plan(
            stages=stages,
            pipeline_replicas=fields.integer("pipeline_replicas", 1),
            microbatches=fields.integer("microbatches", 1),
            microbatch_size=fields.integer("microbatch_size", 1),
            schedule=fields.string("schedule"),
            k=fields.integer("k", 1),
            chunks=fields.integer("chunks", 1),
            order=_order(fields.raw("order"), source),
        )
    except PlanError as exc:
        if str(exc).startswith(source):
            raise
        raise PlanError(f"{source}: {exc}") from None
    return plan, meta


def read_plan(path: str | os.PathLike[str]) -> tuple[Plan, dict[str, str]]:
    """Read a plan file; returns (plan, {"profile": name, "cluster": name}).

    A recorded relative file path is resolved against the plan file's folder
    (as write_plan records it), else against the working folder (older plan
    files); anything else is a built-in name, returned as it is.

    Raises:
        PlanError: unreadable file, invalid JSON, or a bad field (naming file, field and value).
    """
    source = os.fspath(path)
    plan, meta = plan_from_json(load_json_file(source, PlanError, "plan"), source)
    folder = os.path.dirname(os.path.abspath(source))
    for key, name in meta.items():
        beside = os.path.join(folder, name)
        if not os.path.isabs(name) and something_at(beside):  # whatever stands there is read (and its kind reported)
            meta[key] = os.path.normpath(beside)
    return plan, meta
