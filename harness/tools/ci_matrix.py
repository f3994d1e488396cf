"""The CI job matrix, derived from ``matrix.yaml``: ``python -m harness ci-matrix``.

Prints ``{"include": [...]}``, one entry per platform that has a ``ci`` section,
in the order of ``matrix.yaml``.  GitHub Actions expands it with
``strategy.matrix: ${{ fromJSON(needs.<job>.outputs.matrix) }}``; the workflow
lists no platform itself, so ``matrix.yaml`` stays the only place that does.

Each entry carries what one platform job reads from ``matrix.<key>``:

``platform``       the platform's name in matrix.yaml (passed as ``--platform``)
``runner_os``      ``linux`` or ``windows``: the OS of the runner (a Windows
                   platform cross-built and run under Wine has a Linux runner)
``runs_on``        the runner labels of ``ci.runs_on`` (``runs-on`` takes a list;
                   a runner must carry every label)
``shell``          the job's default shell: ``bash`` on Linux runners, ``pwsh`` on Windows
``steps``          nox sessions every runner of the platform runs (``ci.steps``)
``gpu_steps``      nox sessions that need a GPU on the runner (``ci.gpu_steps``)
``needs_gpu``      true when ``gpu_steps`` is not empty
``gpu``            the GPU the platform's hardware needs: ``nvidia`` or ``none``
``base_commit``    the pinned upstream commit (a cache key part)
``models_digest``  SHA-256 of the matrix's model definitions (a cache key part)
``debian_packages`` Debian packages a Linux runner installs for the job's steps
                   (:func:`debian_packages_of`); empty on a Windows runner
``environment``    the protected environment the job waits in for approval
                   (APPROVAL_ENVIRONMENT, for a self-hosted job of a pull
                   request or of a manual run of another branch), else
                   empty: no environment

Platforms whose runner labels include ``self-hosted`` are left out unless
``self_hosted`` says such runners exist (the workflow passes the repository
variable ``HARNESS_SELF_HOSTED_RUNNERS``), so a fork without them queues no
job that would wait forever; each left-out platform comes with the reason.
Where they exist, :func:`self_hosted_gate` queues them only for a push to the
default branch or a scheduled run, or for a pull request or a manual run of
another branch, whose self-hosted jobs wait in a protected environment for a
reviewer's approval.
More than MAX_JOBS entries are refused (GitHub's limit per matrix), and so is
a platform of a Windows runner whose layout has a path past MAX_PATH
(``harness.tools.path_budget``) unless its ``ci.long_paths`` says the runner
supports long paths.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ..kinds.registry import runner_os
from ..kinds.shape import OsKind
from ..matrix.config import Matrix, MatrixError, Platform, load_matrix
from ..matrix.platforms import debian_packages
from ..stages.command_names import STAGE_COMMANDS
from .path_budget import MAX_PATH, PathBudget, files_added_by, path_budget
from .windows_check import MINGW_PACKAGE
from ..common.json_value import JSON

#: GitHub Actions runs at most 256 jobs from one matrix per workflow run.
MAX_JOBS = 256
#: The protected environment (Settings > Environments, with required reviewers) in which the
#: self-hosted jobs of a pull request or a manual run of another branch wait for approval.
APPROVAL_ENVIRONMENT = "self-hosted-runners"
#: nox sessions that run the stages of every selected platform (``--platform``).
PLATFORM_SESSIONS = frozenset(STAGE_COMMANDS)
#: Debian packages of the nox sessions that need the same ones on every platform.
SESSION_DEBIAN_PACKAGES = {"check-windows": (MINGW_PACKAGE,)}


@dataclass(frozen=True)
class SelfHostedGate:
    """Whether this workflow run queues jobs for self-hosted runners, the reason, and, where they
    need approval, the environment those jobs wait in for it (else empty)."""

    allowed: bool
    why: str
    environment: str = ""


def self_hosted_gate(variable: str, event: str = "", ref: str = "", default_branch: str = "") -> SelfHostedGate:
    """Whether a workflow run of ``event`` on ``ref`` may queue jobs for self-hosted runners.

    ``variable``: the repository variable HARNESS_SELF_HOSTED_RUNNERS (such runners exist when it
    is ``true``).  ``event``: ``github.event_name``; empty outside Actions, where the variable alone
    decides.  Queued: a push to ``refs/heads/<default_branch>``, a ``schedule`` run (of the default
    branch), and a ``pull_request`` or a ``workflow_dispatch`` run of another branch, whose
    self-hosted jobs then wait in APPROVAL_ENVIRONMENT: a GPU runner runs code that is not on the
    default branch only after a reviewer approved it.  Any other event is refused, naming it.
    """
    var = variable.strip().lower()
    if var != "true":
        return SelfHostedGate(False, f"the repository variable HARNESS_SELF_HOSTED_RUNNERS is "
                                     f"{repr(variable) if variable else 'unset'}, not 'true': set it where such "
                                     "runners exist")
    if not event:
        return SelfHostedGate(True, "HARNESS_SELF_HOSTED_RUNNERS is 'true' (no workflow event given)")
    on_default = bool(default_branch) and ref == f"refs/heads/{default_branch}"
    approval = f"its self-hosted jobs wait in the protected environment {APPROVAL_ENVIRONMENT} until a reviewer " \
               "approves them"
    if event == "push":
        if on_default:
            return SelfHostedGate(True, f"a push to the default branch {default_branch}")
        return SelfHostedGate(False, f"a push to {ref or 'an unknown ref'}, not to the default branch "
                                     f"{default_branch or '(unknown)'}")
    if event == "schedule":
        return SelfHostedGate(True, "a scheduled run")
    if event == "workflow_dispatch":
        if on_default:
            return SelfHostedGate(True, f"a manual run of the default branch {default_branch}")
        return SelfHostedGate(True, f"a manual run of {ref or 'an unknown ref'}: {approval}",
                              environment=APPROVAL_ENVIRONMENT)
    if event == "pull_request":
        return SelfHostedGate(True, f"a pull request: {approval}", environment=APPROVAL_ENVIRONMENT)
    return SelfHostedGate(False, f"a {event} event, which may not use self-hosted runners")


def debian_packages_of(matrix: Matrix, sessions: Sequence[str], platforms: Sequence[str] = ()) -> list[str]:
    """The Debian packages a Linux runner needs for ``nox -s SESSIONS -- [--platform P ...]``, sorted.

    ``platforms``: the platforms the sessions run (default: every platform, as the harness does
    without ``--platform``).  A session of PLATFORM_SESSIONS needs what
    :func:`harness.matrix.platforms.debian_packages` says for each platform, the sessions of
    SESSION_DEBIAN_PACKAGES their own; other sessions need none.  Raises MatrixError for an
    unknown platform name.
    """
    selected = [matrix.platform(n) for n in platforms] if platforms else list(matrix.platforms.values())
    needed: set[str] = set()
    for session in sessions:
        needed.update(SESSION_DEBIAN_PACKAGES.get(session, ()))
        if session in PLATFORM_SESSIONS:
            for p in selected:
                needed.update(debian_packages(p, session))
    return sorted(needed)


@dataclass(frozen=True)
class CiPlan:
    """The job matrix and the platforms left out of it, each with the reason (``{name: reason}``)."""

    matrix: dict
    left_out: dict[str, str]
    budgets: list[PathBudget]


def _canonical(value: object, base: Path) -> JSON:
    """``value`` with paths written relative to ``base`` in POSIX form, so a digest is machine independent."""
    if isinstance(value, Path):
        try:
            return Path(os.path.relpath(value, base)).as_posix()
        except ValueError:  # another drive on Windows
            return value.as_posix()
    if isinstance(value, dict):
        return {str(k): _canonical(v, base) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v, base) for v in value]
    return value


def models_digest(matrix: Matrix) -> str:
    """SHA-256 (hex, 64 digits) of every model's name, kind and definition in ``matrix``.

    The download cache holds the assembled and generated models, so its key
    changes exactly when a model definition does (not when a prompt or group
    does).  Paths are hashed relative to the matrix file's directory.
    """
    base = matrix.path.resolve().parent
    doc = {name: {"kind": m.kind, "spec": _canonical(dict(m.spec), base)} for name, m in matrix.models.items()}
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def ci_plan(matrix: Matrix, platforms: Sequence[str] = (), *, self_hosted: bool | SelfHostedGate = False,
            layout_files: Callable[[], tuple[list[str], list[str]]] | None = None, repo: str = "") -> CiPlan:
    """The GitHub Actions matrix ``{"include": [entry, ...]}`` for ``matrix`` and what it leaves out.

    ``platforms``: names to keep (default: every platform with a ``ci``
    section).  ``self_hosted``: self-hosted runners exist, so platforms that
    need them are kept; a :class:`SelfHostedGate` also gives the reason
    reported for the platforms left out and the approval environment of the
    self-hosted entries.  ``layout_files``: returns (base tree files, files the
    series adds), called only when a kept platform runs on a Windows runner,
    whose path budget is then checked for repository name ``repo``.  Entries
    follow the order of matrix.yaml; their keys are listed in this module's
    docstring.  Raises MatrixError for an unknown platform name, for a named
    platform without a ``ci`` section, when no platform is left (GitHub
    rejects an empty ``include``), for more than MAX_JOBS entries, and for a
    path past MAX_PATH (naming the path and its length).
    """
    gate = self_hosted if isinstance(self_hosted, SelfHostedGate) else SelfHostedGate(
        self_hosted, "set the repository variable HARNESS_SELF_HOSTED_RUNNERS to true where such runners exist")
    wanted = set()
    for name in platforms:
        p = matrix.platform(name)  # MatrixError listing the known names
        if p.ci is None:
            raise MatrixError([f"{matrix.path}: platform {name!r} has no ci section, so CI cannot run it"])
        wanted.add(name)
    digest = models_digest(matrix)
    include = []
    left_out: dict[str, str] = {}
    kept: list[Platform] = []
    runners: list[OsKind] = []
    for name, p in matrix.platforms.items():
        if p.ci is None or (wanted and name not in wanted):
            continue
        runs_on, gpu_steps = p.ci.runs_on, p.ci.gpu_steps
        if "self-hosted" in runs_on and not gate.allowed:
            why = f"needs a self-hosted runner ({', '.join(runs_on)}); {gate.why}"
            if not p.ci.hosted_runs_on:
                left_out[name] = why
                continue
            runs_on, gpu_steps = p.ci.hosted_runs_on, ()
            left_out[name] = (f"{', '.join(p.ci.gpu_steps) or 'nothing'} not queued: {why}; "
                              f"{', '.join(p.ci.steps)} runs on {', '.join(runs_on)}")
        kept.append(p)
        runner = runner_os(runs_on)
        runners.append(runner)
        on_self_hosted = "self-hosted" in runs_on
        include.append({
            "platform": name,
            "runner_os": runner.name,
            "runs_on": list(runs_on),
            "shell": runner.shell,
            "steps": list(p.ci.steps),
            "gpu_steps": list(gpu_steps),
            "needs_gpu": bool(gpu_steps),
            "gpu": p.gpu,
            "base_commit": matrix.base_commit,
            "models_digest": digest,
            "debian_packages": (debian_packages_of(matrix, (*p.ci.steps, *gpu_steps), [name])
                                if runner.cross_host else []),
            "environment": gate.environment if on_self_hosted else "",
        })
    if not include:
        why = "; ".join(f"{n}: {r}" for n, r in left_out.items()) or "no platform has a ci section"
        raise MatrixError([f"{matrix.path}: the CI matrix would be empty ({why})"])
    if len(include) > MAX_JOBS:
        raise MatrixError([f"{matrix.path}: {len(include)} CI jobs; GitHub Actions runs at most {MAX_JOBS} jobs "
                           "from one matrix per workflow run"])
    budgets = []
    windows = [p for p, r in zip(kept, runners) if r.max_path is not None]
    if windows:
        if layout_files is None:
            raise MatrixError([f"{matrix.path}: the path budget of {', '.join(p.name for p in windows)} needs "
                               "the base tree's file list"])
        base_files, fork_files = layout_files()
        problems = []
        for p in windows:
            budget = path_budget(matrix, p, repo, base_files, fork_files)
            budgets.append(budget)
            assert p.ci is not None
            if budget.over and not p.ci.long_paths:
                problems.append(f"{matrix.path}: platform {p.name}: {budget.length} characters, past Windows' "
                                f"MAX_PATH of {MAX_PATH} (long paths are not guaranteed on its runner; set "
                                f"ci.long_paths where they are): {budget.longest}")
        if problems:
            raise MatrixError(problems)
    return CiPlan({"include": include}, left_out, budgets)


def ci_matrix(matrix: Matrix, platforms: Sequence[str] = (), **kwargs: Any) -> dict:  # Any: ci_plan's options
    """Only the job matrix of :func:`ci_plan` (same arguments and errors)."""
    return ci_plan(matrix, platforms, **kwargs).matrix


def base_layout_files(matrix: Matrix, patches_dir: Path) -> tuple[list[str], list[str]]:
    """(files of the base tree, files the patch series adds or changes), ``/``-separated.

    The base tree is obtained as every stage obtains it (cache first); raises
    SourceError when no source yields it, PatchError for a broken series.
    """
    from ..stages.building.patches import read_series
    from ..stages.building.source import git, obtain_base
    base = obtain_base(matrix)
    files = git(["ls-files", "-z"], base.path).stdout.split("\0")
    added = files_added_by(p.path.read_bytes() for p in read_series(patches_dir))
    return [f for f in files if f], added


def write_github_output(path: Path, name: str, value: str) -> None:
    """Append ``name=value`` as one line to the GitHub Actions output file ``path``.

    ``value`` must be a single line (compact JSON is); raises ValueError otherwise.
    """
    if "\n" in value or "\r" in value:
        raise ValueError(f"output {name!r} must be a single line")
    with path.open("a", encoding="utf-8", newline="\n") as fh:
        fh.write(f"{name}={value}\n")


def _split(values: Sequence[str]) -> list[str]:
    return [v.strip() for item in values for v in item.split(",") if v.strip()]


def main(argv: Sequence[str]) -> int:
    """``ci-matrix`` with ``argv``, parsed as the command line parses it (harness.cli); returns :func:`run`'s code."""
    from ..cli import parse_command
    return run(parse_command("ci-matrix", argv))


def run(args: argparse.Namespace) -> int:
    """``python -m harness ci-matrix [--matrix FILE] [--platform P ...] [--github-output]``.

    Prints the matrix as JSON on stdout.  With ``--github-output`` it also
    appends ``matrix=<compact JSON>`` to the file named by ``$GITHUB_OUTPUT``.
    Returns 0, or 2 with a message on stderr for a bad matrix, an unknown
    platform or a missing ``$GITHUB_OUTPUT``.
    """
    out_file = os.environ.get("GITHUB_OUTPUT") if args.github_output else None
    if args.github_output and not out_file:
        print("error: --github-output: $GITHUB_OUTPUT is not set (GitHub Actions sets it in a step)", file=sys.stderr)
        return 2
    repo = (args.repo or os.environ.get("GITHUB_REPOSITORY", "").rpartition("/")[2]
            or args.matrix.resolve().parent.name)
    from ..stages.building.patches import PatchError
    from ..stages.building.source import SourceError
    gate = self_hosted_gate(args.self_hosted, args.event, args.ref, args.default_branch)
    try:
        matrix = load_matrix(args.matrix)
        plan = ci_plan(matrix, _split(args.platform), self_hosted=gate,
                       layout_files=lambda: base_layout_files(matrix, args.patches_dir), repo=repo)
    except (MatrixError, FileNotFoundError, SourceError, PatchError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(plan.matrix, indent=2))
    print(f"self-hosted runners: {'used' if gate.allowed else 'not used'}: {gate.why}", file=sys.stderr)
    for name, reason in plan.left_out.items():
        print(f"left out: {name}: {reason}", file=sys.stderr)
    for budget in plan.budgets:
        print(f"path budget: {budget.platform}: longest path {budget.length} of {MAX_PATH} characters: "
              f"{budget.longest}", file=sys.stderr)
    if out_file:
        write_github_output(Path(out_file), "matrix", json.dumps(plan.matrix, separators=(",", ":")))
        summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if summary:
            with open(summary, "a", encoding="utf-8") as fh:
                fh.write(f"## Self-hosted runners\n\n{'Used' if gate.allowed else 'Not used'}: {gate.why}.\n\n")
                if plan.left_out:
                    fh.write("## Platforms not queued\n\n")
                    fh.writelines(f"- `{name}`: {reason}\n" for name, reason in plan.left_out.items())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
