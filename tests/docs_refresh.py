"""`make docs`: run every example of README.md and docs/*.md and rewrite the output each shows with today's.

    python tests/docs_refresh.py [DOCUMENT ...]      (default: README.md and docs/*.md)

Only commands whose output no longer matches are rewritten; elisions (`...`) keep the lines around them and
masked blocks keep their marker. A command that exits non-zero is reported and its output written too, so
`git diff` shows what changed; the exit status is 1 when any command failed to exit 0.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from docs_run import documents, refresh_document, report, run_document


def main(argv: list[str]) -> int:
    """Refresh the named documents (or all); print what changed and how long each took."""
    paths = [Path(a).resolve() for a in argv] or documents()
    failed = 0
    for path in paths:
        outcomes, seconds = run_document(path)
        for outcome in outcomes:
            if outcome.status != 0:
                failed += 1
                print(report(path, outcome), file=sys.stderr)
        changed = refresh_document(path, outcomes)
        print(f"{path.name}: {len(outcomes)} commands in {seconds:.0f} s, {changed} rewritten")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
