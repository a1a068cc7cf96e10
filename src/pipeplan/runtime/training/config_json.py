"""A TrainConfig as one JSON object and back: what the --local launcher hands each worker (api.train.training), so the
workers run the job the launcher built and checked, with the plan as a value (its file not read again)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from pipeplan.core.hardware.cluster import Cluster
from pipeplan.io.bandwidth_trace_json import bandwidth_trace_from_json, bandwidth_trace_to_json
from pipeplan.io.cluster_json import cluster_from_json, cluster_to_json
from pipeplan.io.plan_json import plan_from_json, plan_to_json
from pipeplan.io.profile_json import profile_from_json, profile_to_json
from pipeplan.io.schedule_io import schedule_from_json, schedule_to_json
from pipeplan.runtime.execution.job import ScheduleLayout
from pipeplan.runtime.options import AsyncSettings
from pipeplan.runtime.rank_errors import TrainConfigError
from pipeplan.runtime.training.train_config import TrainConfig
from pipeplan.runtime.transport.network import NetworkSettings

VALUES = ("plan", "schedule", "layout", "module_options", "asynchronous", "network", "profile_value", "cluster_value")
"""The fields that are no JSON value as they are (the others are str, int, float, bool or None)."""


def config_to_json(config: TrainConfig) -> dict[str, Any]:
    """`config` as one JSON object: every field by its name; the plan as a plan file's object (its layer order
    beside it), the schedule (and a schedule file's, in the layout) as a schedule file's, a profile or cluster as
    their files', the other values as objects."""
    obj = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name not in VALUES}
    plan = config.plan
    obj["plan"] = None if plan is None else {
        "plan": plan_to_json(dataclasses.replace(plan, layer_order=None), "none", "none"),  # names unused
        "layer_order": None if plan.layer_order is None else list(plan.layer_order),
    }  # fmt: skip
    obj["schedule"] = None if config.schedule is None else schedule_to_json(config.schedule)
    obj["module_options"] = [[key, value] for key, value in config.module_options]
    obj["profile_value"] = None if config.profile_value is None else profile_to_json(config.profile_value)
    obj["cluster_value"] = _cluster(config.cluster_value)
    layout = config.layout
    obj["layout"] = None if layout is None else {
        **{f.name: getattr(layout, f.name) for f in dataclasses.fields(layout) if f.name != "file_schedule"},
        "file_schedule": None if layout.file_schedule is None else schedule_to_json(layout.file_schedule),
    }  # fmt: skip
    obj["asynchronous"] = None if config.asynchronous is None else dataclasses.asdict(config.asynchronous)
    network = config.network
    obj["network"] = None if network is None else {
        "trace": network.trace, "gb_per_s": network.gb_per_s, "cluster": network.cluster,
        "trace_steps": None if network.trace_steps is None else bandwidth_trace_to_json(network.trace_steps),
        "cluster_value": _cluster(network.cluster_value),
    }  # fmt: skip
    return obj


def config_from_json(obj: Mapping[str, Any]) -> TrainConfig:
    """The TrainConfig `config_to_json` gave (its checks run again, TrainConfig.__post_init__).

    Raises:
        TrainConfigError: a key that names no field, or a value TrainConfig refuses.
        PlanError, ScheduleError, ProfileError, ClusterError: a plan, schedule, profile or cluster that does not read
            back.
    """
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(obj) - names)
    if unknown:
        raise TrainConfigError(f"a train job's config has no field {unknown[0]!r}")
    values = {key: value for key, value in obj.items() if key not in VALUES}
    plan = obj.get("plan")
    if plan is not None:
        order = plan["layer_order"]
        read, _ = plan_from_json(plan["plan"], "the job's plan")
        values["plan"] = dataclasses.replace(read, layer_order=None if order is None else tuple(order))
    if obj.get("schedule") is not None:
        values["schedule"] = schedule_from_json(obj["schedule"], "the job's schedule")
    values["module_options"] = tuple((str(key), value) for key, value in obj.get("module_options", ()))
    if obj.get("profile_value") is not None:
        values["profile_value"] = profile_from_json(obj["profile_value"], "the job's profile")
    if obj.get("cluster_value") is not None:
        values["cluster_value"] = cluster_from_json(obj["cluster_value"], "the job's cluster")
    layout = obj.get("layout")
    if layout is not None:
        replicas, read = layout.get("replicas"), layout.get("file_schedule")
        values["layout"] = ScheduleLayout(**{
            **layout, "replicas": None if replicas is None else tuple(replicas),
            "file_schedule": None if read is None else schedule_from_json(read, "the job's schedule file"),
        })  # fmt: skip
    if obj.get("asynchronous") is not None:
        values["asynchronous"] = AsyncSettings(**obj["asynchronous"])
    network = obj.get("network")
    if network is not None:
        steps, cluster = network.get("trace_steps"), network.get("cluster_value")
        values["network"] = NetworkSettings(**{
            **network, "trace_steps": None if steps is None else bandwidth_trace_from_json(steps),
            "cluster_value": None if cluster is None else cluster_from_json(cluster, "the emulated links' cluster"),
        })  # fmt: skip
    return TrainConfig(**values)


def _cluster(cluster: Cluster | None) -> dict[str, Any] | None:
    return None if cluster is None else cluster_to_json(cluster)
