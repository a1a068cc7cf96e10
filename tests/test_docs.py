"""Every example in docs/*.md runs and prints what the document shows (`make docs` refreshes them); the harness itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from docs_blocks import matches, needs_torch, parse, refreshed
from docs_run import REPO, check_document, documents, refresh_document, report, run_document


@pytest.mark.slow
@pytest.mark.parametrize("path", documents()[1:], ids=lambda p: str(p.relative_to(REPO)))
def test_document_examples_print_what_they_show(path: Path) -> None:
    """Each console block's commands of docs/*.md, run in order in one folder, exit 0 and print the output shown."""
    check_document(path)


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


def test_documents_that_profile_probe_or_train_are_the_ones_needing_torch() -> None:
    """Without torch a document is skipped only when a command profiles, probes, trains or runs Python."""
    assert needs_torch(parse((REPO / "README.md").read_text()))
    assert not needs_torch(parse((REPO / "docs" / "schedules.md").read_text()))
    assert needs_torch(parse("```console\n$ pipeplan train --local 2 --steps 1\n```\n"))
    assert not needs_torch(parse("```bash\n$ pipeplan train --local 2\n```\n"))
