"""The one guard on output paths, run by every command and API function that writes, before it does any work.

An output is refused (OutputError, one line naming the flag and the path) when
two outputs of the command name the same path; when it names an input of the
same command (the same file through any symlink, hard link or relative path:
the files its options name, the profile and cluster its plan file names, the
module file its MODULE_SPEC imports); when something other than a regular file
stands at it (a folder, a named pipe, a device node, a socket, a symbolic
link); when its name lacks its kind's ending (`.json`, `.png`); when its
folder does not exist (no folder is created for it) or cannot be written; and
when a file stands there that pipeplan did not write, of the same kind
(io.file_kinds: pipeplan replaces only its own files, or an empty one). A
folder output (a checkpoint or gradient folder, demo's) must be a folder, or
absent with an existing parent.

The guard lives below the command line so that the API's writers (save_plan, save_profile, probe_local's out) pass
it too. Which options of a command are inputs and which outputs is declared once per command, in
cli.file_options; cli.declared_files.check_files reads the values the command was given from the command line's context
and runs this guard.
"""

from __future__ import annotations

import glob
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pipeplan.core.errors import NoSpaceError, OutputError
from pipeplan.io.atomic import non_regular_kind
from pipeplan.io.file_kinds import FileKind

_WRITTEN_BY: dict[str, str] = {}
"""The resolved path of each output the running command checked -> its flag (flag_of names it in a late error)."""


@dataclass(frozen=True, slots=True)
class Output:
    """One output of a command: its flag, the path given (None: not given) and its kind (a file or a folder)."""

    flag: str
    path: str | None
    kind: FileKind


def _resolved(path: str) -> str:
    return os.path.realpath(os.path.abspath(path))


def _identity(path: str) -> tuple[object, ...]:
    """What two paths share when they name the same file: device and inode when it exists, else the resolved path."""
    try:
        info = os.stat(path)
    except OSError:
        return ("path", _resolved(path))
    return ("inode", info.st_dev, info.st_ino)


def _parent(path: str) -> str:
    """The folder `path` would be written in."""
    return os.path.dirname(os.path.abspath(path)) or os.sep


def _check_parent(flag: str, path: str) -> None:
    """The folder holding `path` exists, is a folder and can be written."""
    folder = _parent(path)
    if not os.path.exists(folder):
        raise OutputError(f"{flag} {path!r}: folder {folder!r} does not exist")
    if not os.path.isdir(folder):
        raise OutputError(f"{flag} {path!r}: {folder!r} is not a folder")
    if not os.access(folder, os.W_OK):
        raise OutputError(f"{flag} {path!r} cannot be written (no permission in folder {folder!r})")


def _check_file(output: Output, within: str = "") -> None:
    """A file output: what stands at it (absent or a regular file), its suffix, its folder, permission, and the
    kind of the file it would replace (`within`: the folder output it is written in, named in the message)."""
    flag, path, kind = output.flag, output.path, output.kind
    assert path is not None
    shown = f"{flag} {within!r}: {os.path.basename(path)!r}" if within else f"{flag} {path!r}"
    what = non_regular_kind(path)
    if what is not None:
        raise OutputError(f"{shown} is {what}, not a regular file; pipeplan writes only regular files: give another path")
    if kind.suffixes and not path.lower().endswith(kind.suffixes):
        raise OutputError(f"{shown} must end with {' or '.join(kind.suffixes)} (pipeplan writes a {kind.name} there)")
    _check_parent(flag, path)
    if not os.path.exists(path):
        return
    if not os.access(path, os.W_OK):
        raise OutputError(f"{shown} cannot be written (no permission)")
    kind.check_replaceable(path, shown)


def _check_folder(output: Output) -> None:
    """A folder output: an existing folder (a link to one is followed), or absent in an existing folder."""
    flag, path = output.flag, output.path
    assert path is not None
    if os.path.isdir(path):
        if not os.access(path, os.W_OK):
            raise OutputError(f"{flag} {path!r} cannot be written (no permission)")
        for pattern, kind in output.kind.inside:  # the files it writes there replace only its own
            for name in sorted(glob.glob(os.path.join(glob.escape(path), pattern))):
                _check_file(Output(flag, name, kind), within=path)
        return
    if os.path.lexists(path):
        kind = non_regular_kind(path) or "a file"
        raise OutputError(f"{flag} {path!r} is {kind}, not a folder")
    for suffix in output.kind.suffixes:
        if path.lower().endswith(suffix):
            raise OutputError(
                f"{flag} {path!r} names a folder (files are written inside it) but ends with {suffix!r} like a file: "
                "give a folder name"
            )
    _check_parent(flag, path)


def check_outputs(outputs: Sequence[Output], inputs: Mapping[str, str | None] | None = None) -> None:
    """Refuse, before any work, outputs that would destroy a file or be lost (see the module's docstring).

    `inputs` maps each input's flag to what was given: a path, a built-in name (not a file: skipped) or None.

    Raises:
        OutputError: naming the flag, the path and what is wrong, on one line.
    """
    given = [o for o in outputs if o.path is not None]
    seen: dict[tuple[object, ...], Output] = {}
    for output in given:
        assert output.path is not None
        first = seen.setdefault(_identity(output.path), output)
        if first is not output:
            raise OutputError(
                f"{output.flag} {output.path!r} and {first.flag} {first.path!r} name the same path: one output would "
                "overwrite the other; give two different paths"
            )
    for flag, path in (inputs or {}).items():
        if path is None or not os.path.lexists(path):
            continue
        same = seen.get(_identity(path))
        if same is not None:
            raise OutputError(
                f"{same.flag} {same.path!r} is the input {flag} {path!r}: writing it would destroy the input; give another path"
            )
    for output in given:
        (_check_folder if output.kind.folder else _check_file)(output)
    for output in given:
        assert output.path is not None
        _WRITTEN_BY[_resolved(output.path)] = output.flag


@dataclass(frozen=True, slots=True)
class CommandFiles:
    """The files one command reads and writes (cli.file_options declares every command's).

    `inputs`: options whose value is a file read (or a built-in name, which names no file); `plans`: those of
    `inputs` that are plan files, whose profile and cluster are read too; `modules`: options whose MODULE_SPEC's
    module file (`pkg.mod:factory` -> pkg/mod.py) is imported; `outputs`: each written option and its kind.
    """

    inputs: tuple[str, ...] = ()
    outputs: Mapping[str, FileKind] = field(default_factory=dict)
    plans: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()


def check_declared(
    declared: CommandFiles, values: Mapping[str, str | None], plan_names: Mapping[str, dict[str, str]] | None = None
) -> None:
    """The one guard of a command whose files `declared` names, with the values given (each option by its flag,
    None when not given): its outputs against its inputs, its plans' profile and cluster and its modules' files.
    `plan_names`: by flag, what a plan the command has already read names (plan_inputs reads it no more).

    Raises:
        OutputError: as check_outputs.
    """
    inputs: dict[str, str | None] = {flag: values.get(flag) for flag in declared.inputs}
    for flag in declared.plans:
        names = None if plan_names is None else plan_names.get(flag)
        inputs |= plan_inputs(values.get(flag), values.get("--profile"), values.get("--cluster"), names)
    for flag in declared.modules:
        inputs[f"{flag} {values.get(flag)!r} (its module file)"] = module_file(values.get(flag))
    forget_outputs()
    check_outputs([Output(flag, values.get(flag), kind) for flag, kind in declared.outputs.items()], inputs)


def flag_of(path: str) -> str | None:
    """The flag that gave output `path` (or the folder holding it) in the running command, if the guard saw it."""
    resolved = _resolved(path)
    return _WRITTEN_BY.get(resolved) or _WRITTEN_BY.get(os.path.dirname(resolved))


def no_space_line(exc: BaseException, flag: str | None = None) -> str | None:
    """The one line a full disk while writing an output gives (`NoSpaceError: --png 'a.png' not written: no space
    left on device ...`, naming the option: `flag`, else the one the guard saw give the path), or None when `exc` is
    not a full disk."""
    from pipeplan.io.atomic import no_space

    full = exc if isinstance(exc, NoSpaceError) else no_space(exc, getattr(exc, "filename", None) or "?")
    if full is None:
        return None
    flag = flag or flag_of(full.path)
    return f"{type(full).__name__}: {flag + ' ' if flag else ''}{full}"


def plan_inputs(
    plan: str | None, profile: str | None, cluster: str | None, names: dict[str, str] | None = None
) -> dict[str, str | None]:
    """The inputs of a command run on plan file `plan`: the plan, and the profile and cluster it names where
    --profile or --cluster does not replace them (resolved as read_plan resolves them); a plan that cannot be read
    names none here. `names`: what the plan names as the command read it ({}: it could not), not read again here."""
    inputs: dict[str, str | None] = {"--plan": plan, "--profile": profile, "--cluster": cluster}
    if plan is None or (profile is not None and cluster is not None):
        return inputs
    if names is None:
        if not os.path.isfile(plan):
            return inputs  # a pipe is read once, by the command itself
        from pipeplan.core.errors import PipeplanError
        from pipeplan.presets.resolve import load_plan

        try:
            _, names = load_plan(plan, profile)
        except (PipeplanError, OSError, UnicodeDecodeError):
            return inputs  # reading it again fails the command, with this error, before anything is written
    if not names:
        return inputs
    if profile is None:
        inputs[f"profile of the plan {plan}"] = names.get("profile")
    if cluster is None:
        inputs[f"cluster of the plan {plan}"] = names.get("cluster")
    return inputs


def module_file(spec: str | None) -> str | None:
    """The file of the module MODULE_SPEC `spec` (`pkg.mod:factory`) imports, found as the import would find it
    (sys.path, then the working folder, as models.specs does) without running it; None for a built-in name or a
    module not found (its import fails later, before anything is written)."""
    from importlib.machinery import PathFinder

    if spec is None or ":" not in spec:
        return None
    name = spec.partition(":")[0].strip()
    loaded = sys.modules.get(name)
    if loaded is not None:
        return getattr(loaded, "__file__", None)
    search: list[str] | None = [entry or os.getcwd() for entry in sys.path] + [os.getcwd()]
    found = None
    for part in name.split("."):
        if not part or search is None:
            return None
        try:
            found = PathFinder.find_spec(part, search)
        except (ImportError, ValueError):
            return None
        if found is None:
            return None
        search = list(found.submodule_search_locations) if found.submodule_search_locations is not None else None
    return found.origin if found is not None and found.has_location else None


def forget_outputs() -> None:
    """Start a new command: forget the outputs earlier commands of this process checked (flag_of names only this one's)."""
    _WRITTEN_BY.clear()
