"""Which options of each command name files it reads and which name files it writes (and of what kind): one
declaration per command, read by the one output guard (cli.declared_files.check_files) before the command does any work.

An option is named as on the command line (`--out`), an argument by its name in capitals (`NAME`, `MODULE_SPEC`).
tests/test_cli_file_options.py walks the typer app: every option that takes text must be declared here or listed
there as naming no file, so a new file option cannot escape the guard.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pipeplan.io.file_kinds import (
    BANDWIDTH_TRACE,
    CLUSTER,
    FOLDER,
    GRADS_FOLDER,
    PERFETTO,
    PLAN,
    PNG,
    PROFILE,
    FileKind,
)

DEMO_FOLDER = FileKind("demo folder", folder=True)
"""demo --out: a folder; the files in it are checked against the demo's manifest (cli.demo.demo_manifest)."""


@dataclass(frozen=True, slots=True)
class CommandFiles:
    """The files one command reads and writes.

    `inputs`: options whose value is a file read (or a built-in name, which names no file); `plans`: those of
    `inputs` that are plan files, whose profile and cluster are read too; `modules`: options whose MODULE_SPEC's
    module file (`pkg.mod:factory` -> pkg/mod.py) is imported; `outputs`: each written option and its kind.
    """

    inputs: tuple[str, ...] = ()
    outputs: Mapping[str, FileKind] = field(default_factory=dict)
    plans: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()


_TRACE_GENERATOR = CommandFiles(inputs=("--cluster",), outputs={"--out": BANDWIDTH_TRACE})

COMMAND_FILES: dict[str, CommandFiles] = {
    "schedule": CommandFiles(inputs=("NAME",)),
    "simulate": CommandFiles(
        inputs=("NAME", "--plan", "--profile", "--cluster", "--bandwidth-trace"),
        outputs={"--timeline": PERFETTO, "--trace": PERFETTO, "--png": PNG},
        plans=("--plan",),
    ),
    "show profile": CommandFiles(inputs=("SPEC",)),
    "show cluster": CommandFiles(inputs=("SPEC",), outputs={"--png": PNG}),
    "show profiles": CommandFiles(),
    "show clusters": CommandFiles(),
    "profile": CommandFiles(outputs={"--out": PROFILE}, modules=("MODULE_SPEC", "--data", "--loss")),
    "probe": CommandFiles(inputs=("--profile",), outputs={"--out": CLUSTER}, modules=("--module",)),
    "plan": CommandFiles(inputs=("--profile", "--cluster", "--bandwidth-trace"), outputs={"--out": PLAN}),
    "compare": CommandFiles(inputs=("--profile", "--cluster"), outputs={"--png": PNG}),
    "adapt": CommandFiles(
        inputs=("--plan", "--bandwidth-trace", "--profile", "--cluster"), outputs={"--png": PNG}, plans=("--plan",)
    ),
    "trace periodic": _TRACE_GENERATOR,
    "trace markov": _TRACE_GENERATOR,
    "trace replay": CommandFiles(inputs=("SERIES", "--cluster"), outputs={"--out": BANDWIDTH_TRACE}),
    "train": CommandFiles(
        inputs=("--plan", "--schedule", "--profile", "--cluster", "--bandwidth-trace"),
        outputs={
            "--timeline": PERFETTO,
            "--trace": PERFETTO,
            "--png": PNG,
            "--save-grads": GRADS_FOLDER,
            "--checkpoint-dir": FOLDER,
        },
        plans=("--plan",),
        modules=("--module", "--data", "--loss"),
    ),
    "demo": CommandFiles(outputs={"--out": DEMO_FOLDER}),
}
"""Every command's files, by its name as typed after `pipeplan`."""
