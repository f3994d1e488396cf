"""The command line explains itself: every command and option has help, ``--help`` needs only the standard
library, no arguments print the help (exit 2), ``--version`` names the base and the series, and defaults point
into the checkout from any directory below it."""

import argparse
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness import cli
from harness.common import errors
from harness.stages.building.patches import read_series, series_digest
from harness.stages.command_names import STAGE_COMMANDS

ROOT = Path(__file__).resolve().parent.parent


def commands(top: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Every sub-parser of ``top``, by command name."""
    [sub] = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def options_without_help(top: argparse.ArgumentParser) -> list[str]:
    """``COMMAND OPTION`` for every option or positional (the top level's too) that has no help text."""
    missing = []
    for name, ap in {"": top, **commands(top)}.items():
        for action in ap._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if not action.help:
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}".strip())
    return missing


def test_every_option_of_every_command_has_help():
    top = cli.parser()
    # every command a nox session runs is one of them (the stage commands' sessions: harness.stages.command_names)
    sessions = set(re.findall(r'_harness\(session, "([\w-]+)"\)', (ROOT / "noxfile.py").read_text())) | set(STAGE_COMMANDS)
    assert len(sessions) == 18 and sessions == set(commands(top))
    assert options_without_help(top) == []
    # a planted option without help is caught
    commands(top)["bisect"].add_argument("--planted")
    assert options_without_help(top) == ["bisect --planted"]


def test_the_top_level_help_lists_every_command_with_one_line(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    top = cli.parser()
    [sub] = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
    for choice in sub._choices_actions:
        assert choice.help and "\n" not in choice.help
        assert choice.dest in out
    assert set(commands(top)) == {c.dest for c in sub._choices_actions}


def test_no_arguments_print_the_help_and_exit_2(capsys):
    assert cli.main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: llama-fork-harness") and "bench-cold" in err


@pytest.mark.parametrize("command", ["", *sorted(commands(cli.parser()))])
def test_help_needs_only_the_standard_library(command):
    # -S: no site-packages at all, so none of the requirements can be imported
    argv = [sys.executable, "-S", "-m", "harness", *([command] if command else []), "--help"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "usage: llama-fork-harness" in done.stdout, done.stderr


def test_without_the_requirements_a_command_that_runs_fails_in_one_line_saying_what_to_install():
    done = subprocess.run([sys.executable, "-S", "-m", "harness", "triage"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == errors.EXIT_ENVIRONMENT, done.stderr
    assert done.stderr.startswith("error: triage needs the module ") and len(done.stderr.splitlines()) == 1
    assert "pip install --require-hashes -r requirements.txt" in done.stderr


def test_every_command_runs_a_function_that_exists():
    for name, ap in commands(cli.parser()).items():
        module, _, function = ap.get_default("handler").partition(":")
        assert callable(getattr(importlib.import_module(f"harness.{module}"), function)), name


def test_version_names_the_harness_the_base_commit_and_the_series_digest(capsys):
    assert cli.main(["--version"]) == 0
    out = capsys.readouterr().out
    import yaml
    commit = yaml.safe_load((ROOT / "matrix.yaml").read_text())["base"]["commit"]
    from harness import __version__
    assert out.startswith(f"llama-fork-harness {__version__}\n")
    assert f"base commit: {commit}" in out
    assert f"series digest: {series_digest(read_series(ROOT / 'patches'))}" in out


def test_forecast_and_bisect_take_the_stage_options_as_the_stages_declare_them():
    shared = ["--platform", "linux-x86_64-cpu", "-j", "3", "-D", "A=1", "--cuda-arch", "90"]
    run = ["--lanes", "2", "--sanitize", "memcheck", "--bench-repeats", "6", "--n-predict", "4"]
    stage = vars(cli.parse(["build", *shared, *run]))
    forecast = vars(cli.parse(["forecast", "--onto", "x", *shared, *run]))
    bisect = vars(cli.parse(["bisect", "--check", "test:x", *shared]))
    assert {k: v for k, v in forecast.items() if k in stage and k not in ("handler", "command")} == \
        {k: v for k, v in stage.items() if k in forecast and k not in ("handler", "command")}
    assert {k: bisect[k] for k in ("platform", "jobs", "defines", "cuda_arch")} == \
        {k: stage[k] for k in ("platform", "jobs", "defines", "cuda_arch")}
    for command in (["build"], ["forecast", "--onto", "x"], ["bisect", "--check", "test:x"]):
        with pytest.raises(SystemExit):
            cli.parse([*command, "-j", "0"])  # one type, positive, everywhere


def test_several_stages_run_in_their_order_in_one_command():
    assert cli.parse(["compare-outputs", "build"]).stages == ["build", "compare-outputs"]
    with pytest.raises(SystemExit):
        cli.parse(["build", "report"])


def test_defaults_point_into_the_checkout_from_any_directory_below_it(monkeypatch):
    monkeypatch.chdir(ROOT / "tests")
    args = cli.parse(["build"])
    assert args.matrix == Path("../matrix.yaml") and args.results_dir == Path("../results")
    assert args.matrix.resolve() == ROOT / "matrix.yaml"
    monkeypatch.chdir(ROOT)
    assert cli.parse(["triage"]).results_dir == Path("results")


def test_commands_run_from_a_subdirectory():
    done = subprocess.run([sys.executable, "-m", "harness", "ci-matrix"], cwd=ROOT / "docs",
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and '"include"' in done.stdout, done.stderr
