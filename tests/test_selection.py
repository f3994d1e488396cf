"""Selection in one place: the platforms, groups, models and prompts of a run are chosen once
(harness.matrix.selection.Selection, the context's ``selection``) and no stage reads ``--platform``,
``--group`` or ``--model`` from the options itself; the stage commands are declared once
(harness.stages.command_names) and the command line, the run loop and nox list the same ones."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from harness import cli
from harness.matrix.config import load_matrix
from harness.matrix.fit import selected_generations
from harness.matrix.selection import Selection
from harness.stages.command_names import STAGE_COMMANDS
from harness.stages.shape import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "harness"
MATRIX = load_matrix(ROOT / "matrix.yaml")

#: The options that select; only the selection (and the command line, which fills the options in) reads them.
SELECTING = ("platforms", "groups", "models")


def selection_reads(source: str) -> list[int]:
    """Lines of ``source`` that read a selecting option off an options object (``opts.groups``,
    ``ctx.opts.models``, ``pipe.opts.platforms``)."""
    return sorted(node.lineno for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.Attribute) and node.attr in SELECTING
                  and isinstance(node.value, (ast.Name, ast.Attribute))
                  and (node.value.id if isinstance(node.value, ast.Name) else node.value.attr) == "opts")


def test_no_stage_reads_the_selection_off_the_options():
    found = [f"{path.relative_to(ROOT)}:{line}" for path in sorted((PACKAGE / "stages").rglob("*.py"))
             for line in selection_reads(path.read_text(encoding="utf-8"))]
    assert found == [], "read ctx.selection (harness.matrix.selection) instead"


def test_the_rule_finds_the_reads_a_stage_would_write():
    source = ("groups = [g for g in p.groups if not ctx.opts.groups or g in ctx.opts.groups]\n"
              "for name in pipe.opts.platforms or list(pipe.matrix.platforms): pass\n"
              "ok = ctx.selection.group_names(p.name)\n"
              "if opts.models and m not in opts.models: pass\n"
              "platform_groups = p.groups\n")
    assert selection_reads(source) == [1, 1, 2, 4, 4]


def test_the_selection_restricts_platforms_groups_and_models_and_keeps_the_matrix_order():
    every = Selection.of(MATRIX)
    assert every.platform_names() == list(MATRIX.platforms) and not every.names_platforms()
    cpu = "linux-x86_64-cpu"
    assert every.group_names(cpu) == list(MATRIX.platform(cpu).groups)
    some = Selection.of(MATRIX, [cpu], [MATRIX.platform(cpu).groups[0]], ["no-such-model"])
    assert some.platform_names() == [cpu] and some.names_platforms()
    assert some.group_names(cpu) == [MATRIX.platform(cpu).groups[0]] and some.names_group(some.groups[0])
    assert some.model_names(some.groups[0]) == [] and some.groups_with_models(cpu) == []  # the group runs nothing
    assert selected_generations(some, None) == []
    gemma = Selection.of(MATRIX, [cpu], [], ["gemma3-270m"])
    planned = selected_generations(gemma, 4)
    assert planned and {g.model for g in planned} == {"gemma3-270m"} and {g.n_predict for g in planned} == {4}
    assert {g.group for g in planned} == set(gemma.groups_with_models(cpu))
    assert gemma.filters() == "gemma3-270m" and every.filters() == "none"


def test_the_stage_commands_are_declared_once_and_the_command_line_the_run_loop_and_nox_list_them():
    assert COMMANDS == cli.STAGES == tuple(STAGE_COMMANDS)
    top = cli.parser()
    [sub] = [a for a in top._actions if a.__class__.__name__ == "_SubParsersAction"]
    helps = {c.dest: c.help for c in sub._choices_actions}
    assert {name: helps[name] for name in STAGE_COMMANDS} == STAGE_COMMANDS
    nox = Path(sys.executable).parent / "nox"
    listing = subprocess.run([str(nox), "--list", "-f", str(ROOT / "noxfile.py")], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout.split("Sessions defined in", 1)[1]
    selected = [line[2:].split(" -> ")[0] for line in listing.splitlines() if line.startswith("* ")]
    assert selected == list(STAGE_COMMANDS)  # nox's default sessions: the stage commands, in their order


def test_the_schema_names_the_stage_commands_a_ci_job_runs():
    """matrix.schema.json cannot import the declaration: its enum of a platform's CI steps is held to it here."""
    import json

    from harness.matrix import config
    ci = json.loads(config.SCHEMA_PATH.read_text(encoding="utf-8"))["$defs"]
    found = [node["properties"]["ci"]["properties"]["steps"]["items"]["enum"] for node in ci.values()
             if isinstance(node, dict) and "ci" in node.get("properties", {})]
    assert found == [list(STAGE_COMMANDS)]
