"""Lint of the GitHub workflow: actionlint, zizmor, the workflow JSON schema, and the project's own checks.

Each linter and check passes on .github/workflows/harness.yml and fails on a copy with a fault
planted in it: a job step that needs MinGW-w64 in a job that does not install it, a ``matrix.``
key the matrix does not emit, an unpinned action, a schema violation, a reference to a job that
does not exist, an unquoted expansion in a script of the platform job's default shell.  The
linters come pinned from requirements.txt; ShellCheck from Debian (actionlint runs it too where
it is installed).
"""

import importlib.metadata
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from packaging.utils import canonicalize_name

import workflow_checks as wc
from harness.common.interpreter import NEEDED_MODULES
from harness.matrix.config import load_matrix

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "harness.yml"
ZIZMOR_CONFIG = ROOT / ".github" / "zizmor.yml"
CI_SCRIPTS = [ROOT / ".ci" / name for name in ("run", "apt-install", "gpu-evidence.sh")]
BIN = Path(sys.executable).parent
needs_shellcheck = pytest.mark.skipif(shutil.which("shellcheck") is None,
                                      reason="shellcheck is not installed (Debian package shellcheck)")


@pytest.fixture(scope="module")
def matrix():
    return load_matrix(ROOT / "matrix.yaml")


@pytest.fixture(scope="module")
def entries(matrix):
    return wc.matrix_entries(matrix)


def tool(name: str) -> str:
    """The linter ``name`` of requirements.txt, installed next to this Python (a venv's bin)."""
    exe = BIN / name
    found = str(exe) if exe.exists() else shutil.which(name)
    assert found, f"{name} is not installed: python -m pip install -r requirements.txt"
    return found


def lint(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([tool(argv[0]), *argv[1:]], cwd=cwd, capture_output=True, text=True, timeout=120)


def planted(tmp_path: Path, old: str, new: str, count: int = 1) -> Path:
    """A copy of the workflow whose first ``count`` occurrences of ``old`` become ``new``, in
    ``tmp_path/.github/workflows/`` (where zizmor looks for it)."""
    text = WORKFLOW.read_text(encoding="utf-8")
    assert text.count(old) >= count, old
    copy = tmp_path / ".github" / "workflows" / WORKFLOW.name
    copy.parent.mkdir(parents=True)
    copy.write_text(text.replace(old, new, count), encoding="utf-8")
    return copy


def planted_yaml(tmp_path: Path, change) -> Path:
    """A copy of the workflow written back by PyYAML after ``change(workflow)`` edited it in place."""
    workflow = wc.load_workflow(WORKFLOW)
    change(workflow)
    copy = tmp_path / "harness.yml"
    copy.write_text(yaml.safe_dump(workflow, sort_keys=False), encoding="utf-8")
    return copy


# ----- the three linters ----------------------------------------------------------------------

def test_actionlint_passes_and_catches_a_job_that_does_not_exist(tmp_path):
    proc = lint("actionlint", "-no-color", str(WORKFLOW))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    bad = planted(tmp_path, "    needs: matrix\n", "    needs: matrixx\n")
    proc = lint("actionlint", "-no-color", str(bad))
    assert proc.returncode == 1 and 'job "platform" needs job "matrixx" which does not exist' in proc.stdout


@pytest.mark.parametrize("action", ["actions/checkout", "actions/cache/save", "mikepenz/action-junit-report"])
def test_zizmor_passes_and_catches_an_unpinned_action(tmp_path, action):
    proc = lint("zizmor", "--offline", "--config", str(ZIZMOR_CONFIG), str(WORKFLOW.parent))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pinned = re.search(rf"uses: {re.escape(action)}@([0-9a-f]{{40}})  # (v[\d.]+)\n",
                       WORKFLOW.read_text(encoding="utf-8"))
    assert pinned, f"{action} is not pinned by full commit SHA with its tag in a comment"
    bad = planted(tmp_path, pinned.group(0), f"uses: {action}@{pinned.group(2)}\n")
    proc = lint("zizmor", "--offline", "--config", str(ZIZMOR_CONFIG), str(bad))
    assert proc.returncode != 0 and "unpinned-uses" in proc.stdout
    assert f"{action}@{pinned.group(2)}" in proc.stdout


def test_every_action_is_pinned_by_commit_sha_with_its_tag():
    uses = re.findall(r"uses: (\S+)(.*)", WORKFLOW.read_text(encoding="utf-8"))
    assert len(uses) > 10
    for ref, rest in uses:
        assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", ref) and re.fullmatch(r"  # v\d+(\.\d+)*", rest), ref


def test_the_workflow_schema_passes_and_catches_a_bad_timeout(tmp_path):
    proc = lint("check-jsonschema", "--builtin-schema", "vendor.github-workflows", str(WORKFLOW))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    bad = planted(tmp_path, "    timeout-minutes: 60\n", "    timeout-minutes: soon\n")
    proc = lint("check-jsonschema", "--builtin-schema", "vendor.github-workflows", str(bad))
    assert proc.returncode == 1 and "timeout-minutes" in proc.stdout


# ----- what none of them checks ---------------------------------------------------------------

def test_every_job_installs_the_debian_packages_its_steps_need(matrix, entries):
    workflow = wc.load_workflow(WORKFLOW)
    assert wc.missing_debian_packages(workflow, matrix, entries) == []
    by_platform = {e["platform"]: e for e in entries}
    assert by_platform["windows-x86_64-cpu"]["debian_packages"] == ["g++-mingw-w64-x86-64-posix", "wine64"]
    assert by_platform["linux-x86_64-cpu"]["debian_packages"] == []


def test_a_mingw_step_in_a_job_that_does_not_install_it_is_caught(tmp_path, matrix, entries):
    def add_check_windows(workflow):
        workflow["jobs"]["matrix"]["steps"].append({"name": "planted", "run": "nox -s check-windows"})

    problems = wc.missing_debian_packages(wc.load_workflow(planted_yaml(tmp_path, add_check_windows)),
                                          matrix, entries)
    assert problems == ["job matrix: step 'planted' needs the Debian package(s) g++-mingw-w64-x86-64-posix, "
                        "which no earlier step installs (.ci/apt-install)"]


def test_the_series_job_without_its_install_step_is_caught(tmp_path, matrix, entries):
    def drop_install(workflow):
        steps = workflow["jobs"]["series"]["steps"]
        steps[:] = [s for s in steps if ".ci/apt-install" not in s.get("run", "")]

    problems = wc.missing_debian_packages(wc.load_workflow(planted_yaml(tmp_path, drop_install)), matrix, entries)
    assert problems == ["job series: step 'Windows checks' needs the Debian package(s) g++-mingw-w64-x86-64-posix, "
                        "which no earlier step installs (.ci/apt-install)"]


def test_a_platform_job_whose_install_step_skips_the_wine_platform_is_caught(tmp_path, matrix, entries):
    bad = planted(tmp_path, "        if: matrix.runner_os == 'linux'\n        shell: bash\n",
                  "        if: matrix.gpu == 'nvidia'\n        shell: bash\n")
    problems = wc.missing_debian_packages(wc.load_workflow(bad), matrix, entries)
    assert len(problems) == 1 and problems[0].startswith("job platform (platform windows-x86_64-cpu): step \"nox -s ${{ join(matrix.steps")
    assert "g++-mingw-w64-x86-64-posix, wine64" in problems[0]


def test_every_matrix_key_the_workflow_reads_is_in_every_entry(entries):
    assert wc.missing_matrix_keys(wc.load_workflow(WORKFLOW), entries) == []
    assert {e["platform"] for e in entries} == set(load_matrix(ROOT / "matrix.yaml").platforms)


def test_a_matrix_key_the_matrix_does_not_emit_is_caught(tmp_path, entries):
    bad = planted(tmp_path, "          PLATFORM: ${{ matrix.platform }}\n",
                  "          PLATFORM: ${{ matrix.platform_name }}\n")
    problems = wc.missing_matrix_keys(wc.load_workflow(bad), entries)
    assert problems and all("job platform: reads matrix.platform_name, which ci-matrix does not emit" in p
                            for p in problems)
    assert len(problems) == len(entries)


@pytest.mark.debian
@needs_shellcheck
def test_the_platform_jobs_default_shell_scripts_pass_for_both_shells(entries):
    assert {e["shell"] for e in entries} == {"bash", "pwsh"}
    workflow = wc.load_workflow(WORKFLOW)
    assert wc.default_shell_problems(workflow, entries) == []
    checked = [s for s in workflow["jobs"]["platform"]["steps"] if "run" in s and "shell" not in s]
    assert len(checked) >= 2  # pip install, ccache --zero-stats, ccache --show-stats


@pytest.mark.debian
@needs_shellcheck
def test_an_unquoted_expansion_in_the_platform_jobs_default_shell_is_caught(tmp_path, entries):
    bad = planted(tmp_path, "        run: ccache --zero-stats\n", "        run: ccache --dir $CCACHE_DIR --zero-stats\n")
    problems = wc.default_shell_problems(wc.load_workflow(bad), entries)
    assert [p.split(": ")[1].split(" (")[1] for p in problems] == ["bash)", "pwsh)"]
    assert "SC2086" in problems[0] and "'ccache --dir $CCACHE_DIR --zero-stats' is not a plain command" in problems[1]


@pytest.mark.debian
@needs_shellcheck
def test_the_ci_scripts_pass_shellcheck():
    for script in CI_SCRIPTS:
        proc = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout


# ----- what the linters leave to the workflow's authors ----------------------------------------

def policy_problems(workflow: dict) -> list[str]:
    """Problems with the rules of docs/ci.md that no linter enforces: a time limit on every job,
    results/evidence/ out of every upload of results/, ccache saved from the default branch only
    and not after a cancelled run, downloads saved only after a job that succeeded."""
    problems = []
    for name, job in workflow["jobs"].items():
        if "timeout-minutes" not in job:
            problems.append(f"job {name}: no timeout-minutes")
        for step in job["steps"]:
            uses, cond = step.get("uses", ""), " ".join(str(step.get("if", "")).split())
            path = str((step.get("with") or {}).get("path", ""))
            if uses.startswith("actions/upload-artifact@") and "results/" in path.split() \
                    and "!results/evidence/" not in path.split():
                problems.append(f"job {name}: step {step.get('name')!r} uploads results/evidence/")
            if uses.startswith("actions/cache/save@") and "CCACHE_DIR" in path:
                if "!cancelled()" not in cond or "github.event.repository.default_branch" not in cond:
                    problems.append(f"job {name}: step {step.get('name')!r} saves ccache off the default branch "
                                    "or after a cancelled run")
            if uses.startswith("actions/cache/save@") and "HARNESS_CACHE_DIR" in path and \
                    not cond.startswith("success()"):
                problems.append(f"job {name}: step {step.get('name')!r} saves downloads after a failure")
    return problems


def test_time_limits_artifacts_and_cache_saves_follow_the_rules(tmp_path):
    assert policy_problems(wc.load_workflow(WORKFLOW)) == []
    bad = planted(tmp_path, "    timeout-minutes: 15\n", "")
    assert policy_problems(wc.load_workflow(bad)) == ["job matrix: no timeout-minutes"]


@pytest.mark.parametrize("old, new, problem", [
    ("            !results/evidence/\n", "", "job platform: step 'Upload the results' uploads results/evidence/"),
    ("        if: success() && steps.downloads", "        if: always() && steps.downloads",
     "job platform: step 'Save the download cache' saves downloads after a failure"),
    ("\n          && github.ref == format('refs/heads/{0}', github.event.repository.default_branch) }}", " }}",
     "job platform: step 'Save ccache (default branch)' saves ccache off the default branch or after a cancelled run"),
])
def test_a_cache_or_artifact_rule_broken_is_caught(tmp_path, old, new, problem):
    assert policy_problems(wc.load_workflow(planted(tmp_path, old, new))) == [problem]


def light_install_problems(workflow: dict, root: Path = ROOT) -> list[str]:
    """Problems with the matrix job's light install: not a lock installed with its hashes checked
    (``--require-hashes -r LOCK``; a constraints file's hashes are not checked), or a module nox's sessions
    need (harness.common.interpreter.NEEDED_MODULES) that no package of that lock (under ``root``) provides."""
    [step] = [s for s in workflow["jobs"]["matrix"]["steps"] if "pip install" in s.get("run", "")]
    words = step["run"].split()
    if "--require-hashes" not in words or "-r" not in words or "-c" in words:
        return [f"job matrix: {step['run'].strip()!r} does not install a lock with its hashes checked"]
    lock = (root / words[words.index("-r") + 1]).read_text()
    installed = {canonicalize_name(m) for m in re.findall(r"^([A-Za-z0-9_.-]+)==", lock, re.MULTILINE)}
    providers = importlib.metadata.packages_distributions()
    return [f"job matrix: no package it installs provides the module {module} (harness.common.interpreter.NEEDED_MODULES)"
            for module in NEEDED_MODULES
            if not {canonicalize_name(d) for d in providers.get(module, [])} & installed]


def test_the_matrix_jobs_light_install_covers_what_nox_needs(tmp_path):
    assert light_install_problems(wc.load_workflow(WORKFLOW)) == []
    bad = planted(tmp_path, "--require-hashes -r .ci/requirements-matrix.txt",
                  "-c requirements.txt nox pyyaml jsonschema gguf numpy rich pyelftools pefile filelock")
    assert light_install_problems(wc.load_workflow(bad)) == [
        "job matrix: 'python -m pip install -c requirements.txt nox pyyaml jsonschema gguf numpy rich pyelftools "
        "pefile filelock' does not install a lock with its hashes checked"]
    lock = (ROOT / ".ci" / "requirements-matrix.txt").read_text()
    without = re.sub(r"^filelock==.*?(?=^\S)", "", lock, flags=re.MULTILINE | re.DOTALL)
    assert without != lock
    (tmp_path / "root" / ".ci").mkdir(parents=True)
    (tmp_path / "root" / ".ci" / "requirements-matrix.txt").write_text(without)
    assert light_install_problems(wc.load_workflow(WORKFLOW), tmp_path / "root") == [
        "job matrix: no package it installs provides the module filelock (harness.common.interpreter.NEEDED_MODULES)"]
