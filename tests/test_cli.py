"""Exit codes, the one error handler of the command line, and nox keeping them."""

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from harness import cli

from harness.common import errors, interpreter
from harness.matrix.config import MatrixError
from harness.stages.building.patches import PatchError
from harness.triage.run_choice import TriageInputError

ROOT = Path(__file__).resolve().parent.parent


def test_every_expected_error_has_one_base_and_an_exit_code():
    for exc in (MatrixError, PatchError, TriageInputError):
        assert issubclass(exc, errors.HarnessError) and exc.exit_code == errors.EXIT_BAD_INPUT
    from harness.stages.building.build import BuildError
    assert BuildError.exit_code == errors.EXIT_ENVIRONMENT
    from harness.common.fs import EnvironmentProblem
    from harness.common.locks import RunInUse
    assert issubclass(EnvironmentProblem, errors.HarnessError) and issubclass(RunInUse, errors.HarnessError)


def test_the_cli_prints_expected_errors_without_a_traceback(capsys):
    assert cli.main(["build", "--platform", "nonexistent"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown platform 'nonexistent'") and "Traceback" not in err
    assert cli.main(["build", "--platform", "linux-x86_64-cpu", "-D", "NOVALUE"]) == 2
    assert capsys.readouterr().err == "error: -D NOVALUE: expected VAR=VALUE\n"
    assert cli.main(["no-such-command"]) == 2


def test_nox_stops_at_the_first_failed_session_and_keeps_the_exit_code():
    proc = subprocess.run([sys.executable, "-m", "nox", "-s", "build", "test", "--", "--platform", "nonexistent"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("unknown platform 'nonexistent'") == 1  # the test session never ran
    assert "Running session test" not in proc.stderr


def test_noxs_own_usage_errors_keep_noxs_codes_as_the_readme_says():
    """README.md, "Exit codes": a session nox does not know is nox's 3, an option it does not know nox's 2; neither
    starts the harness (no run is recorded)."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "keep **nox's** codes: 3 for a session name it does not know, 2 for an unknown option" in readme
    unknown = subprocess.run([sys.executable, "-m", "nox", "-s", "no-such-session"], cwd=ROOT, capture_output=True,
                             text=True, timeout=120)
    assert unknown.returncode == 3 and "Sessions not found" in unknown.stderr
    assert "python -m harness" not in unknown.stderr
    option = subprocess.run([sys.executable, "-m", "nox", "--no-such-option"], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert option.returncode == 2


def test_nox_outside_the_projects_environment_says_how_to_fix_it(monkeypatch, tmp_path, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "yaml" else real(name, *a))
    with pytest.raises(SystemExit) as exc:
        interpreter.harness_python(tmp_path)  # no .venv there
    assert exc.value.code == errors.EXIT_ENVIRONMENT
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "lacks yaml" in err
    assert "pip install --require-hashes -r requirements.txt" in err
    venv_python = tmp_path / ".venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text("")
    assert interpreter.harness_python(tmp_path) == str(venv_python)  # the project's .venv is used when it is there


def third_party_imports(package: Path) -> set[str]:
    """The top-level names of every module ``package`` imports (anywhere in its source) that is neither in the
    standard library nor the package itself."""
    names = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {package.name, "__future__"}


def test_nox_checks_for_every_third_party_module_the_harness_imports(tmp_path):
    assert third_party_imports(ROOT / "harness") == set(interpreter.NEEDED_MODULES)
    planted = tmp_path / "harness"
    planted.mkdir()
    (planted / "speed.py").write_text("import json\nfrom scipy.stats import mannwhitneyu\nfrom . import x\n")
    assert third_party_imports(planted) == {"scipy"}


def test_the_noxfile_imports_from_the_harness_only_what_the_standard_library_runs():
    # nox may run in a Python without the requirements (pipx): its error must come from harness_python,
    # not from an import of the noxfile's; -S leaves every site-packages directory out
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    modules = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("harness")]
    assert "harness.common.interpreter" in modules
    done = subprocess.run([sys.executable, "-S", "-c", "; ".join(f"import {m}" for m in modules)], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("argv", [["build", "--lanes", "0"], ["build", "-j", "0"], ["compare-outputs", "--n-predict", "-1"],
                                  ["build", "--sanitize", "bogus"], ["build", "--nosuchflag"], ["nosuchcommand"]])
def test_a_usage_error_is_one_error_line_and_exit_2(argv, capsys):
    from harness import cli
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and err.startswith("error: "), err


def test_no_command_prints_the_commands_and_one_error_line(capsys):
    from harness import cli
    assert cli.main([]) == 2
    err = capsys.readouterr().err
    assert "compare-outputs" in err and [line for line in err.splitlines() if line.startswith("error:")] == \
        ["error: llama-fork-harness: a command is needed (the commands are listed above)"]
