"""Every command's file options are declared once (cli.file_options), so the one output guard knows them all: a text
option added to any command fails here until it is declared an input, an output, a module, or listed below as
naming no file."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from typer.main import get_command

from pipeplan.cli import app
from pipeplan.cli.file_options import COMMAND_FILES

NOT_FILES: dict[str, tuple[str, ...]] = {
    "schedule": ("--format",),
    "simulate": ("--fwd", "--bwd", "--comm", "--act-bytes", "--bwd-input", "--bwd-weight", "--batch-scaling", "--optimizer"),
    "profile": ("--batch-sizes", "--project-to", "--dtype", "--precision", "--dataset", "--opt", "--device"),
    "probe": ("--name", "--optimizer"),
    "plan": (
        "--planner",
        "--schedule",
        "--batch-scaling",
        "--optimizer",
        "--replication",
        "--memory-budget",
        "--time-budget",
        "--sequence-parallel",
    ),
    "compare": ("--planners", "--schedule", "--batch-scaling", "--optimizer", "--replication", "--time-budget"),
    "adapt": ("--batch-scaling", "--optimizer", "--memory-budget"),
    "train": (
        "--replicas",
        "--opt",
        "--dataset",
        "--dtype",
        "--precision",
        "--lr-schedule",
        "--optimizer",
        "--batch-scaling",
        "--backend",
        "--memory-budget",
    ),
    "trace periodic": ("--links",),
    "trace markov": ("--factor-range", "--links"),
    "trace replay": ("--links",),
}
"""Text options that name no file: numbers, lists, choices, names of built-ins only (by command)."""


def commands() -> Iterator[tuple[str, Any]]:
    """Every command of the typer app, by its name as typed after `pipeplan`, with its click command."""

    def walk(command: Any, path: list[str]) -> Iterator[tuple[str, Any]]:
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                yield from walk(sub, [*path, name])
        else:
            yield " ".join(path), command

    yield from walk(get_command(app), [])


def key(param: Any) -> str:
    """An option as its first flag, an argument as its name in capitals (as cli.file_options names them)."""
    return param.opts[0] if param.param_type_name == "option" else (param.name or "").upper()


def text_options(command: Any) -> set[str]:
    """The options and arguments of `command` that take text (a path could be given to any of them)."""
    return {key(p) for p in command.params if p.type_descriptor.annotation in (str, list[str])}


COMMANDS = dict(commands())


def test_every_command_is_declared() -> None:
    """The declaration lists exactly the app's commands."""
    assert sorted(COMMAND_FILES) == sorted(COMMANDS)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_text_option_is_declared_a_file_or_named_as_none(name: str) -> None:
    """A command's text options are exactly its declared inputs, outputs and modules and the ones naming no file."""
    files = COMMAND_FILES[name]
    declared = set(files.inputs) | set(files.outputs) | set(files.modules)
    assert not declared & set(NOT_FILES.get(name, ())), name
    assert text_options(COMMANDS[name]) == declared | set(NOT_FILES.get(name, ())), name


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_plan_option_is_an_input(name: str) -> None:
    """A plan option (whose profile and cluster are read too) is one of the command's inputs."""
    files = COMMAND_FILES[name]
    assert set(files.plans) <= set(files.inputs)
