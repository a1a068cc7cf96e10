"""Every example in README.md and docs/*.md runs and prints what the document shows (`make docs` refreshes them)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from docs_blocks import matches, needs_torch, parse, refreshed
from docs_run import REPO, documents, refresh_document, report, run_document

HAS_TORCH = importlib.util.find_spec("torch") is not None


@pytest.mark.slow
@pytest.mark.parametrize("path", documents(), ids=lambda p: str(p.relative_to(REPO)))
def test_document_examples_print_what_they_show(path: Path) -> None:
    """Each console block's commands, run in order in one folder, exit 0 and print the output shown."""
    steps = parse(path.read_text())
    if not any(s.commands for s in steps):
        pytest.skip("no console blocks")
    if needs_torch(steps) and not HAS_TORCH:
        pytest.skip("its examples profile, probe or train: they need the torch extra")
    outcomes, seconds = run_document(path)
    failures = [report(path, o) for o in outcomes if not o.ok]
    assert not failures, f"{len(failures)} of {len(outcomes)} examples differ ({seconds:.0f} s); `make docs` rewrites them:\n" + (
        "\n\n".join(failures)
    )


def test_readme_brings_a_model_that_is_not_built_in() -> None:
    """README writes the reader's own model file and runs profile, probe, plan and train on it and on its own cluster."""
    steps = parse((REPO / "README.md").read_text())
    files = {s.file_name for s in steps if s.file_name}
    commands = [c.text for s in steps for c in s.commands]
    assert "my_model.py" in files and "my_cluster.json" in files
    chain = ["pipeplan profile my_model:", "pipeplan probe --local 2", "--cluster my_cluster.json", "pipeplan train --local 2"]
    positions = [next(i for i, c in enumerate(commands) if step in c) for step in chain]
    assert positions == sorted(positions)


def test_parse_finds_commands_outputs_files_and_markers() -> None:
    """Commands (with continuations), their outputs, file and masked markers are read; other blocks are not run."""
    text = "\n".join(
        [
            "<!-- docs-test: file sub/a.txt -->",
            "```text",
            "hello",
            "```",
            "```bash",
            "$ not run",
            "```",
            "<!-- docs-test: masked -->",
            "```console",
            "$ cat sub/a.txt \\",
            "    | wc -l",
            "1",
            "$ echo 2.5",
            "2.5",
            "",
            "```",
        ]
    )
    steps = parse(text)
    assert [s.file_name for s in steps] == ["sub/a.txt", None]
    assert steps[0].file_text == "hello\n"
    first, second = steps[1].commands
    assert first.text == "cat sub/a.txt \\\n    | wc -l" and first.expected == ["1"] and first.masked
    assert (second.line, second.expected, second.output_start) == (13, ["2.5"], 13)


def test_elision_matches_any_number_of_lines_and_nothing_else() -> None:
    """`...` stands for zero or more lines; every other line must be equal."""
    assert matches(["a", "...", "d"], ["a", "b", "c", "d"])
    assert matches(["a", "...", "b"], ["a", "b"])
    assert not matches(["a", "...", "d"], ["a", "b", "c"])
    assert not matches(["a", "b"], ["a", "b", "c"])


def test_masked_compares_numbers_as_placeholders_and_words_exactly() -> None:
    """In a masked block numbers and the padding around them may change, the words may not."""
    assert matches(["│ time (ms) │   52.99 │"], ["│ time (ms) │ 153.1 │"], masked=True)
    assert not matches(["│ time (ms) │ 52.99 │"], ["│ time (ms) │ 53.00 │"])
    assert not matches(["time 52.99 ms"], ["time 52.99 s"], masked=True)


def test_refresh_keeps_the_lines_around_each_elision() -> None:
    """A refreshed output keeps as many lines before, between and after the `...` as the document had."""
    got = ["h1", "h2", "x", "mid 7", "y", "z", "t1"]
    assert refreshed(["h1", "...", "mid 3", "...", "old"], got) == ["h1", "...", "mid 7", "...", "t1"]
    assert refreshed(["a", "b"], got) == got
    assert refreshed(["a", "...", "b"], ["only"]) == ["only"]


def test_a_failed_example_is_reported_and_refreshed_in_place(tmp_path: Path) -> None:
    """A wrong output fails with the line and a diff, and the refresh rewrites it so it passes."""
    doc = tmp_path / "doc.md"
    doc.write_text(
        'Intro\n\n```console\n$ echo one; echo two; echo three\none\n...\nfour\n$ false; echo "exit $?"\nexit 1\n```\n'
    )
    outcomes, _ = run_document(doc)
    assert [o.ok for o in outcomes] == [False, True]
    assert "doc.md:4: $ echo one" in report(doc, outcomes[0]) and "+three" in report(doc, outcomes[0])
    assert refresh_document(doc, outcomes) == 1
    assert "one\n...\nthree\n" in doc.read_text()
    assert all(o.ok for o in run_document(doc)[0])
