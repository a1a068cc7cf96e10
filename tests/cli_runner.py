"""Shared by the CLI tests: run `pipeplan ARGS` in-process through main()."""

from __future__ import annotations

import sys

import pytest

from pipeplan.cli import main


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
