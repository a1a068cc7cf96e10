"""Which options of each command name files it reads and which name files it writes (and of what kind): one
declaration per command, read by the one output guard (cli.declared_files.check_files) before the command does any work.

An option is named as on the command line (`--out`), an argument by its name in capitals (`NAME`, `MODULE_SPEC`).
tests/test_cli_file_options.py walks the typer app: every option that takes text must be declared here or listed
there as naming no file, so a new file option cannot escape the guard.
"""

from __future__ import annotations

from dataclasses import replace

from pipeplan.api.outputs import CommandFiles
from pipeplan.api.train.train_flags import TRAIN_FILES
from pipeplan.io.file_kinds import (
    BANDWIDTH_TRACE,
    CLUSTER,
    PERFETTO,
    PLAN,
    PNG,
    PROFILE,
    FileKind,
)

DEMO_FOLDER = FileKind("demo folder", folder=True)
"""demo --out: a folder; the files in it are checked against the demo's manifest (cli.demo.demo_manifest)."""


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
    "train": replace(TRAIN_FILES, outputs={**TRAIN_FILES.outputs, "--trace": PERFETTO}),  # --trace: --timeline's old name
    "demo": CommandFiles(outputs={"--out": DEMO_FOLDER}),
}
"""Every command's files, by its name as typed after `pipeplan`."""
