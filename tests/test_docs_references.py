"""A property across packages: every dotted pipeplan name that the docs name resolves.

The rule: in the comments and strings (docstrings included) of src/pipeplan, and in README.md and docs/*.md, a
dotted name that starts with `pipeplan.` or with the name of one of pipeplan's packages (`sim.cost.layers`,
`core.plan.Plan`, `io.cluster_json`) names a module, or a module and then names defined in it: its longest part that
is a module file must exist, the next part must be defined at the top of that module (def, class, assignment or
import), and a part after a class must be defined in the class's body. A name like `models.py` or `docs/api.md`
(a file) is no reference. Resolved by reading the modules' files (ast), never importing them, so the test runs
without torch (`make test-fast`).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "src" / "pipeplan"
PACKAGES = tuple(sorted(p.name for p in SOURCE.iterdir() if (p / "__init__.py").is_file()))
# a dotted name that starts at a word boundary (not after a dot, a slash, a dash or another word's letters)
REFERENCE = re.compile(r"(?<![\w./-])((?:pipeplan|" + "|".join(PACKAGES) + r")(?:\.[A-Za-z_][A-Za-z0-9_]*)+)(?![\w/-])")
FILE_NAME = re.compile(r"(?<![\w./-])((?:[a-z_][a-z0-9_]*/)*[a-z_][a-z0-9_]*\.py)\b")
EXAMPLE_FILES = {"numpy.py", "torch.py", "pipeplan.py", "my_models.py", "my_model.py", "top.py", "file.py", "pkg/mod.py"}
"""Files of a user's (examples in messages: a module that shadows a package, a user's model file)."""
UPSTREAM_FILES = {"optimizer_graph_hierarchical.py", "optimizer/optimizer_graph_hierarchical.py"}
"""PipeDream's own files, which its baseline follows."""
FILE_SUFFIXES = {"py", "md", "json", "csv", "txt", "png", "toml", "yaml"}


def module_file(parts: tuple[str, ...]) -> Path | None:
    """The file of pipeplan module `parts` (relative to the pipeplan package), or None."""
    base = SOURCE.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@cache
def top_names(path: Path) -> dict[str, ast.AST]:
    """The names a module (or a class body, by its node) defines at its top: defs, classes, assignments, imports, and
    the names its `__all__` lists (pipeplan.api serves them lazily)."""
    return body_names(ast.parse(path.read_text()).body)


def root_names() -> dict[str, ast.AST]:
    """pipeplan's own names: its module's, and the API names it re-exports lazily (its `_API` tuple)."""
    names = dict(top_names(SOURCE / "__init__.py"))
    api = names["_API"]
    assert isinstance(api, ast.Assign)
    names.update({name: api for name in ast.literal_eval(api.value)})
    return names


def body_names(body: list[ast.stmt]) -> dict[str, ast.AST]:
    names: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        names[name.id] = node
                if isinstance(target, ast.Name) and target.id == "__all__":  # public names a module serves lazily
                    names.update({name: node for name in ast.literal_eval(node.value)})
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = node
        elif isinstance(node, ast.If | ast.Try):
            names.update(body_names(node.body))
    return names


def unresolved(reference: str) -> str | None:
    """Why `reference` does not resolve, or None when it does."""
    parts = tuple(reference.split("."))
    if parts[-1] in FILE_SUFFIXES:
        return None
    if parts[0] == "pipeplan":
        parts = parts[1:]
        if not parts:
            return None
    longest = max((n for n in range(len(parts) + 1) if module_file(parts[:n])), default=0)
    path = module_file(parts[:longest])
    assert path is not None
    names = top_names(path) if longest else root_names()
    for depth, part in enumerate(parts[longest:]):
        if part not in names:
            owner = ".".join(("pipeplan", *parts[: longest + depth]))
            return f"{owner} defines no {part!r}"
        node = names[part]
        if not isinstance(node, ast.ClassDef):
            return None  # a function's or a value's attributes are not followed
        names = body_names(node.body)
    return None


def text_references(text: str) -> list[tuple[int, str]]:
    """(line, name) of every reference in a Markdown text."""
    return [(text.count("\n", 0, match.start()) + 1, match.group(1).rstrip(".")) for match in REFERENCE.finditer(text)]


def source_references(path: Path) -> list[tuple[int, str]]:
    """(line, name) of every reference in a module's comments and strings (not its code)."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if token.type in (tokenize.COMMENT, tokenize.STRING):
            text = token.string
            if token.type == tokenize.STRING and "f" in text[: text.find(text[-1])].lower():
                text = re.sub(r"\{[^{}]*\}", "", text)  # an f-string's fields are code, not prose
            for offset, name in text_references(text):
                found.append((token.start[0] + offset - 1, name))
    return found


def all_references() -> list[tuple[str, int, str]]:
    found = [(str(p.relative_to(ROOT)), line, name) for p in sorted(SOURCE.rglob("*.py")) for line, name in source_references(p)]
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        found += [(str(doc.relative_to(ROOT)), line, name) for line, name in text_references(doc.read_text())]
    return found


def test_every_reference_resolves() -> None:
    failures = [f"{where}:{line}: {name}: {why}" for where, line, name in all_references() if (why := unresolved(name))]
    assert not failures, "references to no module or name:\n" + "\n".join(failures)


def test_every_file_name_exists() -> None:
    """A module's file named in a docstring or comment (`mapping.py`, `sim/trace.py`) exists in src, tests or
    benchmarks."""
    files = {str(p.relative_to(ROOT)) for p in ROOT.glob("*/**/*.py") if ".venv" not in p.parts}
    failures = []
    for path in sorted(SOURCE.rglob("*.py")):
        for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
            if token.type in (tokenize.COMMENT, tokenize.STRING):
                for match in FILE_NAME.finditer(token.string):
                    if match.group(1) in EXAMPLE_FILES | UPSTREAM_FILES:
                        continue
                    if not any(f == match.group(1) or f.endswith("/" + match.group(1)) for f in files):
                        failures.append(f"{path.relative_to(ROOT)}:{token.start[0]}: {match.group(1)}")
    assert not failures, "names of no file:\n" + "\n".join(failures)


def test_the_rule_can_fail() -> None:
    """The resolver refuses a moved module, a missing name and a missing class member, and passes real ones."""
    assert unresolved("sim.layer_costs") == "pipeplan.sim defines no 'layer_costs'"
    assert unresolved("pipeplan.no_such_function") == "pipeplan defines no 'no_such_function'"
    assert unresolved("pipeplan.distribute") is None  # re-exported lazily from pipeplan.api
    assert unresolved("pipeplan.sim.cost.layers.LayerCosts") is None
    assert unresolved("sim.cost.layers.NoSuchThing") == "pipeplan.sim.cost.layers defines no 'NoSuchThing'"
    assert unresolved("sim.cost.layers.LayerCosts.no_such_method") is not None
    assert unresolved("pipeplan.core") is None
    assert text_references("see docs/api.md and core.plan.Plan, or pipeplan.plan/1") == [(1, "core.plan.Plan")]
    assert unresolved("models.py") is None  # a file's name: test_every_file_name_exists checks it
