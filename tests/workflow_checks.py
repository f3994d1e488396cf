"""Checks of a GitHub workflow that actionlint, zizmor and the workflow JSON schema cannot make.

They read the workflow with the job matrix ``python -m harness ci-matrix`` derives from
matrix.yaml, and each returns a list of problems (empty: the check passed), one line each,
naming the job, the platform and the step:

* :func:`missing_debian_packages`: every step's Debian packages are installed by an earlier
  step of its job (``.ci/apt-install``).  What a step needs comes from the harness itself:
  ``nox -s SESSIONS`` needs :func:`harness.tools.ci_matrix.debian_packages_of` (the platform
  check of harness.matrix.platforms and the sessions' own packages), the test suite needs
  every session's packages on every platform plus conftest.DEBIAN_PACKAGES.
* :func:`missing_matrix_keys`: every ``matrix.<key>`` a job reads is in every entry of the
  matrix, for every platform.
* :func:`default_shell_problems`: the scripts of a job whose default shell is
  ``${{ matrix.shell }}`` (actionlint skips them) pass shellcheck where the entry's shell is
  bash, and are plain commands, the same in bash and PowerShell, where it is pwsh (ShellCheck
  has no PowerShell mode).

Conditions (``if:``) are read only in the form ``matrix.<key> == 'value'`` (or ``!=``) joined by
``&&``: a step with another condition is taken to run where it needs packages and not to run
where it installs them, so an install the checks cannot prove never hides a missing package.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import yaml

from conftest import DEBIAN_PACKAGES
from harness.matrix.config import Matrix
from harness.tools import ci_matrix as ci

EXPR = re.compile(r"\$\{\{(.*?)\}\}", re.S)
MATRIX_KEY = re.compile(r"(?<![\w.-])matrix\.([A-Za-z_][\w-]*)")
STRING_LITERAL = re.compile(r"'(?:[^']|'')*'")  # expression strings, e.g. hashFiles('matrix.yaml')
NOX_SESSIONS = re.compile(r"\bnox -s ((?:[A-Za-z][\w-]*)(?: [A-Za-z][\w-]*)*)")
PLATFORM_ARG = re.compile(r"--platform[ =]([\w.-]+)")
PYTEST = re.compile(r"\bpython3? -m pytest\b|\bnox -s pytest\b")
INSTALLER = ".ci/apt-install"
#: ``${{ matrix.K }}`` and ``${{ join(matrix.K, ' ') }}``: the env values the checks evaluate.
MATRIX_VALUE = re.compile(r"\$\{\{\s*(?:matrix\.(\w+)|join\(matrix\.(\w+),\s*' '\))\s*\}\}")
#: ``${{ toJSON(matrix.K) }}``: the sessions a platform job's step runs (env SESSIONS).
SESSIONS_VALUE = re.compile(r"\$\{\{\s*toJSON\(matrix\.(\w+)\)\s*\}\}")
CONDITION_TERM = re.compile(r"matrix\.(\w+)\s*(==|!=)\s*'([^']*)'")
#: A line that means the same in bash and PowerShell: words of letters, digits and ``_ . / = : + -``.
PLAIN_COMMAND = re.compile(r"[\w./=:+-]+(?: [\w./=:+-]+)*")


def load_workflow(path: Path) -> dict:
    """The workflow file ``path`` parsed with PyYAML (``on:`` becomes the key True)."""
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def matrix_entries(matrix: Matrix) -> list[dict]:
    """Every entry ``ci-matrix`` can emit: with self-hosted runners (for a pull request, so with
    the approval environment) and without them, where a platform's hosted fallback differs."""
    with_runners = ci.ci_plan(matrix, self_hosted=ci.self_hosted_gate("true", "pull_request"),
                              layout_files=lambda: (["README.md"], [])).matrix["include"]
    without = ci.ci_plan(matrix).matrix["include"]
    return with_runners + [e for e in without if e not in with_runners]


def strings(node) -> Iterator[tuple[object, str]]:
    """Every (key, string) pair in a parsed YAML tree; the key is the mapping key holding the string."""
    if isinstance(node, dict):
        for k, v in node.items():
            if isinstance(v, str):
                yield k, v
            else:
                yield from strings(v)
    elif isinstance(node, list):
        for v in node:
            yield from (strings(v) if not isinstance(v, str) else [(None, v)])


def matrix_keys_used(job: dict) -> set[str]:
    """``matrix.<key>`` names referenced in ``${{ }}`` expressions and ``if:`` conditions of ``job``."""
    used = set()
    for key, text in strings(job):
        exprs = EXPR.findall(text)
        if key == "if" and not exprs:
            exprs = [text]  # an `if:` is an expression without ${{ }}
        for expr in exprs:
            used.update(MATRIX_KEY.findall(STRING_LITERAL.sub("''", expr)))
    return used


def has_matrix(job: dict) -> bool:
    """True when ``job`` runs once per matrix entry (``strategy.matrix``)."""
    return "matrix" in (job.get("strategy") or {})


def missing_matrix_keys(workflow: dict, entries: list[dict]) -> list[str]:
    """Problems: a ``matrix.<key>`` a job reads that an entry lacks, or any in a job without a matrix."""
    problems = []
    for name, job in workflow["jobs"].items():
        used = matrix_keys_used(job)
        if used and not has_matrix(job):
            problems.append(f"job {name}: reads matrix.{', matrix.'.join(sorted(used))} but has no matrix")
            continue
        for entry in entries if has_matrix(job) else ():
            for key in sorted(used - set(entry)):
                problems.append(f"job {name}: reads matrix.{key}, which ci-matrix does not emit for "
                                f"platform {entry['platform']}")
    return problems


def condition(step: dict, entry: dict | None) -> bool | None:
    """Whether ``step`` runs for ``entry``: True or False where its ``if:`` is made of matrix
    comparisons only (or absent), None where it depends on anything else."""
    text = step.get("if")
    if text is None:
        return True
    text = str(text).strip()
    text = text[3:-2].strip() if text.startswith("${{") and text.endswith("}}") else text
    terms = [t.strip() for t in text.split("&&")]
    matched = [CONDITION_TERM.fullmatch(t) for t in terms]
    if entry is None or not all(matched):
        return None
    return all((str(entry.get(m.group(1))) == m.group(3)) == (m.group(2) == "==") for m in matched if m)


def evaluated_env(step: dict, entry: dict | None) -> dict[str, str]:
    """The step's ``env`` with the matrix values it names filled in from ``entry``."""
    env = {}
    for key, value in (step.get("env") or {}).items():
        value = str(value)
        m = MATRIX_VALUE.fullmatch(value.strip())
        if m and entry is not None:
            v = entry[m.group(1) or m.group(2)]
            value = " ".join(v) if isinstance(v, list) else str(v)
        env[key] = value
    return env


def installed_by(step: dict, entry: dict | None) -> set[str]:
    """The Debian packages ``step`` installs through ``.ci/apt-install`` (its arguments, with ``$VAR``
    taken from the step's env; each argument is a space-separated list)."""
    packages: set[str] = set()
    env = evaluated_env(step, entry)
    for line in str(step.get("run", "")).splitlines():
        words = shlex.split(line, comments=True)
        if INSTALLER not in words:
            continue
        for arg in words[words.index(INSTALLER) + 1:]:
            arg = re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), ""), arg)
            packages.update(arg.split())
    return packages


def needed_by(step: dict, entry: dict | None, matrix: Matrix) -> set[str]:
    """The Debian packages the commands of ``step`` need (see the module docstring)."""
    run = str(step.get("run", ""))
    env = evaluated_env(step, entry)
    needed: set[str] = set()
    if PYTEST.search(run):
        every = [*ci.PLATFORM_SESSIONS, *ci.SESSION_DEBIAN_PACKAGES]
        needed.update(ci.debian_packages_of(matrix, every), DEBIAN_PACKAGES)
    for group in NOX_SESSIONS.findall(run):
        platforms = PLATFORM_ARG.findall(run)
        needed.update(ci.debian_packages_of(matrix, group.split(), platforms))
    listed = SESSIONS_VALUE.fullmatch(str((step.get("env") or {}).get("SESSIONS", "")).strip())
    if listed and entry is not None:
        # the platform job's session steps: nox -s <the entry's list> -- --platform <its platform>
        needed.update(ci.debian_packages_of(matrix, entry[listed.group(1)], [env.get("PLATFORM") or entry["platform"]]))
    return needed


def missing_debian_packages(workflow: dict, matrix: Matrix, entries: list[dict]) -> list[str]:
    """Problems: a step that needs Debian packages no earlier step of its job installs, per entry."""
    problems = []
    for name, job in workflow["jobs"].items():
        for entry in entries if has_matrix(job) else [None]:
            where = f"job {name}" + (f" (platform {entry['platform']})" if entry else "")
            have: set[str] = set()
            for step in job.get("steps", []):
                runs = condition(step, entry)
                if runs is False:
                    continue
                missing = needed_by(step, entry, matrix) - have
                if missing:
                    problems.append(f"{where}: step {step.get('name') or step.get('run')!r} needs the Debian "
                                    f"package(s) {', '.join(sorted(missing))}, which no earlier step installs "
                                    f"({INSTALLER})")
                if runs:
                    have |= installed_by(step, entry)
    return problems


def shellcheck(script: str, shell: str) -> str:
    """ShellCheck's findings (empty when none) for ``script`` read as ``shell`` (bash or sh)."""
    exe = shutil.which("shellcheck")
    assert exe, "shellcheck is not installed"
    proc = subprocess.run([exe, "--shell", shell, "--format", "gcc", "-"], input=script,
                          capture_output=True, text=True)
    return proc.stdout.strip()


def default_shell_problems(workflow: dict, entries: list[dict]) -> list[str]:
    """Problems in the scripts of steps that run in a job's default shell ``${{ matrix.shell }}``."""
    problems = []
    for name, job in workflow["jobs"].items():
        shell_expr = str(((job.get("defaults") or {}).get("run") or {}).get("shell", ""))
        key = MATRIX_VALUE.fullmatch(shell_expr.strip())
        if not key:
            continue
        shells = sorted({e[key.group(1)] for e in entries})
        for step in job.get("steps", []):
            if "run" not in step or "shell" in step:
                continue
            label = f"job {name}: step {step.get('name') or step['run']!r}"
            for shell in shells:
                if shell == "bash":
                    found = shellcheck(step["run"], "bash")
                    if found:
                        problems.append(f"{label} (bash): {found}")
                elif shell == "pwsh":
                    for line in step["run"].splitlines():
                        if line.strip() and not PLAIN_COMMAND.fullmatch(line.strip()):
                            problems.append(f"{label} (pwsh): {line.strip()!r} is not a plain command, "
                                            "so it may mean something else in PowerShell")
                else:
                    problems.append(f"{label}: no check for shell {shell!r}")
    return problems
