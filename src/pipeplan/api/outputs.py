"""The one guard on output paths, run by every command that writes before it does any work.

An output is refused (OutputError, one line naming the flag and the path) when it
names an input of the same command (the same file through any symlink, hard link
or relative path), when two outputs of the command name the same path, when
something other than a regular file stands at it (a folder, a named pipe, a
device node, a socket, a symbolic link), when its folder does not exist (no
folder is created for it), or when it cannot be written. A folder output (a
checkpoint or gradient folder) must be a folder, or absent with an existing parent.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pipeplan.core.errors import OutputError
from pipeplan.io.atomic import non_regular_kind

IMAGE_SUFFIXES = (".png",)


@dataclass(frozen=True, slots=True)
class Output:
    """One output of a command: its flag, the path given (None: not given), whether it is a folder the command
    writes files into (else a file), and `suffixes`: for a file, the endings its name must have; for a folder, the
    file endings its name must not have (`--save-grads g.pt` is a slip, not a folder name)."""

    flag: str
    path: str | None
    suffixes: tuple[str, ...] = ()
    folder: bool = False


def _identity(path: str) -> tuple[object, ...]:
    """What two paths share when they name the same file: device and inode when it exists, else the resolved path."""
    try:
        info = os.stat(path)
    except OSError:
        return ("path", os.path.realpath(os.path.abspath(path)))
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


def _check_file(output: Output) -> None:
    """A file output: its suffix, what stands at it (absent or a regular file), its folder, permission."""
    flag, path = output.flag, output.path
    assert path is not None
    if output.suffixes and not path.lower().endswith(output.suffixes):
        raise OutputError(f"{flag} {path!r} must end with {' or '.join(output.suffixes)}")
    kind = non_regular_kind(path)
    if kind is not None:
        raise OutputError(f"{flag} {path!r} is {kind}, not a regular file; pipeplan writes only regular files: give another path")
    _check_parent(flag, path)
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise OutputError(f"{flag} {path!r} cannot be written (no permission)")


def _check_folder(output: Output) -> None:
    """A folder output: an existing folder (a link to one is followed), or absent in an existing folder."""
    flag, path = output.flag, output.path
    assert path is not None
    if os.path.isdir(path):
        if not os.access(path, os.W_OK):
            raise OutputError(f"{flag} {path!r} cannot be written (no permission)")
        return
    if os.path.lexists(path):
        kind = non_regular_kind(path) or "a file"
        raise OutputError(f"{flag} {path!r} is {kind}, not a folder")
    for suffix in output.suffixes:
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
    for output in given:
        (_check_folder if output.folder else _check_file)(output)
    seen: dict[tuple[object, ...], Output] = {}
    for output in given:
        assert output.path is not None
        key = _identity(output.path)
        first = seen.setdefault(key, output)
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


def plan_inputs(plan: str | None, profile: str | None, cluster: str | None) -> dict[str, str | None]:
    """The inputs of a command run on plan file `plan`: the plan, and the profile and cluster it names where
    --profile or --cluster does not replace them (resolved as read_plan resolves them); a plan that cannot be read
    names none here."""
    inputs: dict[str, str | None] = {"--plan": plan, "--profile": profile, "--cluster": cluster}
    if plan is None or (profile is not None and cluster is not None) or not os.path.isfile(plan):
        return inputs  # a pipe is read once, by the command itself
    from pipeplan.core.errors import PipeplanError
    from pipeplan.presets.resolve import load_plan

    try:
        _, names = load_plan(plan, profile)
    except (PipeplanError, OSError, UnicodeDecodeError):
        return inputs  # reading it again fails the command, with this error, before anything is written
    if profile is None:
        inputs[f"profile of the plan {plan}"] = names.get("profile")
    if cluster is None:
        inputs[f"cluster of the plan {plan}"] = names.get("cluster")
    return inputs
