"""Drift between the words and the tree, caught: every dotted ``harness.…`` name that a docstring (of harness/,
tests/ and benchmarks/) or a page (README.md, docs/*.md) cites resolves to a module and the attributes under it,
and every path that README.md and docs/layout.md name in a code span is in the checkout.

A docstring is a module's, a class's or a function's, or a ``#:`` comment before a constant or a field.
A name resolves as Python would find it: the longest prefix that imports as a module, then each further part
as an attribute, a dataclass field, an annotated or ``self.`` attribute of a class.  A mutant's name that
mutmut prints (``harness.common.statistics.x_judge__mutmut_12``) resolves when the function it mutates does.
A path resolves against the checkout's root, ``harness/`` or ``harness/stages/`` (the pages name the package's
modules from those), or is what a run writes (git ignores it); the few paths that name something outside the
tree on purpose are listed in :data:`NOT_IN_THE_TREE`, each with its reason.  tests/test_docs.py checks the
links, the nox sessions and the paths rooted at a top-level entry of every page; this adds what it does not.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

from test_docs import NOT_A_PATH, checkout_entries, code_words, git_ignored, line_of, parse

ROOT = Path(__file__).resolve().parents[1]

#: A dotted name of the package, not part of a longer word or path.
DOTTED = re.compile(r"(?<![\w./-])harness(?:\.[A-Za-z_]\w*)+")

#: A mutant's name, as mutmut writes it: ``x_<function>__mutmut_<n>`` (``x_<class>ǁ<method>…`` is not used here).
MUTANT = re.compile(r"^x_(\w+?)__mutmut_\d+$")

#: The source trees whose docstrings are read.
SOURCES = ("harness", "tests", "benchmarks")

#: The pages whose paths are held to the tree.
PATH_PAGES = ("README.md", "docs/layout.md")

#: The folders a page names the package's modules from (``stages/shape.py``, ``building/builds.py``).
PATH_BASES = ("", "harness/", "harness/stages/")

#: (page, path) named on purpose for something that is not in the tree, each with its reason.
NOT_IN_THE_TREE = {
    ("README.md", "llama.cpp/tests/CMakeLists.txt"): "a file of upstream's tree, which a patch touches",
    ("docs/layout.md", "stages/checks/generate_budget.py"): "the example module of 'adding a check', not in the "
                                                             "package",
    ("docs/layout.md", "kinds/rocm.py"): "the example module of 'adding a platform kind', not in the package",
    ("docs/layout.md", "kinds/rocm_probe.h"): "the example probe header of 'adding a platform kind', not in the package",
    ("docs/layout.md", "record/results.py"): "history: the module that was split",
    ("docs/layout.md", "speed/bench.json"): "a file a run writes under <platform>/ (the table of run files)",
}


def _attribute(owner: object, name: str) -> tuple[bool, object]:
    """(found, value) of attribute ``name`` of ``owner``: a real attribute, a dataclass field, an annotated
    attribute, or one a class's methods assign as ``self.name``; the value is None where only the name is
    declared."""
    if hasattr(owner, name):
        return True, getattr(owner, name)
    if name in getattr(owner, "__dataclass_fields__", {}) or name in getattr(owner, "__annotations__", {}):
        return True, None
    if inspect.isclass(owner):
        try:
            source = inspect.getsource(owner)
        except (OSError, TypeError):
            return False, None
        return bool(re.search(rf"\bself\.{re.escape(name)}\s*(?::[^=\n]+)?=", source)), None
    return False, None


def resolves(name: str) -> bool:
    """True when dotted ``name`` (``harness.stages.outputs.engine.EngineSession.facts``) names a module of the
    package and attributes under it (see the module's docstring); an import error of a module that does exist
    is raised, not taken for a stale name."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        module = ".".join(parts[:i])
        try:
            owner: object = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name and (module == e.name or module.startswith(e.name + ".")):
                continue
            raise
        for part in parts[i:]:
            mutant = MUTANT.match(part)
            found, owner = _attribute(owner, mutant.group(1) if mutant else part)
            if not found:
                return False
            if owner is None and part != parts[-1]:
                return True  # a declared field: what lies under it is its type's, not checked here
        return True
    return False


def names_in(text: str) -> list[tuple[int, str]]:
    """(line within ``text``, name) of every dotted ``harness.…`` name in ``text``."""
    return [(text.count("\n", 0, m.start()) + 1, m.group().rstrip(".")) for m in DOTTED.finditer(text)]


def docstrings(source: str) -> list[tuple[int, str]]:
    """(line, text) of every docstring of a module's ``source``: the module's, each class's and function's, and
    each ``#:`` comment that documents a constant or a field (as Sphinx reads it)."""
    tree = ast.parse(source)
    found = [(n, line.split("#:", 1)[1]) for n, line in enumerate(source.splitlines(), 1)
             if line.lstrip().startswith("#:")]
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body[0] if node.body else None
            if isinstance(body, ast.Expr) and isinstance(body.value, ast.Constant) and isinstance(body.value.value, str):
                found.append((body.lineno, body.value.value))
    return found


def name_problems(texts: dict[str, str], *, python: bool) -> list[str]:
    """``where:line: name`` for every dotted name that does not resolve, in ``texts`` ({path: text}): the
    docstrings of Python sources when ``python``, else the whole of Markdown pages."""
    problems = []
    for where, text in texts.items():
        for start, chunk in docstrings(text) if python else [(1, text)]:
            for line, name in names_in(chunk):
                if not resolves(name):
                    problems.append(f"{where}:{start + line - 1}: {name} does not exist")
    return problems


def path_problems(page: str, text: str) -> list[str]:
    """``page:line: path`` for every path ``text`` names in a code span or a shell block (a word with a ``/``,
    no placeholder) that is in none of :data:`PATH_BASES`, not written by a run and not listed in
    :data:`NOT_IN_THE_TREE`."""
    files, dirs = checkout_entries(ROOT)
    named = []
    for tok, content, offset, word in code_words(parse(text)):
        word = word.rstrip(".,;")
        path = word.rstrip("/")
        if NOT_A_PATH.search(path) or path.startswith(("-", "/", "~")) or "/" not in word:
            continue
        if (page, path) in NOT_IN_THE_TREE or any(base + path in files | dirs for base in PATH_BASES):
            continue
        named.append((line_of(tok, content, offset), path))
    ignored = git_ignored(ROOT, sorted({p for _, p in named}))
    return [f"{page}:{line}: path {path} is not in the tree" for line, path in named if path not in ignored]


def _sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for base in SOURCES
            for p in sorted((ROOT / base).rglob("*.py"))}


def _pages() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8")
            for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}


def test_every_dotted_name_a_docstring_cites_exists():
    problems = name_problems(_sources(), python=True)
    assert problems == [], "\n".join(problems)


def test_every_dotted_name_a_page_cites_exists():
    problems = name_problems(_pages(), python=False)
    assert problems == [], "\n".join(problems)


def test_every_path_the_readme_and_the_layout_name_exists():
    pages = _pages()
    problems = [p for page in PATH_PAGES for p in path_problems(page, pages[page])]
    assert problems == [], "\n".join(problems)


def test_every_path_named_on_purpose_is_still_named_and_still_absent():
    pages = _pages()
    files, dirs = checkout_entries(ROOT)
    for page, path in NOT_IN_THE_TREE:
        assert f"`{path}`" in pages[page], (page, path)
        assert not any(base + path in files | dirs for base in PATH_BASES), (page, path)


@pytest.mark.parametrize("name, stale", [
    ("harness.stages.outputs.compare.first_divergence", "harness.stages.outputs.compare.compare_outputs"),
    ("harness.matrix.moe_generator.generate_synthetic_moe", "harness.matrix.synthetic_moe.generate_synthetic_moe"),
    ("harness.stages.outputs.engine.EngineSession.facts", "harness.stages.outputs.engine.EngineSession.fact"),
    ("harness.stages.options.Options.lanes", "harness.stages.options.Options.lane"),
    ("harness.common.statistics.x_judge__mutmut_12", "harness.common.statistics.x_judged__mutmut_12"),
])
def test_a_stale_name_is_found_where_it_is_planted(name, stale):
    source = f'"""The module (see {name})."""\n\n\ndef f():\n    """Calls {name}."""\n'
    assert name_problems({"harness/x.py": source}, python=True) == []
    planted = source.replace(name, stale)
    assert name_problems({"harness/x.py": planted}, python=True) == \
        [f"harness/x.py:1: {stale} does not exist", f"harness/x.py:5: {stale} does not exist"]
    page = f"# A page\n\nThe rule is `{name}`; see {name}.\n"
    assert name_problems({"docs/x.md": page.replace(name, stale)}, python=False) == \
        [f"docs/x.md:3: {stale} does not exist"] * 2


def test_a_stale_path_is_found_where_it_is_planted():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = readme.count("\n")
    planted = readme + "\nThe stages: `stages/build/`, `stages/building/`, `building/builds.py`.\n"
    assert path_problems("README.md", planted) == [f"README.md:{lines + 2}: path stages/build is not in the tree"]
