"""Plan files: the Plan fields plus profile and cluster names, no timings, deterministic bytes."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from pipeplan.core.dag import order_from_stages, stage_layers
from pipeplan.core.errors import PipeplanError, PlanError
from pipeplan.core.limits import MAX_BYTES
from pipeplan.core.plan import AdaptiveSetting, Plan, Stage
from pipeplan.core.profile import ModelProfile
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
    "adaptive",
    "zero",
)
ADAPTIVE_KEYS = ("k", "k_choices", "memory_budget_bytes")
"""The optional "adaptive" block of a kfkb plan: the first iteration's k (the plan's "k"), the k a run may pick, the
memory budget (core.plan.AdaptiveSetting)."""
STAGE_KEYS = ("first_layer", "last_layer", "devices", "layers", "tp", "sequence_parallel")

ProfileFor = ModelProfile | Callable[[str], ModelProfile] | None
"""What a plan reader places a DAG plan's named layers with: the profile, or a function from the plan's recorded
profile name to the profile (called only when the stages name their layers)."""


def plan_to_json(plan: Plan, profile_name: str, cluster_name: str, profile: ModelProfile | None = None) -> dict[str, Any]:
    """The JSON object of a plan: its fields, the profile and cluster names; `order` null unless `list`.

    A plan with a layer order (core.dag) also lists each stage's `layers` by
    name, which needs `profile`; a plan without one is written as before. A plan with an adaptive setting adds
    "adaptive": {"k", "k_choices", "memory_budget_bytes"}; one without is written as before. A tensor-parallel
    stage adds "tp" (and "sequence_parallel": true), a plan that shards state "zero"; at their defaults (tp 1, no
    sequence parallelism, zero 0) they are left out, so every other plan is written as before.

    Raises:
        PlanError: the plan has a layer order and no profile is given, or the profile's layer count differs.
    """
    obj: dict[str, Any] = {
        "format": PLAN_FORMAT,
        "profile": profile_name,
        "cluster": cluster_name,
        "stages": _stages_to_json(plan, profile),
        "pipeline_replicas": plan.pipeline_replicas,
        "microbatches": plan.microbatches,
        "microbatch_size": plan.microbatch_size,
        "schedule": plan.schedule,
        "k": plan.k,
        "chunks": plan.chunks,
        "order": None if plan.order is None else [[str(a) for a in rank] for rank in plan.order],
    }
    if plan.adaptive is not None:
        budget = plan.adaptive.memory_budget_bytes
        obj["adaptive"] = {
            "k": plan.k,
            "k_choices": list(plan.adaptive.k_choices),
            "memory_budget_bytes": int(budget) if float(budget).is_integer() else budget,
        }
    if plan.zero:
        obj["zero"] = plan.zero
    return obj


def _stages_to_json(plan: Plan, profile: ModelProfile | None) -> list[dict[str, Any]]:
    """The stage objects; with a layer order each names its layers (in the order the stage runs them)."""
    stages = [{"first_layer": s.first_layer, "last_layer": s.last_layer, "devices": list(s.devices)} for s in plan.stages]
    for obj, stage in zip(stages, plan.stages, strict=True):
        if stage.tp > 1:
            obj["tp"] = stage.tp
        if stage.sequence_parallel:
            obj["sequence_parallel"] = True
    if plan.layer_order is None:
        return stages
    if profile is None or profile.num_layers != plan.num_layers:
        got = "no profile" if profile is None else f"profile {profile.name!r} with {profile.num_layers} layers"
        raise PlanError(
            f"a plan with a layer order names its stages' layers: it needs its {plan.num_layers}-layer profile, got {got}"
        )
    for stage, layers in zip(stages, stage_layers(plan), strict=True):
        stage["layers"] = [profile.layers[v].name for v in layers]
    return stages


def plan_dumps(plan: Plan, profile_name: str, cluster_name: str, profile: ModelProfile | None = None) -> str:
    """The plan file's text: sorted keys, two-space indentation, a final newline."""
    return json.dumps(plan_to_json(plan, profile_name, cluster_name, profile), indent=2, sort_keys=True) + "\n"


def write_plan(
    plan: Plan, path: str | os.PathLike[str], profile_name: str, cluster_name: str, profile: ModelProfile | None = None
) -> None:
    """Write a plan file (whole or not at all); the same plan gives the same bytes.

    A profile or cluster given as a file path is recorded relative to the plan
    file's folder (read_plan resolves it from there), a built-in name as it is.
    """
    from pipeplan.io.atomic import write_text_atomic
    from pipeplan.io.file_kinds import PLAN

    folder = os.path.dirname(os.path.abspath(path))
    names = [os.path.relpath(os.path.abspath(n), folder) if os.path.isfile(n) else n for n in (profile_name, cluster_name)]
    write_text_atomic(path, plan_dumps(plan, names[0], names[1], profile), PLAN)


def _stage(obj: object, where: str) -> tuple[Stage, list[str] | None]:
    """One stage object, and the names of its layers when it lists them."""
    fields = Fields(obj, where, PlanError)
    fields.check_keys(STAGE_KEYS)
    devices = fields.array("devices", 1)
    for i, d in enumerate(devices):
        if isinstance(d, bool) or not isinstance(d, int) or d < 0:
            raise PlanError(f"{where}: devices[{i}] must be a device id >= 0, got {d!r}")
    names = None
    if fields.has("layers"):
        names = fields.array("layers", 1)
        for i, name in enumerate(names):
            if not isinstance(name, str) or not name:
                raise PlanError(f"{where}: layers[{i}] must be a layer name, got {name!r}")
    first, last, tp = fields.integer("first_layer", 0), fields.integer("last_layer", 0), fields.integer("tp", 1, 1)
    sequence_parallel = fields.boolean("sequence_parallel", False)
    if tp == 1 and not sequence_parallel:
        return Stage(first, last, tuple(devices)), names
    try:
        return Stage(first, last, tuple(devices), tp, sequence_parallel), names
    except PlanError as exc:
        raise PlanError(f"{where}: {exc}") from None


def _layer_order(
    names: list[list[str] | None], stages: tuple[Stage, ...], profile: ModelProfile, source: str
) -> tuple[int, ...] | None:
    """The layer order the stages' named layers give (core.dag.order_from_stages), checked against their positions."""
    if all(n is None for n in names):
        return None
    if any(n is None for n in names):
        s = names.index(None)
        raise PlanError(f"{source}: stages[{s}] has no field 'layers' but other stages do (give it for every stage or none)")
    index: dict[str, int] = {}
    for v, layer in enumerate(profile.layers):
        index[layer.name] = -1 if layer.name in index else v
    sets = []
    for s, stage_names in enumerate(names):
        members = []
        for name in stage_names or ():
            v = index.get(name)
            if v is None or v < 0:
                why = "has no layer" if v is None else "has two layers"
                raise PlanError(f"{source}: stage {s} lists layer {name!r}, but profile {profile.name!r} {why} of that name")
            members.append(v)
        if len(set(members)) != len(members):
            twice = next(n for n in stage_names or () if (stage_names or []).count(n) > 1)
            raise PlanError(f"{source}: stage {s} lists layer {twice!r} twice")
        sets.append(members)
    try:
        order = order_from_stages(profile, sets)
    except PlanError as exc:
        raise PlanError(f"{source}: {exc}") from None
    first = 0
    for s, (stage, members) in enumerate(zip(stages, sets, strict=True)):
        if (stage.first_layer, stage.last_layer) != (first, first + len(members) - 1):
            raise PlanError(
                f"{source}: stage {s} lists {len(members)} layers, so it spans positions {first}..{first + len(members) - 1} "
                f"of the layer order, but its first_layer..last_layer say {stage.first_layer}..{stage.last_layer}"
            )
        first += len(members)
    return order


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


def _adaptive(value: object, source: str, k: int) -> AdaptiveSetting | None:
    """The "adaptive" block (absent or null: None): its fields checked, and its "k" the plan's own k (the start).

    Raises:
        PlanError: naming the source, the field (adaptive.k, adaptive.k_choices, adaptive.memory_budget_bytes) and
            the value.
    """
    if value is None:
        return None
    fields = Fields(value, f"{source}: adaptive", PlanError)
    fields.check_keys(ADAPTIVE_KEYS)
    start = fields.integer("k", 1)
    choices = fields.array("k_choices", 1)
    for i, c in enumerate(choices):
        if isinstance(c, bool) or not isinstance(c, int) or c < 1:
            raise PlanError(f"{source}: adaptive.k_choices[{i}] must be an integer >= 1, got {c!r}")
    budget = fields.number("memory_budget_bytes", positive=True, limits=(MAX_BYTES,))
    if start != k:
        raise PlanError(
            f"{source}: adaptive.k {start} contradicts the plan's k {k} (the adaptive block's k is the plan's starting "
            "k): make them equal"
        )
    if start not in choices:
        raise PlanError(f"{source}: adaptive.k {start} is not among adaptive.k_choices {choices}: add it, or start at one")
    try:
        return AdaptiveSetting(tuple(choices), budget)
    except PlanError as exc:
        raise PlanError(f"{source}: {exc}") from None


def _names(fields: Fields) -> dict[str, str]:
    """The plan object's keys and format checked; its "profile" and "cluster" names."""
    fields.check_keys(PLAN_KEYS)
    fmt = fields.string("format")
    if fmt != PLAN_FORMAT:
        raise PlanError(f"{fields.where}: field 'format' must be {PLAN_FORMAT!r}, got {fmt!r}")
    return {"profile": fields.string("profile"), "cluster": fields.string("cluster")}


def plan_from_json(
    obj: object, source: str = "<plan>", profile: ProfileFor = None, profile_name: str | None = None
) -> tuple[Plan, dict[str, str]]:
    """Build a Plan from a plan JSON object.

    Stages that list their `layers` (a DAG plan) are placed with `profile`
    (or `profile(name)`, `name` the `profile_name` given, else the one the
    plan records); the order is core.dag.order_from_stages of those sets.

    Returns:
        (plan, meta) where meta holds the "profile" and "cluster" names.

    Raises:
        PlanError: naming the source, the field and the bad value; for named layers the stage and the layer (overlap,
            a layer in no stage, a stage not closed under the cut), or no profile to place them with.
    """
    fields = Fields(obj, source, PlanError)
    meta = _names(fields)
    parsed = [_stage(s, f"{source}: stages[{i}]") for i, s in enumerate(fields.array("stages", 1))]
    stages = tuple(stage for stage, _ in parsed)
    layer_order = None
    if any(names is not None for _, names in parsed):
        if profile is None:
            raise PlanError(f"{source}: its stages name their layers; reading it needs the profile to place them")
        resolved = profile if isinstance(profile, ModelProfile) else profile(profile_name or meta["profile"])
        layer_order = _layer_order([names for _, names in parsed], stages, resolved, source)
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
            layer_order=layer_order,
            adaptive=_adaptive(fields.obj.get("adaptive"), source, fields.integer("k", 1)),
            zero=fields.integer("zero", 0, 0),
        )
    except PlanError as exc:
        if str(exc).startswith(source):
            raise
        raise PlanError(f"{source}: {exc}") from None
    return plan, meta


def read_plan(path: str | os.PathLike[str], profile: ProfileFor = None) -> tuple[Plan, dict[str, str]]:
    """Read a plan file; returns (plan, {"profile": name, "cluster": name}).

    A recorded relative file path is resolved against the plan file's folder
    (as write_plan records it), else against the working folder (older plan
    files); anything else is a built-in name, returned as it is. A DAG plan's
    named layers are placed with `profile` (see plan_from_json; a function
    gets the resolved name).

    Raises:
        PlanError: unreadable file, invalid JSON, or a bad field (naming file, field and value).
    """
    source = os.fspath(path)
    obj = load_json_file(source, PlanError, "plan")
    meta = _names(Fields(obj, source, PlanError))
    folder = os.path.dirname(os.path.abspath(source))
    for key, name in meta.items():
        beside = os.path.join(folder, name)
        if not os.path.isabs(name) and something_at(beside):  # whatever stands there is read (and its kind reported)
            meta[key] = os.path.normpath(beside)
    plan, _ = plan_from_json(obj, source, profile, meta["profile"])
    return plan, meta
