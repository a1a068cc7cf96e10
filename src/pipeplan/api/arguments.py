"""The API's arguments: one declarative check of every argument of a public function before it does any work, and
a profile or cluster given as a value, a file path or a built-in name.

Each function lists its arguments with a rule (`Integer(1, BATCH)`, `Choice(OPTIMIZERS)`, `Output()`, ...) and
calls `check` first: a value that breaks its rule raises the function's PipeplanError subclass in one line naming
the argument and the value (`steps must be an integer >= 1, got 0`), before a file is read, a model built or a
process started. bool is not an integer or a number here, and every number must be finite.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from pipeplan.core.errors import PipeplanError, ProfileError
from pipeplan.core.hardware.cluster import Cluster
from pipeplan.core.plan import Plan
from pipeplan.core.profile import ModelProfile
from pipeplan.io.file_kinds import FileKind

if TYPE_CHECKING:
    from pipeplan.core.limits import Limit


class Rule(Protocol):
    """What an argument must be: `fits` says whether a value is, `expects` says it in words for the message."""

    optional: bool

    def expects(self) -> str: ...

    def fits(self, value: object) -> bool: ...


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class Integer:
    """An int (not a bool) >= `least`, within `limit` when given (its refusal quotes the limit's reason)."""

    least: int = 0
    limit: Limit | None = None
    optional: bool = False

    def expects(self) -> str:
        return f"an integer >= {self.least}"

    def fits(self, value: object) -> bool:
        return _is_int(value) and value >= self.least  # type: ignore[operator]


@dataclass(frozen=True, slots=True)
class Number:
    """A finite int or float (not a bool) >= `least` (> it with `above`), at most `most` when given; `unit` says what
    it counts (shown in brackets after the range)."""

    least: float = 0.0
    above: bool = False
    most: float | None = None
    limit: Limit | None = None
    optional: bool = False
    unit: str = ""

    def expects(self) -> str:
        bound = f"{'>' if self.above else '>='} {self.least:g}"
        most = f" and <= {self.most:g}" if self.most is not None else ""
        return f"a finite number {bound}{most}" + (f" ({self.unit})" if self.unit else "")

    def fits(self, value: object) -> bool:
        if not _is_number(value) or not math.isfinite(value):  # type: ignore[arg-type]
            return False
        low = value > self.least if self.above else value >= self.least  # type: ignore[operator]
        return low and (self.most is None or value <= self.most)  # type: ignore[operator]


@dataclass(frozen=True, slots=True)
class Choice:
    """One of a fixed set of strings (in any case with `fold_case`: A100 or a100)."""

    names: tuple[str, ...]
    fold_case: bool = False
    optional: bool = False

    def expects(self) -> str:
        return f"one of {', '.join(self.names)}"

    def fits(self, value: object) -> bool:
        if self.fold_case and isinstance(value, str):
            return value.strip().lower() in {name.lower() for name in self.names}
        return isinstance(value, str) and value in self.names


@dataclass(frozen=True, slots=True)
class Text:
    """A non-empty string; `what` says which (a file path, a built-in name, ...)."""

    what: str = "a non-empty string"
    optional: bool = False

    def expects(self) -> str:
        return self.what

    def fits(self, value: object) -> bool:
        return isinstance(value, str) and bool(value.strip()) and "\0" not in value


@dataclass(frozen=True, slots=True)
class Flag:
    """True or False (not 0 or 1)."""

    optional: bool = False

    def expects(self) -> str:
        return "True or False"

    def fits(self, value: object) -> bool:
        return isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class Function:
    """A callable; `what` says what it is called with."""

    what: str = "a function"
    optional: bool = False

    def expects(self) -> str:
        return self.what

    def fits(self, value: object) -> bool:
        return callable(value)


@dataclass(frozen=True, slots=True)
class Instance:
    """A value of one of `types` (`what` names them for the message), or with `named` a non-empty string too: a file
    path or built-in name that is loaded after every argument is checked."""

    types: tuple[type, ...]
    what: str
    named: bool = False
    optional: bool = False

    def expects(self) -> str:
        return self.what

    def fits(self, value: object) -> bool:
        return isinstance(value, self.types) or (self.named and Text().fits(value))


@dataclass(frozen=True, slots=True)
class Sizes:
    """A list or tuple of integers >= 1 (batch sizes), not empty."""

    optional: bool = False

    def expects(self) -> str:
        return "a list of integers >= 1"

    def fits(self, value: object) -> bool:
        return (isinstance(value, list | tuple) and bool(value) and
                all(_is_int(v) and v >= 1 for v in value))  # type: ignore[operator]  # fmt: skip


@dataclass(frozen=True, slots=True)
class Options:
    """A factory's options: a dict of name to str, int, float or bool (the names are checked against the factory
    by check_model)."""

    optional: bool = False

    def expects(self) -> str:
        return "a dict of option name to value (hidden=512 is {'hidden': 512})"

    def fits(self, value: object) -> bool:
        return isinstance(value, Mapping) and all(
            Text().fits(key) and (isinstance(v, str | bool) or (_is_number(v) and math.isfinite(v)))  # type: ignore[arg-type]
            for key, v in value.items()
        )


ANY_FILE = FileKind("file")
"""The kind of an output the rule names no kind for: any regular file (the guard's other checks still apply)."""


@dataclass(frozen=True, slots=True)
class Output:
    """A file the function writes: a non-empty path whose folder exists and can be written, and where nothing but a
    regular file stands (api.outputs, the guard every writing command runs); with a `kind`, a path with its ending
    where only a file of that kind that pipeplan wrote may be replaced (io.file_kinds)."""

    kind: FileKind | None = None
    optional: bool = False

    def expects(self) -> str:
        suffixes = self.kind.suffixes if self.kind is not None else ()
        return "a file path" + (f" ending with {' or '.join(suffixes)}" if suffixes else "")

    def fits(self, value: object) -> bool:
        return Text().fits(value)


def check(
    error: type[PipeplanError], arguments: Mapping[str, tuple[object, Rule]], labels: Mapping[str, str] | None = None
) -> None:
    """Check every argument against its rule, in order, before the caller does any work.

    `arguments` maps each argument's name to (value, rule); None passes an optional rule. Output paths go through
    the output guard (api.outputs) once every other argument is known good. `labels` names arguments as the caller
    gave them (the command line passes its flags: `--global-batch`); an argument without a label is named as is.

    Raises:
        error: naming the first bad argument and its value (a wrong type shown with its type name).
    """
    outputs = []
    for name, (value, rule) in arguments.items():
        if value is None and rule.optional:
            continue
        label = (labels or {}).get(name, name)
        if not rule.fits(value):
            raise error(f"{label} must be {rule.expects()}, got {_shown(value, rule)}")
        limit = getattr(rule, "limit", None)
        if limit is not None:
            limit.check(error, label, value)  # type: ignore[arg-type]
        if isinstance(rule, Output):
            outputs.append((name, value, rule))
    if outputs:
        from pipeplan.api.outputs import Output as Guarded
        from pipeplan.api.outputs import check_outputs

        try:
            check_outputs([Guarded(name, str(value), rule.kind or ANY_FILE) for name, value, rule in outputs])
        except PipeplanError as exc:
            raise error(str(exc)) from None


def _shown(value: object, rule: Rule) -> str:
    """A bad value as a message shows it: its repr when of the kind the rule takes (0, 'fast', nan), else its type
    too (str 'plan.json' where a Plan is wanted)."""
    plain = isinstance(rule, Integer | Number | Choice | Text | Output) and isinstance(value, str | int | float)
    return repr(value)[:80] if plain and not isinstance(value, bool) else given(value)


def check_model(module_spec: str, options: Mapping[str, object], dataset: str, labels: tuple[str, str]) -> None:
    """The model a MODULE_SPEC, its options and a dataset name: without building it, the spec resolves (a built-in,
    or an importable package.module:factory), the factory takes each option and each value converts to the type of
    its default, the dataset is known, and a digits or pysource dataset has the option it needs (torch).

    `labels` name the spec and the dataset for messages (module_spec and dataset, or --module and --dataset); a bad
    spec or option is named as MODULE_SPEC's own errors name it (the spec, the option and the value).

    Raises:
        ProfileError: a spec that does not resolve, an option it does not take or a value that does not convert.
        TrainConfigError: an unknown dataset, or one the spec cannot take.
    """
    from pipeplan.core.errors import TrainConfigError
    from pipeplan.models.build import resolve_dataset
    from pipeplan.models.specs import coerce_options, factory_of, takes_option

    module_label, dataset_label = labels
    coerce_options(module_spec, factory_of(module_spec), dict(options))  # its errors name MODULE_SPEC and the option
    try:
        chosen = resolve_dataset(module_spec, dataset)
    except TrainConfigError as exc:
        raise TrainConfigError(str(exc).replace("--dataset", dataset_label, 1)) from None
    needs = {"digits": "in_features", "pysource": "seq_len"}.get(chosen)
    if needs is not None and not takes_option(module_spec, needs):
        raise TrainConfigError(
            f"{dataset_label} {chosen} needs a MODULE_SPEC with a {needs} option (such as "
            f"{'mlp' if chosen == 'digits' else 'charlm'}), got {module_label} {module_spec!r}"
            + ("; give your own samples with --data MODULE:FACTORY" if chosen == "digits" else "")
        )


def check_sources(profile: object, cluster: object = None, *, cluster_optional: bool = False) -> None:
    """A profile (ModelProfile, path or name) and a cluster (Cluster, path or name; None with `cluster_optional`).

    Raises:
        ProfileError, ClusterError: naming `profile` or `cluster` and the value.
    """
    from pipeplan.core.errors import ClusterError

    check(ProfileError, {"profile": (profile, PROFILE)})
    if cluster is not None or not cluster_optional:
        check(ClusterError, {"cluster": (cluster, CLUSTER)})


def cost_arguments(batch_scaling: object, optimizer: object) -> dict[str, tuple[object, Rule]]:
    """The rules of the cost model's two choices: batch_scaling and optimizer."""
    from pipeplan.sim.cost.layers import OPTIMIZER_STATE, SCALINGS

    return {"batch_scaling": (batch_scaling, Choice(SCALINGS)), "optimizer": (optimizer, Choice(tuple(OPTIMIZER_STATE)))}


PROFILE = Instance((ModelProfile,), "a ModelProfile, a profile file path or a built-in name", named=True)
CLUSTER = Instance((Cluster,), "a Cluster, a cluster file path or a built-in name", named=True)
PLAN = Instance((Plan,), "a Plan (api.plan(...).plan, or presets.resolve.load_plan)")
PROGRESS = Function("a function called with the progress, or None", optional=True)


def load_profile(profile: ModelProfile | str) -> ModelProfile:
    """A profile value as given, or read from a file path or a built-in name (`pipeplan show profiles`).

    Raises:
        ProfileError: naming `profile` and the value (an unknown name lists close matches).
    """
    check(ProfileError, {"profile": (profile, PROFILE)})
    if isinstance(profile, ModelProfile):
        return profile
    from pipeplan.presets.resolve import load_profile as resolve

    return resolve(profile)


def profile_of(profile: ModelProfile | str, profile_batch_size: int | None = None) -> ModelProfile:
    """load_profile with the batch a graph.txt profile was measured with (`--profile-batch-size`), when its file name
    has no -pbs-N.

    Raises:
        ProfileError: as load_profile, or a batch size the profile contradicts.
    """
    if profile_batch_size is None or isinstance(profile, ModelProfile):
        return load_profile(profile)
    from pipeplan.presets.resolve import load_profile as resolve

    return resolve(profile, profile_batch_size)


def load_cluster(cluster: Cluster | str) -> Cluster:
    """A cluster value as given, or read from a file path or a built-in name (`pipeplan show clusters`).

    Raises:
        ClusterError: naming `cluster` and the value.
    """
    from pipeplan.core.errors import ClusterError

    check(ClusterError, {"cluster": (cluster, CLUSTER)})
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
