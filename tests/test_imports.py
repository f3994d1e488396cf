"""The package's import graph: no cycles, and the stages and each room of the tools that read a run import only what
they may (every import statement counts, also those inside functions and under TYPE_CHECKING)."""

import ast
import shutil
from functools import cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "harness"


def module_name(path: Path, package: Path = PACKAGE) -> str:
    """``harness/stages/building/build.py`` -> ``stages.building.build``; a package's ``__init__.py`` -> the package."""
    parts = path.relative_to(package).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module name (dotted, below ``harness``) -> the harness modules it imports anywhere in its source, for the
    package at ``package`` (default: this checkout's ``harness/``).  Read once per package path in a test process
    (the checkout's does not change while the tests run; a planted copy is a path of its own); not to be changed.

    Relative imports are resolved against the module's package; ``from ..record import gpu`` counts as
    an import of ``record.gpu`` (and of the package ``record`` itself).
    """
    paths = sorted(package.rglob("*.py"))
    modules = {module_name(p, package) for p in paths}
    graph: dict[str, set[str]] = {}
    for path in paths:
        name = module_name(path, package)
        anchors = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        anchors = [p for p in anchors if p]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[list[str]] = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    anchor = anchors[:len(anchors) - (node.level - 1)] if node.level > 1 else anchors
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
#: all share, and the other stages; never the tools' rooms (``triage/``, ``views/``, ``bisect/``, ``upstream/``),
#: ``tools/``, ``cli``, ``args`` or ``pipeline``.
STAGES_MAY_IMPORT = ("kinds", "matrix", "record", "common", "stages")


def forbidden_stage_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(module, import) for every import of a module under ``stages`` outside :data:`STAGES_MAY_IMPORT`."""
    return sorted((mod, dep) for mod, deps in graph.items() if mod.split(".")[0] == "stages"
                  for dep in deps if dep.split(".")[0] not in STAGES_MAY_IMPORT)


def test_stages_import_only_matrix_record_common_and_other_stages():
    assert forbidden_stage_imports(import_graph()) == []


def test_nothing_under_stages_imports_the_pipeline_the_cli_the_tools_rooms_or_tools():
    graph = import_graph()
    importers = {mod for mod, deps in graph.items() for dep in deps
                 if dep.split(".")[0] in (*TOOL_ROOMS, "tools", "cli", "pipeline")}
    assert "commands" in importers and "upstream.forecast" in importers  # they are imported, by others
    assert not {m for m in importers if m.split(".")[0] == "stages"}


#: What the tools that read a run may import, room by room (each a package under ``harness/``, docs/layout.md), data
#: flowing one way: triage reads the record; the views read triage's records (signatures, which runs to compare);
#: bisect runs the stages again and writes the views; upstream tracking (forecast, roll) may use all of them. Every
#: room may also import the run's frame: the package itself (``""``), ``common``, ``kinds``, ``matrix``, ``record``,
#: ``stages``, ``args`` and ``cli`` (a command's own parser).
FRAME = ("", "common", "kinds", "matrix", "record", "stages", "args", "cli")
TOOL_ROOMS = {
    "triage": FRAME,
    "views": (*FRAME, "triage"),
    "bisect": (*FRAME, "pipeline", "triage", "views"),
    "upstream": (*FRAME, "pipeline", "triage", "views", "bisect"),
}
#: The tool rooms no other module imports: upstream tracking is used by none (the command line names it as a
#: ``module:function`` string, harness.cli).
USED_BY_NONE = ("upstream",)


def forbidden_tool_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(module, import) for every import of a tool room's module outside its own room and :data:`TOOL_ROOMS`, and
    for every import of a room of :data:`USED_BY_NONE` by a module of another room."""
    found = []
    for mod, deps in graph.items():
        here = mod.split(".")[0]
        for dep in deps:
            there = dep.split(".")[0]
            if here in TOOL_ROOMS and there != here and there not in TOOL_ROOMS[here] or \
                    there in USED_BY_NONE and there != here:
                found.append((mod, dep))
    return sorted(found)


def test_each_tool_room_imports_only_the_rooms_below_it():
    graph = import_graph()
    assert forbidden_tool_imports(graph) == []
    assert {m.split(".")[0] for m in graph} >= set(TOOL_ROOMS)  # the rooms are there to be judged


def test_the_tool_room_rule_finds_an_import_the_wrong_way():
    graph = {"triage.triage": {"views.report", "record.summary"}, "views.report": {"triage.signatures"},
             "bisect.points": {"upstream.forecast", "views.run_views"}, "commands": {"upstream.roll", "views.run_views"},
             "upstream.roll": {"bisect", "pipeline", "upstream.forecast"}, "views.svg": {"tools.bench"}}
    assert forbidden_tool_imports(graph) == [("bisect.points", "upstream.forecast"), ("commands", "upstream.roll"),
                                             ("triage.triage", "views.report"), ("views.svg", "tools.bench")]


def test_a_planted_import_of_upstream_tracking_in_triage_is_found(tmp_path):
    """The rule reads the real source: triage asking the forecast for something, the way a patch would write it."""
    copy = tmp_path / "harness"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    planted = copy / "triage" / "run_choice.py"
    planted.write_text(planted.read_text(encoding="utf-8") +
                       "\n\ndef onto_of(text):\n    from ..upstream.forecast import parse_onto\n"
                       "    return parse_onto(text)\n", encoding="utf-8")
    assert forbidden_tool_imports(import_graph(copy)) == [("triage.run_choice", "upstream.forecast")]


def test_the_rule_finds_a_forbidden_import():
    graph = {"stages.speed.speed": {"common.statistics", "views.report", "stages.shape"},
             "stages.building.build": {"pipeline", "record.run"}, "views.report": {"stages.shape"}}
    assert forbidden_stage_imports(graph) == [("stages.building.build", "pipeline"),
                                              ("stages.speed.speed", "views.report")]


def kind_compares(source: str) -> list[int]:
    """Line numbers of ``source`` that decide a platform kind by comparing values: a compare (``==``, ``!=``,
    ``in``, ``not in``) of a ``gpu`` or ``os`` name or attribute (``p.gpu == "nvidia"``, ``q.os != host_os()``),
    or of a string that names a GPU kind or an OS of harness.kinds (``"windows" == label``)."""
    from harness.kinds.registry import GPUS, OSES
    names = (set(GPUS) | set(OSES)) - {"none"}  # "none" is also a load mode and a CLI value
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare) or not any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn))
                                                          for op in node.ops):
            continue
        operands = [node.left, *node.comparators]
        if any(isinstance(o, ast.Attribute) and o.attr in ("gpu", "os") or isinstance(o, ast.Name) and o.id in ("gpu", "os")
               or isinstance(o, ast.Constant) and o.value in names for o in operands):
            lines.append(node.lineno)
    return lines


def test_only_harness_kinds_compares_a_platform_kind():
    """A platform's GPU kind and OS are asked of their records (harness.kinds), never compared with a value."""
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}" for path in sorted(PACKAGE.rglob("*.py"))
             if path.relative_to(PACKAGE).parts[0] != "kinds"
             for line in kind_compares(path.read_text(encoding="utf-8"))]
    assert found == []


def test_the_kind_rule_finds_the_compares_a_stage_would_write():
    source = ('if p.gpu == "nvidia": pass\n'
              'ok = q.os != host_os()\n'
              'shell = "pwsh" if "windows" == runner else "bash"\n'
              'win = label in ("windows",)\n'
              'gpu_steps = p.ci.gpu_steps == ()\n'
              'mode = args.load_mode == "none"\n')
    assert kind_compares(source) == [1, 2, 3]


def room(module: str) -> str:
    """The room of a module: its folder under ``stages/`` (``stages.building``), else its top-level package or module
    (``views``, ``pipeline``).  Under ``stages/`` itself, ``table.py``, the list of every stage room's stages,
    is a room of its own (``stages.table``), above the rooms; the frame every stage fits, ``shape.py`` and
    ``options.py``, is the room ``stages``, below them."""
    parts = module.split(".")
    if parts[:2] == ["stages", "table"]:
        return "stages.table"
    return ".".join(parts[:2]) if parts[0] == "stages" and len(parts) > 2 else parts[0]


def rooms_importing_each_other(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(room, room) for every pair of rooms each of which imports the other."""
    edges = {(room(m), room(d)) for m, deps in graph.items() for d in deps if room(m) != room(d)}
    return sorted((a, b) for a, b in edges if a < b and (b, a) in edges)


def test_no_two_rooms_import_each_other():
    assert rooms_importing_each_other(import_graph()) == []


def test_the_room_rule_finds_a_pair():
    graph = {"stages.building.builds": {"stages.outputs.greedy", "stages.shape"}, "stages.outputs.sessions":
             {"stages.building.builds"}, "stages.shape": {"stages.building.builds"}, "pipeline": {"upstream.roll"},
             "upstream.forecast": {"pipeline"}, "stages.table": {"stages.building.builds", "stages.shape"}}
    assert rooms_importing_each_other(graph) == [("pipeline", "upstream"), ("stages", "stages.building"),
                                                 ("stages.building", "stages.outputs")]


def arrows_up(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(module, import) for every import of a stage room's module that reaches a room of a later floor (the stage
    rooms' floors are harness.stages.shape.ROLES, in the order of the run: building, native_tests, outputs, checks, speed),
    or of the frame (``stages.shape``, ``stages.options``) that reaches any stage room or the table."""
    from harness.stages.shape import ROLES
    floors = {f"stages.{r}": i for i, r in enumerate(ROLES)}
    found = []
    for mod, deps in graph.items():
        for dep in deps:
            here, there = room(mod), room(dep)
            if here == "stages" and (there in floors or there == "stages.table") or \
                    here in floors and there in floors and floors[there] > floors[here]:
                found.append((mod, dep))
    return sorted(found)


def test_no_arrow_climbs_a_floor_and_the_frame_knows_no_stage():
    assert arrows_up(import_graph()) == []


def test_the_floor_rule_finds_an_arrow_up():
    graph = {"stages.outputs.sessions": {"stages.checks.reload_rules", "stages.building.builds"},
             "stages.native_tests.sanitized_generation": {"stages.outputs.compare", "stages.shape"},
             "stages.shape": {"stages.outputs.greedy", "stages.options", "record.run"},
             "stages.speed.speed": {"stages.outputs.engine"}, "stages.table": {"stages.speed.speed"}}
    assert arrows_up(graph) == [("stages.native_tests.sanitized_generation", "stages.outputs.compare"),
                                ("stages.outputs.sessions", "stages.checks.reload_rules"),
                                ("stages.shape", "stages.outputs.greedy")]


def private_imports(name: str, source: str, is_package: bool = False) -> list[str]:
    """``name: module.private`` for every private name (``_x``) that module ``name`` (dotted, below ``harness``;
    ``is_package``: it is a package's ``__init__.py``) imports from another package of the harness in ``source``."""
    package = name.split(".") if is_package else name.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level:
            anchor = package[:len(package) - (node.level - 1)] if node.level > 1 else package
            origin = anchor + (node.module.split(".") if node.module else [])
            if origin[:len(package)] != package or len(origin) > len(package) + 1:
                found += [f"{name}: {'.'.join(origin)}.{a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def test_no_private_name_is_imported_from_another_package():
    assert [hit for path in sorted(PACKAGE.rglob("*.py"))
            for hit in private_imports(module_name(path), path.read_text(encoding="utf-8"),
                                       path.name == "__init__.py")] == []


def test_the_private_rule_finds_one():
    source = "from ..stages.building.patches import _Git, Patch\nfrom .report import _status\n"
    assert private_imports("upstream.forecast_patches", source) == ["upstream.forecast_patches: stages.building.patches._Git"]
