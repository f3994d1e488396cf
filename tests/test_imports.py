"""The package's import graph: no cycles, and the stages import only what they may (every import statement
counts, also those inside functions and under TYPE_CHECKING)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "harness"


def module_name(path: Path) -> str:
    """``harness/stages/build/build.py`` -> ``stages.build``; a package's ``__init__.py`` -> the package."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module name (dotted, below ``harness``) -> the harness modules it imports anywhere in its source.

    Relative imports are resolved against the module's package; ``from ..record import gpu`` counts as
    an import of ``record.gpu`` (and of the package ``record`` itself).
    """
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    graph: dict[str, set[str]] = {}
    for path in paths:
        name = module_name(path)
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        package = [p for p in package if p]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[list[str]] = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    anchor = package[:len(package) - (node.level - 1)] if node.level > 1 else package
                    base = anchor + (node.module.split(".") if node.module else [])
                elif node.module == "harness" or (node.module or "").startswith("harness."):
                    base = node.module.split(".")[1:]
                else:
                    continue
                targets = [base] + [base + [a.name] for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name.split(".")[1:] for a in node.names if a.name.startswith("harness.")]
            for target in targets:
                dotted = ".".join(target)
                if dotted in modules and dotted != name:
                    deps.add(dotted)
        graph[name] = deps
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


#: The packages a module under ``stages/`` may import (harness.stages.shape): the run's inputs, its record, what
#: all share, and the other stages; never ``analysis/``, ``tools/``, ``cli``, ``args`` or ``pipeline``.
STAGES_MAY_IMPORT = ("matrix", "record", "common", "stages")


def forbidden_stage_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(module, import) for every import of a module under ``stages`` outside :data:`STAGES_MAY_IMPORT`."""
    return sorted((mod, dep) for mod, deps in graph.items() if mod.split(".")[0] == "stages"
                  for dep in deps if dep.split(".")[0] not in STAGES_MAY_IMPORT)


def test_stages_import_only_matrix_record_common_and_other_stages():
    assert forbidden_stage_imports(import_graph()) == []


def test_nothing_under_stages_imports_the_pipeline_the_cli_analysis_or_tools():
    graph = import_graph()
    importers = {mod for mod, deps in graph.items() for dep in deps
                 if dep.split(".")[0] in ("analysis", "tools", "cli", "pipeline")}
    assert "commands" in importers and "analysis.forecast" in importers  # they are imported, by others
    assert not {m for m in importers if m.split(".")[0] == "stages"}


def test_the_rule_finds_a_forbidden_import():
    graph = {"stages.speed.speed": {"common.statistics", "analysis.report", "stages.shape"},
             "stages.build.build": {"pipeline", "record.results"}, "analysis.report": {"stages.shape"}}
    assert forbidden_stage_imports(graph) == [("stages.build.build", "pipeline"),
                                              ("stages.speed.speed", "analysis.report")]
