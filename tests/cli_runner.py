"""Shared by the CLI tests: run `pipeplan ARGS` in-process through main()."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
from typer.testing import CliRunner

from pipeplan.cli import app, main


def run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run `pipeplan ARGS` in-process through main(); return (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["pipeplan", *args])
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def simulate_json(*args: str) -> dict[str, Any]:
    """Run `pipeplan simulate ARGS --json` in-process and parse its stdout."""
    result = CliRunner().invoke(app, ["simulate", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)
