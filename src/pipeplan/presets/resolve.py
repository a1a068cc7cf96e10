"""The one place that turns "a name or a path" into a profile, a cluster, a schedule or a checked plan."""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable
from functools import cache

from pipeplan.core.errors import ClusterError, PipeplanError, PlanError, ProfileError, ScheduleError
from pipeplan.core.hardware.cluster import Cluster
from pipeplan.core.plan import Plan
from pipeplan.core.profile import ModelProfile
from pipeplan.core.schedule import Schedule
from pipeplan.io.cluster_json import cluster_from_json, read_cluster_json
from pipeplan.io.files import check_regular, something_at
from pipeplan.io.graph_txt import parse_graph_txt, read_graph_txt
from pipeplan.io.profile_json import read_profile_json
from pipeplan.presets.calibrated import calibrated_cluster, is_calibrated_name
from pipeplan.presets.calibrated_v100 import is_v100_name, v100_cluster
from pipeplan.presets.clusters import CLUSTER_BUILDERS
from pipeplan.presets.gpt_profile import GPT_PREFIX, gpt_profile, parse_gpt_spec
from pipeplan.presets.profiles import REFERENCE_DEVICE, builtin_profile_files, builtin_profile_text


def list_profiles() -> tuple[str, ...]:
    """Names of the built-in profiles, sorted (`dapple/bert-48`, ..., `pipedream/vgg16`)."""
    return tuple(builtin_profile_files())


def list_clusters() -> tuple[str, ...]:
    """Names of the built-in clusters, in the order they are documented."""
    return tuple(CLUSTER_BUILDERS)


def load_profile(spec: str, profile_batch_size: int | None = None) -> ModelProfile:
    """A profile from a built-in name, a `.json` file (pipeplan.profile/1) or a graph.txt file.

    `gpt:layers=..,hidden=..,...` is an analytic GPT profile (presets.gpt_profile: FLOP counts at a GPU's measured
    matmul rate). A built-in may be named without its folder when that is unambiguous
    (`vgg16` is `pipedream/vgg16`). A path where something stands wins over a built-in name (a directory, a FIFO or a
    symlink loop there is reported as what it is, io.files).

    Args:
        spec: built-in name or file path.
        profile_batch_size: the batch the profile was measured with; needed for a
            graph.txt file without `-pbs-N` in its name, checked against the
            file's own batch size otherwise.

    Raises:
        ProfileError: unknown name (with close matches), unreadable or bad file.
    """
    if not isinstance(spec, str) or not spec:
        raise ProfileError(f"profile must be a built-in name or a file path, got {spec!r}")
    if spec.startswith(GPT_PREFIX) and not something_at(spec):
        profile = _gpt_profile(spec)
        _check_batch(spec, profile, profile_batch_size)
        return profile
    if something_at(spec):
        if spec.lower().endswith(".json"):
            profile = read_profile_json(spec)
            _check_batch(spec, profile, profile_batch_size)
            return profile
        return read_graph_txt(spec, profile_batch_size=profile_batch_size)
    name = _resolve(_profile_aliases().get(spec, spec), list_profiles(), "profile", ProfileError)
    profile = _builtin_profile(name)
    _check_batch(name, profile, profile_batch_size)
    return profile


def load_schedule(spec: str, stages: int | None, microbatches: int | None, k: int = 1, chunks: int = 1) -> Schedule:
    """A valid schedule from a generator name (with its sizes) or a schedule file (`.csv`: torch's compute-only
    format, `.json`: pipeplan.schedule/1; validated as it is read), which fixes its own sizes (the ones given are
    then not used: `simulate` refuses them, `train` has defaults for them).

    Raises:
        ScheduleError: an unknown name, missing or bad sizes, a bad or missing file.
    """
    from pipeplan.io.schedule_io import read_schedule_csv, read_schedule_json
    from pipeplan.schedules import make_schedule
    from pipeplan.schedules.registry import SCHEDULES

    suffix = os.path.splitext(spec)[1].lower()
    if suffix in (".csv", ".json"):
        return read_schedule_csv(spec) if suffix == ".csv" else read_schedule_json(spec)
    if spec not in SCHEDULES and something_at(spec):
        check_regular(spec, "schedule", ScheduleError)  # a directory, a FIFO, a device: said as what it is
        raise ScheduleError(f"{spec}: a schedule file must end with .csv or .json (or name a schedule: {', '.join(SCHEDULES)})")
    for flag, value in (("--stages", stages), ("--microbatches", microbatches)):
        if value is None:
            raise ScheduleError(f"schedule {spec} needs {flag}")
    assert stages is not None and microbatches is not None
    # A generator's schedule is valid by construction (tests/test_schedules.py checks every generator with
    # validate() over random sizes), so it is not validated again here: at p=64, m=1024 that was half the command.
    return make_schedule(spec, stages, microbatches, k=k, chunks=chunks)


def load_cluster(spec: str) -> Cluster:
    """A cluster from a built-in name, a calibrated preset's name (`dgx-a100-8x<N>`, `dgx-h100-8x<N>`:
    presets.calibrated; `p3-v100-8x<N>`, `nc-v100-4x<N>`, `eth-v100-1x<N>`: presets.calibrated_v100) or a `.json`
    file (pipeplan.cluster/1, either form).

    Raises:
        ClusterError: unknown name (with close matches), unreadable or bad file.
    """
    if not isinstance(spec, str) or not spec:
        raise ClusterError(f"cluster must be a built-in name or a file path, got {spec!r}")
    if something_at(spec):
        return read_cluster_json(spec)
    if spec not in CLUSTER_BUILDERS and (is_calibrated_name(spec) or is_v100_name(spec)):
        return _calibrated_cluster(spec)
    return _builtin_cluster(_resolve(spec, list_clusters(), "cluster", ClusterError))


def load_plan(
    path: str,
    profile: str | None = None,
    profile_batch_size: int | None = None,
    read_profile: Callable[[str], ModelProfile] | None = None,
) -> tuple[Plan, dict[str, str]]:
    """A plan file read (io.plan_json.read_plan) and its schedule's k and chunks checked against the schedule table.

    A DAG plan (stages that name their layers) is placed with `profile`
    (a name or a path; None: the one the plan records), loaded only then, by `read_profile` when given (a caller
    that reads each file once hands its reader: api.train.train_inputs), else by load_profile.

    Raises:
        PlanError: unreadable file, a bad field, or a k or chunks the schedule does not take (naming the file).
        ProfileError: the profile a DAG plan needs cannot be loaded.
    """
    from pipeplan.io.plan_json import read_plan
    from pipeplan.schedules.registry import check_schedule_options

    read = read_profile or (lambda spec: load_profile(spec, profile_batch_size))
    plan, names = read_plan(path, lambda recorded: read(profile or recorded))
    try:
        check_schedule_options(plan.schedule, plan.microbatches, plan.k, plan.chunks)
    except ScheduleError as exc:
        raise PlanError(f"{path}: {exc}") from None
    return plan, names


@cache
def _profile_aliases() -> dict[str, str]:
    """A built-in's file names as names too: `dapple/bert-24-pbs-6`, `bert-24-pbs-6.txt`, ... -> `dapple/bert-24`."""
    aliases: dict[str, str] = {}
    clashes: set[str] = set()
    for name, relative in builtin_profile_files().items():
        stem = relative.removeprefix("profiles/")
        for alias in {stem, stem.removesuffix(".txt"), stem.rsplit("/", 1)[-1], stem.rsplit("/", 1)[-1].removesuffix(".txt")}:
            if aliases.setdefault(alias, name) != name:
                clashes.add(alias)
    return {alias: name for alias, name in aliases.items() if alias not in clashes}


@cache
def _builtin_profile(name: str) -> ModelProfile:
    """Parse a built-in profile once per process (profiles are immutable)."""
    relative, text = builtin_profile_text(name)
    return parse_graph_txt(text, relative, name=name, reference_device=REFERENCE_DEVICE)


@cache
def _calibrated_cluster(name: str) -> Cluster:
    """Build a calibrated preset once per process."""
    built = v100_cluster(name) if is_v100_name(name) else calibrated_cluster(name)
    return cluster_from_json(built, f"calibrated cluster {name}")


@cache
def _gpt_profile(spec: str) -> ModelProfile:
    """An analytic GPT profile once per process (its text is its whole input)."""
    return gpt_profile(parse_gpt_spec(spec))


@cache
def _builtin_cluster(name: str) -> Cluster:
    """Build a built-in cluster once per process (clusters are immutable)."""
    return cluster_from_json(CLUSTER_BUILDERS[name](), f"built-in cluster {name}")


def _resolve(spec: str, names: tuple[str, ...], what: str, error: type[PipeplanError]) -> str:
    """The built-in name spec refers to: exact, or a unique `folder/spec` match."""
    if spec in names:
        return spec
    suffix = [n for n in names if n.rsplit("/", 1)[-1] == spec]
    if len(suffix) == 1:
        return suffix[0]
    if len(suffix) > 1:
        raise error(f"{what} {spec!r} is ambiguous: it may be {', '.join(suffix)}")
    folders = {n.split("/", 1)[0] for n in names if "/" in n}
    in_folder = "/" in spec and spec.split("/", 1)[0] in folders and spec.count("/") == 1
    looks_like_path = (os.sep in spec and not in_folder) or spec.lower().endswith((".json", ".txt"))
    if looks_like_path:
        raise error(f"{what} file {spec!r} does not exist")
    short = {n.rsplit("/", 1)[-1]: n for n in names}
    # Names that extend what was typed come first, then difflib's nearest spellings.
    close = [n for n in names if n.startswith(spec) or n.rsplit("/", 1)[-1].startswith(spec)]
    close += difflib.get_close_matches(spec, names, n=3, cutoff=0.5)
    close += [short[s] for s in difflib.get_close_matches(spec, list(short), n=3, cutoff=0.5)]
    close = list(dict.fromkeys(close))
    hint = f"did you mean {', '.join(close[:3])}? " if close else ""
    raise error(f"unknown {what} {spec!r} (not a file, not a built-in name); {hint}`pipeplan show {what}s` lists the built-ins")


def _check_batch(source: str, profile: ModelProfile, profile_batch_size: int | None) -> None:
    """A given profile batch size must match the profile's own."""
    if profile_batch_size is not None and profile_batch_size != profile.batch_size:
        raise ProfileError(
            f"{source}: the profile was measured with batch size {profile.batch_size}, "
            f"but the profile batch size given is {profile_batch_size!r}"
        )
