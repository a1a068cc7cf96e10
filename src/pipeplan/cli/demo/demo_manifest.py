"""The demo's manifest: the files `pipeplan demo` wrote in its --out folder, each with its SHA-256, so a later run
replaces only those files, unchanged since, and never a same-named file of the user's.

The manifest is `.pipeplan-demo.json` in the folder: {"format": "pipeplan.demo/1", "files": {name: sha256}}. It is
rewritten (whole or not at all) after every step that writes, so an interrupted demo leaves every file it wrote
recorded, save at most the files of the step it was in (which a later run then refuses, naming them).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

from pipeplan.core.errors import OutputError
from pipeplan.io.atomic import non_regular_kind, write_text_atomic

MANIFEST = ".pipeplan-demo.json"
"""The manifest's name in the demo's folder."""
FORMAT = "pipeplan.demo/1"
"""The manifest's "format"."""
MANIFEST_MAX_BYTES = 1 << 20
"""The largest manifest read (a demo's lists about 20 names: a few KB)."""


def digest(path: Path) -> str:
    """The SHA-256 of the file at `path`, in hex."""
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def read_manifest(folder: Path, flag: str = "--out") -> dict[str, str]:
    """The files recorded in `folder`'s manifest (name -> SHA-256); empty when there is none.

    Raises:
        OutputError: the manifest is not a regular file, or not a manifest this demo wrote.
    """
    path = folder / MANIFEST
    if not os.path.lexists(path):
        return {}
    refuse = f"{flag} {str(folder)!r}: {MANIFEST} "
    kind = non_regular_kind(path)
    if kind is not None:
        raise OutputError(f"{refuse}is {kind}, not the demo's manifest: remove it, or give another {flag}")
    try:
        with open(path, "rb") as handle:
            text = handle.read(MANIFEST_MAX_BYTES + 1)
        obj = json.loads(text) if len(text) <= MANIFEST_MAX_BYTES else None
    except (OSError, ValueError):
        obj = None
    files = obj.get("files") if isinstance(obj, dict) and obj.get("format") == FORMAT else None
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        raise OutputError(f'{refuse}is not a manifest pipeplan demo wrote ("format": "{FORMAT}"): remove it, or give '
                          f"another {flag}")  # fmt: skip
    return dict(files)


def check_folder(out: str, names: Iterable[str], flag: str = "--out") -> None:
    """Before any work: each of `names` in folder `out` is absent, or a regular file the manifest records with its
    present SHA-256 (the demo wrote it, and nobody changed it since).

    Raises:
        OutputError: naming the first file that is not the demo's, and the way out.
    """
    folder = Path(out)
    if not folder.is_dir():
        return
    recorded = read_manifest(folder, flag)
    for name in names:
        path = folder / name
        if not os.path.lexists(path):
            continue
        kind = non_regular_kind(path)
        if kind is not None:
            raise OutputError(f"{flag} {out!r}: {name!r} is {kind}, not a regular file: move it away, or give another {flag}")
        if name not in recorded:
            why = f"was not written by pipeplan demo (it is not in {MANIFEST})"
        elif digest(path) != recorded[name]:
            why = "has changed since pipeplan demo wrote it"
        else:
            continue
        raise OutputError(
            f"{flag} {out!r}: {name!r} {why}; demo replaces only its own files: move it away, or give another {flag}"
        )


def record(folder: Path, paths: Iterable[Path]) -> None:
    """Add the files at `paths` (in `folder`) to the manifest with their SHA-256, rewriting it whole."""
    files = read_manifest(folder)
    files.update({path.name: digest(path) for path in paths})
    write_text_atomic(folder / MANIFEST, json.dumps({"format": FORMAT, "files": files}, indent=2, sort_keys=True) + "\n")
