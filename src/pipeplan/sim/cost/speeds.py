"""Device speeds on the profile's scale: a profile measured on kind X runs on a device of kind Y at speed(Y) / speed(X)."""

from __future__ import annotations

import dataclasses

from pipeplan.core.errors import ClusterError
from pipeplan.core.hardware.cluster import Cluster
from pipeplan.core.hardware.devices import CPU_KIND, kind_of_device_name, nominal_speed, speed_scale
from pipeplan.core.profile import ModelProfile


def profile_kind(profile: ModelProfile) -> str | None:
    """The device kind a profile's times are for (`V100`, `H100`, `cpu`), None when its reference device is no known kind."""
    return kind_of_device_name(profile.reference_device)


def on_profile_scale(cluster: Cluster, profile: ModelProfile) -> Cluster:
    """`cluster` with every device's speed relative to the device the profile was measured on (or projected to).

    A cluster whose speeds are on a known scale (`speed_reference`, set by the
    cluster reader from the device kinds) and a profile of a known kind are
    brought together: an H100-projected profile on H100s gets speed 1.0 there,
    a V100 profile on the same cluster speed 5.0. When either side is unknown
    (an in-memory cluster, a profile of an unknown device) the speeds are
    taken as they are: relative to the profile (a cluster built in code with a
    `speed_reference` pipeplan has no figures for counts as unknown). Idempotent: the result's
    `speed_reference` is the profile's kind.

    Raises:
        ClusterError: the profile was measured on a CPU and the cluster has GPUs, or the reverse.
    """
    unit = cluster.speed_reference
    kind = profile_kind(profile)
    if unit is None or kind is None or unit == kind or nominal_speed(unit) is None:
        return cluster
    if speed_scale(unit) != speed_scale(kind):
        here = "CPU processes" if speed_scale(unit) == CPU_KIND else f"GPUs ({cluster.devices[0].kind})"
        raise ClusterError(
            f"profile {profile.name!r} was measured on {profile.reference_device!r} but cluster {cluster.name!r} has {here}: "
            "a speed relative to one means nothing for the other; profile the model where it will run, project it "
            "with `pipeplan profile --project-to GPU`, or describe the machine you profiled on (`pipeplan probe`)"
        )
    unit_speed, kind_speed = nominal_speed(unit), nominal_speed(kind)
    assert unit_speed is not None and kind_speed is not None  # both are known kinds on one scale
    factor = unit_speed / kind_speed
    try:
        devices = tuple(dataclasses.replace(d, speed=d.speed * factor) for d in cluster.devices)
    except ClusterError as exc:  # a speed pushed out of range by the scaling: name both inputs
        raise ClusterError(
            f"cluster {cluster.name!r} on the scale of profile {profile.name!r} (speeds relative to {unit} times "
            f"{factor:g}, as {profile.reference_device!r} is the reference): {exc}"
        ) from None
    return dataclasses.replace(cluster, devices=devices, speed_reference=kind)
