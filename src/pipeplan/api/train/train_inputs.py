"""The files `pipeplan train --plan` reads, each opened and parsed once, by the launcher, before its checks: the plan,
the profile and cluster it is predicted with (--profile/--cluster, else the plan's own). Every check after it, the
emulated network and the TrainConfig its workers are handed take these values; none reads a file again."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from pipeplan.core.errors import PipeplanError

if TYPE_CHECKING:
    from pipeplan.core.hardware.cluster import Cluster
    from pipeplan.core.plan import Plan
    from pipeplan.core.profile import ModelProfile

T = TypeVar("T")


@dataclass(frozen=True)
class Loaded(Generic[T]):
    """A file (or built-in name) read once: what names it, and its value or the error reading it raised, kept so that
    the check that needs it says it in its turn (a refusal stays the one line it was)."""

    spec: str
    value: T | None = None
    error: PipeplanError | None = None

    def get(self) -> T:
        """The value read.

        Raises:
            PipeplanError: the error reading it raised (naming the file).
        """
        if self.error is not None:
            raise self.error
        assert self.value is not None
        return self.value


def read_once(loader: Callable[[str], T], spec: str) -> Loaded[T]:
    """`spec` read by `loader`, once: its value, or the PipeplanError it raised."""
    try:
        return Loaded(spec, loader(spec))
    except PipeplanError as exc:
        return Loaded(spec, error=exc)


def read_profile(spec: str) -> Loaded[ModelProfile]:
    """A profile (a path or a built-in name) read once (presets.resolve.load_profile)."""
    from pipeplan.presets.resolve import load_profile

    return read_once(load_profile, spec)


def read_cluster(spec: str) -> Loaded[Cluster]:
    """A cluster (a path or a built-in name) read once (presets.resolve.load_cluster)."""
    from pipeplan.presets.resolve import load_cluster

    return read_once(load_cluster, spec)


@dataclass(frozen=True)
class PlanInputs:
    """A plan file and what it is predicted with, each read once."""

    plan: Plan
    names: dict[str, str]
    """The profile and cluster the plan file records (resolved as io.plan_json.read_plan resolves them)."""
    profile: Loaded[ModelProfile]
    """--profile, else the plan's own: read (a DAG plan's layers were placed with this same read)."""
    cluster: Loaded[Cluster]
    """--cluster, else the plan's own: read (also the emulated links' rates)."""


def read_plan_inputs(path: str, profile: str | None, cluster: str | None) -> Loaded[PlanInputs]:
    """Plan file `path` read (presets.resolve.load_plan), then --profile (`profile`) or the plan's own and --cluster
    (`cluster`) or the plan's own, each file once; an error is kept (Loaded), not raised."""
    from pipeplan.presets.resolve import load_plan

    profiles: dict[str, Loaded[ModelProfile]] = {}

    def placing(spec: str) -> ModelProfile:  # a DAG plan's layers placed with the read the checks use after
        profiles[spec] = read_profile(spec)
        return profiles[spec].get()

    try:
        plan, names = load_plan(path, profile, read_profile=placing)
    except PipeplanError as exc:
        return Loaded(path, error=exc)
    profile_spec = profile or names["profile"]
    read = profiles.get(profile_spec) or read_profile(profile_spec)
    return Loaded(path, PlanInputs(plan, names, read, read_cluster(cluster or names["cluster"])))
