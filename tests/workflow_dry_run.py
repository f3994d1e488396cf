"""Run the ``run:`` steps of one job of a GitHub workflow here, in order, the way a runner would.

This is a dry run, not a run on GitHub Actions: no runner, no hosted image, no actions.  What it
does like a runner: the steps run in the job's workspace (a fresh clone) with the workflow's and
the job's ``env`` and the step's own, in the step's shell (bash as ``bash --noprofile --norc -eo
pipefail``, python), each with its own ``GITHUB_OUTPUT``, ``GITHUB_ENV``, ``GITHUB_PATH`` and
``GITHUB_STEP_SUMMARY`` files, whose contents reach the later steps (``steps.<id>.outputs``, the
environment, PATH) and the job's summary; the first failing step ends the job.  ``uses:`` steps
are skipped and listed; what they would provide (the checkout, a Python on PATH, a restored cache)
is the caller's to stand in for.

Expressions are evaluated only where they are context values (``${{ github.workspace }}``,
``${{ env.X }}``, ``${{ inputs.X }}``, ``${{ vars.X }}``, ``${{ github.event_name }}``, ...) and
``if:`` only in the forms ``success()``, ``always()``, ``!cancelled()`` and ``failure()``: anything
else raises DryRunError naming the step, so a job the dry run cannot reproduce is never passed.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
CONTEXT_PATH = re.compile(r"(github|env|inputs|vars|runner)((?:\.[\w-]+)+)")
#: ``if:`` values the dry run evaluates: whether the step runs when every earlier step passed.
CONDITIONS = {"success()": True, "always()": True, "!cancelled()": True, "failure()": False}


class DryRunError(Exception):
    """The job uses something the dry run cannot evaluate (an expression, a shell)."""


@dataclass
class StepRun:
    """One ``run:`` step that ran: its name, exit status, the file with its output."""

    name: str
    returncode: int
    log: Path


@dataclass
class JobRun:
    """What a dry run of a job did: the steps that ran, the ``uses:`` steps it skipped (by name),
    the steps whose ``if:`` kept them from running, the outputs by step id, the job summary."""

    job: str
    ran: list[StepRun] = field(default_factory=list)
    skipped_uses: list[str] = field(default_factory=list)
    not_run: list[str] = field(default_factory=list)
    outputs: dict[str, dict[str, str]] = field(default_factory=dict)
    summary: str = ""

    @property
    def passed(self) -> bool:
        """True when every step that ran exited 0."""
        return all(s.returncode == 0 for s in self.ran)


def read_env_file(path: Path) -> dict[str, str]:
    """The ``name=value`` and ``name<<DELIMITER`` lines of a GITHUB_OUTPUT or GITHUB_ENV file."""
    values: dict[str, str] = {}
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    i = 0
    while i < len(lines):
        line = lines[i]
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delimiter = line.split("<<", 1)
            end = lines.index(delimiter, i + 1)
            values[name] = "\n".join(lines[i + 1:end])
            i = end + 1
            continue
        name, sep, value = line.partition("=")
        if sep:
            values[name] = value
        i += 1
    return values


class Context:
    """The expression contexts of the dry run: github, env, inputs, vars, runner."""

    def __init__(self, github: dict, inputs: dict[str, str], variables: dict[str, str], runner: dict[str, str]):
        self.data = {"github": github, "inputs": inputs, "vars": variables, "runner": runner, "env": {}}

    def evaluate(self, text: str, where: str) -> str:
        """``text`` with each ``${{ context.path }}`` replaced by its value (a missing one is empty)."""
        def value(m: re.Match) -> str:
            ref = CONTEXT_PATH.fullmatch(m.group(1))
            if not ref:
                raise DryRunError(f"{where}: cannot evaluate ${{{{ {m.group(1)} }}}}")
            node = self.data[ref.group(1)]
            for part in ref.group(2).split(".")[1:]:
                node = node.get(part, "") if isinstance(node, dict) else ""
            return str(node)
        return EXPR.sub(value, text)


def _command(shell: str | None, script: Path, where: str) -> list[str]:
    """The runner's command line for ``script`` in ``shell`` (None: the Linux default, ``bash -e``)."""
    if shell is None:
        return ["bash", "-e", str(script)]
    if shell == "bash":
        return ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)]
    if shell == "python":
        return ["python", str(script)]
    if shell == "sh":
        return ["sh", "-e", str(script)]
    raise DryRunError(f"{where}: shell {shell!r} is not run by the dry run")


def dry_run(workflow: dict, job_name: str, workspace: Path, scratch: Path, path_prefix: list[Path],
            inputs: dict[str, str] | None = None, variables: dict[str, str] | None = None,
            github: dict | None = None) -> JobRun:
    """Run the ``run:`` steps of job ``job_name`` of ``workflow`` (parsed) in ``workspace``.

    ``scratch``: a directory for the step scripts, the GITHUB_* files, logs and RUNNER_TEMP.
    ``path_prefix``: directories put first on PATH (a Python's bin, standing in for setup-python).
    ``inputs``/``variables``: the ``inputs`` and ``vars`` contexts (missing: empty).  ``github``:
    the ``github`` context over a push to main of ``dry-run/<workspace name>``.  Returns the JobRun;
    raises DryRunError for what it cannot evaluate.
    """
    job = workflow["jobs"][job_name]
    if "strategy" in job:
        raise DryRunError(f"job {job_name}: a matrix job; the dry run runs jobs without a matrix")
    temp = scratch / "runner-temp"
    temp.mkdir(parents=True, exist_ok=True)
    repo = f"dry-run/{workspace.name}"
    gh = {"workspace": str(workspace), "event_name": "push", "ref": "refs/heads/main", "repository": repo,
          "event": {"repository": {"default_branch": "main"}}, "job": job_name, **(github or {})}
    ctx = Context(gh, inputs or {}, variables or {}, {"temp": str(temp), "os": "Linux"})
    env: dict[str, str] = {}
    for layer, where in ((workflow.get("env") or {}, "workflow env"), (job.get("env") or {}, f"job {job_name} env")):
        for key, value in layer.items():
            env[key] = ctx.evaluate(str(value), f"{where} {key}")
            ctx.data["env"] = env
    shell = ((job.get("defaults") or {}).get("run") or {}).get("shell") or \
        ((workflow.get("defaults") or {}).get("run") or {}).get("shell")
    path = [str(p) for p in path_prefix] + os.environ.get("PATH", "").split(os.pathsep)
    base_env = {**os.environ, "CI": "true", "GITHUB_ACTIONS": "true", "GITHUB_WORKSPACE": str(workspace),
                "GITHUB_REPOSITORY": repo, "GITHUB_EVENT_NAME": gh["event_name"], "GITHUB_REF": gh["ref"],
                "GITHUB_JOB": job_name, "RUNNER_TEMP": str(temp), "RUNNER_OS": "Linux"}
    base_env.pop("VIRTUAL_ENV", None)
    result = JobRun(job_name)
    summaries = []
    for i, step in enumerate(job["steps"]):
        name = str(step.get("name") or step.get("uses") or step.get("run", "").splitlines()[0])
        where = f"job {job_name}: step {name!r}"
        if "uses" in step:
            result.skipped_uses.append(name)
            continue
        cond = str(step.get("if", "success()")).strip()
        cond = cond[3:-2].strip() if cond.startswith("${{") and cond.endswith("}}") else cond
        if cond not in CONDITIONS:
            raise DryRunError(f"{where}: cannot evaluate if: {cond}")
        if not CONDITIONS[cond]:
            result.not_run.append(name)
            continue
        files = {k: scratch / f"step{i}-{k.lower()}" for k in ("GITHUB_OUTPUT", "GITHUB_ENV", "GITHUB_PATH",
                                                              "GITHUB_STEP_SUMMARY")}
        for f in files.values():
            f.write_text("", encoding="utf-8")
        step_env = dict(env)
        for key, value in (step.get("env") or {}).items():
            step_env[key] = ctx.evaluate(str(value), f"{where} env {key}")
        script = scratch / f"step{i}.{'py' if step.get('shell', shell) == 'python' else 'sh'}"
        script.write_text(str(step["run"]), encoding="utf-8")
        cmd = _command(step.get("shell", shell), script, where)
        log = scratch / f"step{i}.log"
        cwd = workspace / ctx.evaluate(str(step.get("working-directory", ".")), where)
        with log.open("w", encoding="utf-8") as out:
            proc = subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                  env={**base_env, **step_env, **{k: str(v) for k, v in files.items()},
                                       "PATH": os.pathsep.join(path)})
        result.ran.append(StepRun(name, proc.returncode, log))
        if "id" in step:
            result.outputs[step["id"]] = read_env_file(files["GITHUB_OUTPUT"])
        env.update(read_env_file(files["GITHUB_ENV"]))
        path[:0] = [p for p in files["GITHUB_PATH"].read_text(encoding="utf-8").splitlines() if p]
        summaries.append(files["GITHUB_STEP_SUMMARY"].read_text(encoding="utf-8"))
        if proc.returncode != 0:
            break
    result.summary = "".join(summaries)
    return result


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of ``path`` (a step's log), for a failure message."""
    return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
