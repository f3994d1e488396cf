"""The package's import graph has no cycles (every import statement counts, also those inside functions)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "harness"


def import_graph() -> dict[str, set[str]]:
    """Module name -> the harness modules it imports anywhere in its source."""
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.glob("*.py"):
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level == 1:
                    names = [base.split(".")[0]] if base else [a.name for a in node.names]
                elif base == "harness":
                    names = [a.name for a in node.names]
                elif base.startswith("harness."):
                    names = [base.split(".")[1]]
            elif isinstance(node, ast.Import):
                names = [a.name.split(".")[1] for a in node.names if a.name.startswith("harness.")]
            deps.update(n for n in names if n in modules and n != path.stem)
        graph[path.stem] = deps
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(mod: str) -> list[str] | None:
        state[mod] = 1
        path.append(mod)
        for dep in sorted(graph.get(mod, ())):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        path.pop()
        state[mod] = 2
        return None

    for mod in sorted(graph):
        if mod not in state:
            found = visit(mod)
            if found:
                return found
    return None


def test_the_package_has_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_one():
    assert find_cycle({"cli": {"pipeline"}, "pipeline": {"report"}, "report": {"triage"}, "triage": {"cli"}}) == \
        ["cli", "pipeline", "report", "triage", "cli"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
