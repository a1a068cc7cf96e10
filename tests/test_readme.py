"""README.md's examples run and print what it shows, and they bring a model and a cluster that are not built in."""

from __future__ import annotations

import pytest

from docs_blocks import parse
from docs_run import REPO, check_document

README = REPO / "README.md"


@pytest.mark.slow
def test_readme_examples_print_what_they_show() -> None:
    """Every console block of the README, run in order in one folder, exits 0 and prints the output shown."""
    check_document(README)


def test_readme_brings_a_model_that_is_not_built_in() -> None:
    """README writes the reader's own model file and runs profile, probe, plan and train on it and on its own cluster."""
    steps = parse(README.read_text())
    files = {s.file_name for s in steps if s.file_name}
    commands = [c.text for s in steps for c in s.commands]
    assert "my_model.py" in files and "my_cluster.json" in files
    chain = ["pipeplan profile my_model:", "pipeplan probe --local 2", "--cluster my_cluster.json", "train --local 2 --plan"]
    positions = [next(i for i, c in enumerate(commands) if step in c) for step in chain]
    assert positions == sorted(positions)
