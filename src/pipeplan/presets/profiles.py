"""The built-in layer profiles shipped in presets/profiles/: names and their files.

A built-in name is `folder/model`: the file name without `-pbs-N.txt`, any
suffix after it kept (`dapple/gnmt-32-pbs-64-simplified.txt` is
`dapple/gnmt-32-simplified`).
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

PROFILE_FOLDERS = ("dapple", "pipedream")
REFERENCE_DEVICE = "V100"
"""Every built-in profile was measured on an NVIDIA V100 (see profiles/README.md)."""

_PBS_FILE = re.compile(r"(?P<model>.+?)-pbs-(?P<batch>\d+)(?P<suffix>-[^.]*)?\.txt")


@cache
def builtin_profile_files() -> dict[str, str]:
    """Map each built-in profile name to its package-relative file path (`profiles/dapple/bert-48-pbs-2.txt`)."""
    root = resources.files("pipeplan.presets") / "profiles"
    found: dict[str, str] = {}
    for folder in PROFILE_FOLDERS:
        for entry in sorted((root / folder).iterdir(), key=lambda e: e.name):
            match = _PBS_FILE.fullmatch(entry.name)
            if match is None:
                continue
            name = f"{folder}/{match['model']}{match['suffix'] or ''}"
            if name in found:
                raise RuntimeError(f"two built-in profiles are both named {name!r}: {found[name]} and {entry.name}")
            found[name] = f"profiles/{folder}/{entry.name}"
    return dict(sorted(found.items()))


def builtin_profile_text(name: str) -> tuple[str, str]:
    """(file name relative to presets/, text) of a built-in profile; KeyError when unknown."""
    relative = builtin_profile_files()[name]
    return relative, (resources.files("pipeplan.presets") / relative).read_text(encoding="utf-8")
