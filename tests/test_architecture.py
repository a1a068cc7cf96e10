"""docs/architecture.md's package layout against src/pipeplan (a property of the docs and the tree).

The map (the block under "Package layout" from `src/pipeplan/` to `benchmarks/`) gives each package a paragraph
that starts with `  <package>/` at the line's start. Every module of a package (in a room too: planner/exact/space)
is named in its package's paragraph, and so is each room (`exact/`); a word of a paragraph with an underscore
(`plan_json`: a module's name, not prose) that names a module of another package only (a module that moved) is a
failure. One line per module names the module and
the paragraph to fix. The counts the document claims (no folder over 16 flat modules, no module name in two
packages) are checked, less the known exceptions below, which a later step empties: a new one fails.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "src" / "pipeplan"
MAX_FLAT_MODULES = 16

KNOWN_CROWDED: dict[str, int] = {}
"""Folders allowed over MAX_FLAT_MODULES, with their counts (none since issue 33; a count may only go down)."""
KNOWN_TWINS: set[str] = set()
"""Module names allowed in more than one package (none since issue 33; no new one may appear)."""
NOT_MODULES = {"__init__", "__main__"}


def modules() -> list[Path]:
    """Every module file of pipeplan's packages, relative to src/pipeplan (the top's __init__ and __main__ aside)."""
    return sorted(
        p.relative_to(SOURCE) for p in SOURCE.rglob("*.py") if len(p.relative_to(SOURCE).parts) > 1 and p.stem not in NOT_MODULES
    )


def paragraphs() -> dict[str, str]:
    """Each package's paragraph of the map, by package name."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text[text.index("\nsrc/pipeplan/\n") : text.index("\nbenchmarks/")]
    found: dict[str, str] = {}
    package = None
    for line in block.splitlines()[2:]:
        start = re.match(r"  (\w+)/ ", line)
        if start:
            package = start.group(1)
            found[package] = ""
        if package is not None:
            found[package] += line + "\n"
    return found


def named(word: str, paragraph: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(word)}(?![\w])", paragraph) is not None


def test_every_module_is_in_its_package_paragraph() -> None:
    text = paragraphs()
    failures = []
    for module in modules():
        package, *rooms, _ = module.parts
        if package not in text:
            failures.append(f"{module}: docs/architecture.md's map has no paragraph `  {package}/`")
            continue
        if not named(module.stem, text[package]):
            failures.append(f"{module}: not named in docs/architecture.md's map under {package}/ (add {module.stem!r})")
        for room in rooms:
            if f"{room}/" not in text[package]:
                failures.append(f"{module}: its room {room}/ is not named in the map under {package}/")
    assert not failures, "\n".join(failures)


def test_every_paragraph_is_a_package() -> None:
    packages = {p.name for p in SOURCE.iterdir() if (p / "__init__.py").is_file()}
    assert set(paragraphs()) == packages


def test_no_paragraph_names_a_module_of_another_package_only() -> None:
    """A module that moved: its old package's paragraph still names it (every name there is checked against the
    modules of every package)."""
    by_package: dict[str, set[str]] = {}
    for module in modules():
        by_package.setdefault(module.parts[0], set()).update({module.stem, *module.parts[1:-1]})
    everywhere = set().union(*by_package.values())
    failures = []
    for package, paragraph in paragraphs().items():
        # names written as modules: a word of the paragraph that names a module somewhere, but none of this package
        words = set(re.findall(r"(?<![\w.`])([a-z][a-z0-9_]*)(?![\w.(])", paragraph))
        for word in sorted(words & everywhere - by_package.get(package, set())):
            if "_" in word:
                owners = sorted(p for p, names in by_package.items() if word in names)
                failures.append(f"{package}/: the map names {word!r}, a module of {', '.join(owners)}/ only")
    assert not failures, "\n".join(failures)


def test_no_folder_holds_more_than_16_flat_modules() -> None:
    counts = Counter(str(m.parent) for m in modules())
    crowded = {folder: n for folder, n in counts.items() if n > MAX_FLAT_MODULES}
    new = {folder: n for folder, n in crowded.items() if n > KNOWN_CROWDED.get(folder, MAX_FLAT_MODULES)}
    assert not new, f"folders over {MAX_FLAT_MODULES} flat modules (or more crowded than known): {new}"


def test_no_module_name_in_two_packages() -> None:
    counts = Counter(m.stem for m in modules())
    twins = {name for name, n in counts.items() if n > 1}
    assert twins <= KNOWN_TWINS, f"new module names in two packages: {sorted(twins - KNOWN_TWINS)}"
