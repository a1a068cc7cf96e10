"""The API's arguments: a profile or cluster given as a value, a file path or a built-in name, and the checks and
wording every API function shares for them."""

from __future__ import annotations

from pipeplan.core.cluster import Cluster
from pipeplan.core.errors import ProfileError
from pipeplan.core.profile import ModelProfile


def check_costs(batch_scaling: object, optimizer: object) -> None:
    """batch_scaling and optimizer are ones the cost model knows.

    Raises:
        ProfileError: naming the argument and its value.
    """
    from pipeplan.sim.cost.layers import OPTIMIZER_STATE, SCALINGS

    for name, value, known in (("batch_scaling", batch_scaling, SCALINGS), ("optimizer", optimizer, OPTIMIZER_STATE)):
        if not isinstance(value, str) or value not in known:
            raise ProfileError(f"{name} must be one of {', '.join(known)}, got {value!r}")


def load_profile(profile: ModelProfile | str) -> ModelProfile:
    """A profile value as given, or read from a file path or a built-in name (`pipeplan show profiles`).

    Raises:
        ProfileError: naming `profile` and the value (an unknown name lists close matches).
    """
    if isinstance(profile, ModelProfile):
        return profile
    from pipeplan.presets.resolve import load_profile as resolve

    return resolve(profile)


def load_cluster(cluster: Cluster | str) -> Cluster:
    """A cluster value as given, or read from a file path or a built-in name (`pipeplan show clusters`).

    Raises:
        ClusterError: naming `cluster` and the value.
    """
    if isinstance(cluster, Cluster):
        return cluster
    from pipeplan.presets.resolve import load_cluster as resolve

    return resolve(cluster)


def given(value: object) -> str:
    """A wrong-typed argument as a message shows it: its type, and its repr when short (42, 'plan.json')."""
    text = repr(value) if isinstance(value, int | float | str | bytes | type(None)) else ""
    return type(value).__name__ + (f" {text[:60]}" if text else "")


def shown(value: object) -> str:
    """A profile or cluster argument as a message shows it: its name, or the path given."""
    return repr(value) if isinstance(value, str) else repr(getattr(value, "name", type(value).__name__))
