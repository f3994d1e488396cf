"""Dry run of .github/workflows/roll.yml's steps (tests/workflow_dry_run.py) with the CI environment set, in a
clone of this checkout: the roll makes the branch roll/<commit12> and roll.md, and nothing is pushed.

The workflow's ``onto`` input stands in for upstream's newest commit (GitHub is not reachable here): a synthetic
upstream made from this machine's cached pinned base plus one commit the series does not touch, so every patch
applies cleanly.  ``--no-verify`` leaves out the main job (its time on the real llama.cpp is docs/roll.md's
benchmark); actions/cache's restore is stood in for by the cached base tree (tests/test_ci_dry_run.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.matrix.config import load_matrix
from harness.stages.building.source import obtain_base
from test_ci_dry_run import seed_base_cache
from test_roll import clone_of_this_checkout
from workflow_checks import load_workflow
from workflow_dry_run import dry_run, tail

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "roll.yml"
BIN = Path(sys.executable).parent
IDENTITY = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@example.org"}


def lint(tool: str, *argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / tool), *argv], cwd=cwd, capture_output=True, text=True, timeout=120)


def planted(tmp_path: Path, old: str, new: str) -> Path:
    """A copy of roll.yml with ``old`` replaced by ``new``, in ``tmp_path/.github/workflows/``."""
    text = WORKFLOW.read_text(encoding="utf-8")
    assert old in text, old
    copy = tmp_path / ".github" / "workflows" / "roll.yml"
    copy.parent.mkdir(parents=True)
    copy.write_text(text.replace(old, new, 1), encoding="utf-8")
    return copy


def permissions(workflow: dict) -> dict[str, dict]:
    """What each job of ``workflow`` may do, and the workflow's own default."""
    return {"<workflow>": workflow.get("permissions"), **{name: job.get("permissions")
                                                          for name, job in workflow["jobs"].items()}}


def test_actionlint_and_zizmor_pass_on_roll_yml_and_catch_an_unpinned_action(tmp_path: Path):
    proc = lint("actionlint", "-no-color", str(WORKFLOW))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    zizmor = lint("zizmor", "--offline", "--config", str(ROOT / ".github" / "zizmor.yml"), str(WORKFLOW))
    assert zizmor.returncode == 0, zizmor.stdout + zizmor.stderr
    bad = planted(tmp_path, "actions/checkout@08c6903cd8c0fde910a37f88322edcfb5dd907a8  # v5.0.0",
                  "actions/checkout@v5")
    caught = lint("zizmor", "--offline", "--config", str(ROOT / ".github" / "zizmor.yml"), str(bad))
    assert caught.returncode != 0 and "unpinned" in caught.stdout + caught.stderr


def test_the_roll_job_may_write_contents_and_pull_requests_only(tmp_path: Path):
    expected = {"<workflow>": {}, "roll": {"contents": "write", "pull-requests": "write"}}
    assert permissions(load_workflow(WORKFLOW)) == expected
    wider = planted(tmp_path, "      pull-requests: write  # its pull request\n",
                    "      pull-requests: write  # its pull request\n      issues: write\n")
    assert permissions(load_workflow(wider)) != expected


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="not a git checkout")
def test_the_roll_workflow_makes_the_branch_and_roll_md_without_pushing(tmp_path: Path):
    matrix = load_matrix(ROOT / "matrix.yaml")
    cached = obtain_base(matrix).path  # the download cache's entry, filled where no earlier test filled it
    clone = clone_of_this_checkout(tmp_path / "clone")
    seed_base_cache(clone, matrix)
    upstream = tmp_path / "upstream"
    env = {**os.environ, **IDENTITY}
    subprocess.run(["git", "clone", "--quiet", str(cached), str(upstream)], check=True, env=env)
    subprocess.run(["git", "checkout", "--quiet", "-b", "next", matrix.base_commit], cwd=upstream, check=True, env=env)
    (upstream / "ROLL-NOTES.md").write_text("an upstream commit the series does not touch\n")
    subprocess.run(["git", "add", "ROLL-NOTES.md"], cwd=upstream, check=True, env=env)
    subprocess.run(["git", "commit", "--quiet", "-m", "upstream: notes"], cwd=upstream, check=True, env=env)
    new = subprocess.run(["git", "rev-parse", "HEAD"], cwd=upstream, capture_output=True, text=True,
                         check=True).stdout.strip()
    subprocess.run(["git", "config", "user.name", "t"], cwd=clone, check=True)
    subprocess.run(["git", "config", "user.email", "t@example.org"], cwd=clone, check=True)
    workflow = load_workflow(clone / ".github" / "workflows" / "roll.yml")
    run = dry_run(workflow, "roll", clone, tmp_path / "job", [Path(sys.executable).parent],
                  inputs={"onto": f"{upstream}@{new}", "args": "--platform linux-x86_64-cpu --no-verify",
                          "push": "false"},
                  github={"event_name": "workflow_dispatch"})
    failed = [s for s in run.ran if s.returncode != 0]
    assert not failed, f"step {failed[0].name!r} exited {failed[0].returncode}:\n{tail(failed[0].log)}"
    assert [s.name for s in run.ran] == ["Install the harness's requirements", "Roll",
                                         "Push the branch and open the pull request", "The roll's verdict"]
    branch = f"roll/{new[:12]}"
    assert run.outputs["roll"]["rc"] == "0" and run.outputs["roll"]["branch"] == branch
    head = subprocess.run(["git", "rev-parse", "--abbrev-ref", "HEAD"], cwd=clone, capture_output=True, text=True)
    assert head.stdout.strip() == branch
    # the clone's pin, checked to agree with itself by the clone's harness (its relative paths are the clone's)
    pin = subprocess.run([sys.executable, "-c", "from harness.matrix.config import load_matrix; "
                          "print(load_matrix('matrix.yaml').base_commit)"], cwd=clone, capture_output=True, text=True)
    assert pin.stdout.strip() == new, pin.stderr
    record = Path(run.outputs["roll"]["record"])
    assert record.is_file() and record.parent.parent == clone / "results"
    text = record.read_text()
    assert f"# Roll upstream llama.cpp {matrix.base_commit[:12]} → {new[:12]}" in text
    assert text.count("| clean |") == 5 and text in run.summary
    assert "removed: it vendors" in text  # the sdist of the old pin cannot yield the new one
    assert "push: false" in run.ran[2].log.read_text()
    pushed = subprocess.run(["git", "branch", "--list", "roll/*"], cwd=ROOT, capture_output=True, text=True)
    assert branch not in pushed.stdout
