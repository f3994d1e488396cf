"""Tests for the roll (harness.upstream.roll, roll_pin, roll_record) and the pin's agreement (harness.matrix.pin).

The roll creates branches and commits, so every test rolls a project of its own: a git checkout in a temporary
directory holding the fake project's matrix.yaml (tests/fake_upstream.py, make_drift_project), its five-patch
series, its file list and a mirror archive, beside a synthetic upstream repository made from the pinned base
plus one commit that moves lines near patch 1's hunk (3-way), rewrites the line patch 2 changes (conflict) and
already holds patch 3's change (dropped).  The tests that run git only are in the fast tier; the one that
resolves the conflict, continues and runs the main job on the new pin builds the fake project (slow)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fake_upstream import NOTES, OTHER, _git, _lines, make_drift_project
from harness.common.errors import EXIT_BAD_INPUT, EXIT_INCOMPLETE, EXIT_PASSED
from harness.matrix.config import MatrixError, load_matrix
from harness.matrix.pin import rewrite_yaml
from harness.stages.building.source import BaseTree, export_mirror, write_pinned_files

ROOT = Path(__file__).resolve().parents[1]
IGNORED = "upstream/\nwork/\nresults/\ncache/\nmirror/\n*.gguf\n"


class Project:
    """A checkout with a pin (commit, file list, mirror archive) and a series, and the synthetic upstream."""

    def __init__(self, root: Path):
        d = make_drift_project(root)
        self.root, self.p, self.old = root, d.project, d.old
        repo = self.p.repo
        base = BaseTree(repo, d.old, d.old, "local")
        files = root / "upstream-files" / f"llama.cpp-{d.old[:12]}.files"
        digest = write_pinned_files(base, files)
        mirror = root / "mirror" / f"llama.cpp-{d.old[:12]}.tar.gz"
        export_mirror(base, mirror)
        text = self.p.matrix.read_text()
        text = text.replace("  sources:\n", f"  files:\n    path: {files}\n    sha256: {digest}\n  sources:\n", 1)
        text = text.replace(f"      path: {repo}\n", f"      path: {repo}\n    - kind: archive  # the trimmed mirror\n"
                                                     f"      path: {mirror}\n      sha256_file: {mirror}.sha256\n", 1)
        self.p.matrix.write_text(text)
        # the synthetic upstream: patch 1's hunk moved and its context changed, patch 2's line rewritten,
        # patch 3's change already made
        _git(repo, "checkout", "-q", "-B", "next", d.old)
        (repo / "notes.txt").write_text(_lines(NOTES, {3: "line 3 (upstream)", 20: "line 20 (upstream rewrite)"},
                                               prepend="".join(f"new {i}\n" for i in range(1, 6))))
        (repo / "other.txt").write_text(_lines(OTHER, {3: "other 3 (fork)"}))
        _git(repo, "commit", "-q", "-am", "upstream: reword the notes, take the fork's third line")
        self.new = _git(repo, "rev-parse", "HEAD")
        _git(repo, "checkout", "-q", "main")
        (root / ".gitignore").write_text(IGNORED)
        _git(root, "init", "-q", "-b", "main")
        _git(root, "add", "-A")
        _git(root, "commit", "-q", "-m", "the fork's checkout")

    def roll_argv(self, *extra: str, launcher: tuple[str, ...] = ("-m", "harness")) -> list[str]:
        return [sys.executable, *launcher, "roll", "--matrix", str(self.p.matrix), "--patches-dir",
                str(self.p.patches), "--work-dir", str(self.p.work), "--results-dir", str(self.p.results), *extra]

    def roll_env(self, **extra: str) -> dict[str, str]:
        return self.p.env(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.org", GIT_COMMITTER_NAME="t",
                          GIT_COMMITTER_EMAIL="t@example.org", **extra)

    def roll(self, *extra: str, launcher: tuple[str, ...] = ("-m", "harness"), **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(self.roll_argv(*extra, launcher=launcher), env=self.roll_env(**env), capture_output=True,
                              text=True, cwd=ROOT, timeout=600)

    def start_roll(self, *extra: str, **env: str) -> subprocess.Popen:
        """The roll in the background, for a test that interrupts it."""
        return subprocess.Popen(self.roll_argv(*extra), env=self.roll_env(**env), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=ROOT)

    def quiet_upstream(self) -> str:
        """A commit on the pinned base that only adds a file the series does not touch: every patch clean."""
        repo = self.p.repo
        _git(repo, "checkout", "-q", "-B", "quiet", self.old)
        (repo / "UPSTREAM.md").write_text("upstream's notes\n")
        _git(repo, "add", "UPSTREAM.md")
        _git(repo, "commit", "-q", "-m", "upstream: notes")
        _git(repo, "checkout", "-q", "main")
        return _git(repo, "rev-parse", "quiet")

    def patches_check(self) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "harness", "patches", "check", "--matrix", str(self.p.matrix),
                               "--patches-dir", str(self.p.patches), "--work-dir", str(self.p.work)],
                              env=self.p.env(), capture_output=True, text=True, cwd=ROOT)

    def checkout_state(self) -> dict[str, str]:
        """:func:`snapshot` without the runs (results/), the main job's builds (the work dir but the dev tree and the
        roll's own directory) and the summary the harness caches beside this project's model: records and caches,
        which ``--abort`` leaves as they were written."""
        keep_work = ("work/dev/", "work/roll/")
        return {k: v for k, v in self.snapshot().items()
                if not k.startswith("results/") and (not k.startswith("work/") or k.startswith(keep_work))
                and k != "tiny.gguf.summary.json"}

    def assert_restored(self, before: dict[str, str]) -> None:
        aborted = self.roll("--abort")
        assert aborted.returncode == EXIT_PASSED, aborted.stdout + aborted.stderr
        assert self.branch() == "main"
        assert self.checkout_state() == before
        assert not (self.p.work / "roll").exists()
        check = self.patches_check()
        assert check.returncode == 0, check.stdout + check.stderr

    def onto(self) -> list[str]:
        return ["--onto", f"{self.p.repo}@{self.new}", "--platform", "linux-x86_64-cpu", "-j", "1"]

    def branch(self) -> str:
        return _git(self.root, "rev-parse", "--abbrev-ref", "HEAD")

    def snapshot(self) -> dict[str, str]:
        return snapshot(self.root)


def snapshot(root: Path) -> dict[str, str]:
    """Every file under the checkout ``root`` but git's own and the download cache, by sha256; its branches and
    HEAD."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith((".git/", "cache/", "upstream/.git/")) or not path.is_file():
            continue
        out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    out["<branches>"] = _git(root, "branch", "--list")
    out["<HEAD>"] = _git(root, "rev-parse", "HEAD")
    return out


@pytest.fixture
def project(tmp_path: Path) -> Project:
    return Project(tmp_path / "checkout")


def _resolve_by_hand(dev: Path) -> None:
    """The person's resolution of patch 2: upstream's notes with the fork's line 20, then git am --continue."""
    text = (dev / "notes.txt").read_text()
    assert "<<<<<<<" in text
    lines, keep = [], True
    for line in text.splitlines():
        if line.startswith("<<<<<<<"):
            keep = False
        elif line == "=======":
            keep = True
        elif line.startswith(">>>>>>>"):
            continue
        elif keep:
            lines.append(line)
    (dev / "notes.txt").write_text("\n".join(lines) + "\n")
    env = {**os.environ, "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org"}
    subprocess.run(["git", "add", "notes.txt"], cwd=dev, check=True, env=env)
    subprocess.run(["git", "am", "--continue"], cwd=dev, check=True, env=env, capture_output=True)


def test_a_dirty_checkout_is_refused(project: Project):
    before = project.snapshot()
    with open(project.p.matrix, "a") as fh:
        fh.write("# an edit not committed\n")
    proc = project.roll(*project.onto())
    assert proc.returncode == EXIT_BAD_INPUT, proc.stderr
    assert "uncommitted changes" in proc.stderr and "matrix.yaml" in proc.stderr
    assert project.branch() == "main"
    assert not (project.p.work / "roll").exists()
    _git(project.root, "checkout", "--", "matrix.yaml")
    assert project.snapshot() == before


@pytest.mark.parametrize("name", ["wip-fix.diff", "mark-line-20-of-the-notes.patch.orig", "notes/"])
def test_a_file_in_patches_the_export_does_not_write_is_refused_up_front(project: Project, name: str):
    before = project.snapshot()
    stray = project.p.patches / name.rstrip("/")
    if name.endswith("/"):
        stray.mkdir()
        (stray / "todo.txt").write_text("a note\n")
    else:
        stray.write_text("--- a/notes.txt\n+++ b/notes.txt\n")
    proc = project.roll(*project.onto())
    assert proc.returncode == EXIT_BAD_INPUT, proc.stdout + proc.stderr
    assert f"holds {name}, not part of the series" in proc.stderr
    assert project.branch() == "main" and not (project.p.work / "roll").exists()
    assert not _git(project.root, "branch", "--list", "roll/*")
    shutil.rmtree(stray) if stray.is_dir() else stray.unlink()
    assert project.snapshot() == before


def test_the_roll_stops_at_a_conflict_naming_the_hunk_and_abort_restores_every_file(project: Project):
    before = project.snapshot()
    proc = project.roll(*project.onto())
    assert proc.returncode == EXIT_INCOMPLETE, proc.stdout + proc.stderr
    out = proc.stdout
    assert "patch 1 mark-line-5-of-the-notes.patch: 3-way" in out
    assert "patch 2 of 5 mark-line-20-of-the-notes.patch: conflict — stopped" in out
    assert "notes.txt @@ -17,7 +17,7 @@" in out
    assert "line 20 (upstream rewrite)" in out and "line 20 (fork)" in out
    assert project.branch() == f"roll/{project.new[:12]}"
    dev = project.p.work / "dev" / "llama.cpp"
    assert "<<<<<<<" in (dev / "notes.txt").read_text()  # the dev tree holds git's conflict
    stopped = (project.p.work / "roll" / "roll.md").read_text()
    assert "conflict: the roll stopped here" in stopped and "`notes.txt` `@@ -17,7 +17,7 @@" in stopped
    # a second roll, or continuing before git am is done, is refused
    again = project.roll(*project.onto())
    assert again.returncode == EXIT_BAD_INPUT and "a roll is in progress" in again.stderr
    early = project.roll("--continue")
    assert early.returncode == EXIT_BAD_INPUT and "git am is still stopped" in early.stderr
    aborted = project.roll("--abort")
    assert aborted.returncode == EXIT_PASSED, aborted.stderr
    assert project.branch() == "main"
    assert project.snapshot() == before


def test_a_conflict_in_a_file_upstream_renamed_names_both_paths_and_the_hunk(project: Project):
    repo = project.p.repo
    _git(repo, "checkout", "-q", "-B", "moved", project.old)
    _git(repo, "mv", "notes.txt", "notes-moved.txt")
    (repo / "notes-moved.txt").write_text(_lines(NOTES, {20: "line 20 (upstream rewrite)"}))
    _git(repo, "commit", "-q", "-am", "upstream: move the notes, reword line 20")
    moved = _git(repo, "rev-parse", "HEAD")
    _git(repo, "checkout", "-q", "main")
    before = project.snapshot()
    proc = project.roll("--onto", f"{repo}@{moved}", "--platform", "linux-x86_64-cpu")
    assert proc.returncode == EXIT_INCOMPLETE, proc.stdout + proc.stderr
    assert "patch 2 of 5 mark-line-20-of-the-notes.patch: conflict — stopped" in proc.stdout
    assert "  notes-moved.txt (renamed from notes.txt) @@ -17,7 +17,7 @@" in proc.stdout
    stopped = (project.p.work / "roll" / "roll.md").read_text()
    assert "### mark-line-20-of-the-notes.patch: `notes-moved.txt` `@@ -17,7 +17,7 @@ line 16` (upstream renamed it " \
        "from `notes.txt`)" in stopped
    assert "conflicts in notes-moved.txt (renamed from notes.txt) @@ -17,7 +17,7 @@" in stopped
    # the upstream facts a finished roll's roll.md gives: the commits between them and both dates
    assert "- between them: 1 upstream commits" in stopped and "date unknown" not in stopped
    assert project.roll("--abort").returncode == EXIT_PASSED
    assert project.snapshot() == before


def test_a_hand_edit_of_base_commit_alone_is_refused_naming_what_disagrees(project: Project):
    text = project.p.matrix.read_text().replace(f"commit: {project.old}", f"commit: {project.new}")
    project.p.matrix.write_text(text)
    with pytest.raises(MatrixError) as err:
        load_matrix(project.p.matrix)
    message = str(err.value)
    assert "base.files.path: the pin disagrees with itself" in message
    assert f"lists commit {project.old}" in message
    assert f"holds commit {project.old}" in message  # the mirror archive's manifest
    check = subprocess.run([sys.executable, "-m", "harness", "patches", "check", "--matrix", str(project.p.matrix),
                            "--patches-dir", str(project.p.patches), "--work-dir", str(project.p.work)],
                           env=project.p.env(), capture_output=True, text=True, cwd=ROOT)
    assert check.returncode == EXIT_BAD_INPUT and "the pin disagrees with itself" in check.stderr
    project.p.matrix.write_text(text.replace(f"commit: {project.new}", f"commit: {project.old}"))
    load_matrix(project.p.matrix)  # the pin as it was agrees with itself


def test_rewrite_yaml_replaces_scalars_and_removes_items_keeping_comments():
    text = ("base:\n  commit: aaa  # the pin\n  sources:\n    - kind: local   # first\n      path: ../x\n"
            "    - kind: pypi-sdist  # the sdist\n      version: 0.3.36\n      sha256: bbb\n"
            "    - kind: git\n      url: https://example.org/x.git\n# after\n")
    out = rewrite_yaml(text, {("base", "commit"): "ccc", ("base", "sources", 0, "path"): "../y"},
                       [("base", "sources", 1)])
    assert out == ("base:\n  commit: ccc  # the pin\n  sources:\n    - kind: local   # first\n      path: ../y\n"
                   "    - kind: git\n      url: https://example.org/x.git\n# after\n")
    last = rewrite_yaml(text, {("base", "sources", 1, "version"): "0.4"}, [("base", "sources", 2)])
    assert "version: \"0.4\"" in last and "kind: git" not in last and last.endswith("# after\n")
    with pytest.raises(KeyError):
        rewrite_yaml(text, {("base", "nothing"): "x"})


@pytest.mark.slow
def test_roll_resolved_by_hand_continues_to_a_consistent_verified_pin(project: Project):
    # a passed run of the old pin for the roll to triage against (results/ is not part of the checkout)
    first = subprocess.run(project.p.argv("build", "test", "compare-outputs"), env=project.p.env(), cwd=ROOT,
                           capture_output=True, text=True)
    assert first.returncode == 0, first.stdout[-2000:]
    old_run = (project.p.results / "latest").resolve().name
    proc = project.roll(*project.onto())
    assert proc.returncode == EXIT_INCOMPLETE, proc.stdout + proc.stderr
    _resolve_by_hand(project.p.work / "dev" / "llama.cpp")
    # a file left in patches/ while the roll stopped is refused before anything is written
    stray = project.p.patches / "mark-line-20-of-the-notes.patch.orig"
    stray.write_text("the old hunk\n")
    refused = project.roll("--continue")
    assert refused.returncode == EXIT_BAD_INPUT and f"holds {stray.name}, not part of the series" in refused.stderr
    assert "roll: stopped; `llama-fork-harness roll --continue` goes on from here" in refused.stderr
    assert _git(project.root, "rev-parse", "HEAD") == _git(project.root, "rev-parse", "main")
    stray.unlink()
    done = project.roll("--continue")
    assert done.returncode == EXIT_PASSED, done.stdout[-3000:] + done.stderr[-3000:]
    # the roll commit holds the pin and patches/ as the export writes them, nothing else
    changed = _git(project.root, "diff-tree", "--no-commit-id", "--name-status", "-r", "HEAD").splitlines()
    assert sorted(changed) == sorted([
        "M\tmatrix.yaml", "M\tpatches/series", f"A\tupstream-files/llama.cpp-{project.new[:12]}.files",
        f"D\tupstream-files/llama.cpp-{project.old[:12]}.files", "D\tpatches/mark-the-third-other-line.patch",
        "M\tpatches/mark-line-5-of-the-notes.patch", "M\tpatches/mark-line-20-of-the-notes.patch"]), changed
    assert "patch 3 mark-the-third-other-line.patch: dropped (already upstream)" in done.stdout
    assert project.branch() == f"roll/{project.new[:12]}"
    assert not _git(project.root, "status", "--porcelain", "--untracked-files=no")
    # the pin names the new commit everywhere, and agrees with itself
    m = load_matrix(project.p.matrix)
    assert m.base_commit == project.new
    assert m.base_files.name == f"llama.cpp-{project.new[:12]}.files"
    assert not (project.root / "upstream-files" / f"llama.cpp-{project.old[:12]}.files").exists()
    mirror = next(s for s in m.sources if s.kind == "archive")
    assert mirror.path.name == f"llama.cpp-{project.new[:12]}.tar.gz" and mirror.path.is_file()
    series = (project.p.patches / "series").read_text()
    assert "mark-the-third-other-line.patch" not in series and "mark-line-20-of-the-notes.patch" in series
    subject = _git(project.root, "log", "-1", "--format=%s")
    assert subject == f"Roll upstream llama.cpp from {project.old[:12]} to {project.new[:12]}"
    check = subprocess.run([sys.executable, "-m", "harness", "patches", "check", "--matrix", str(project.p.matrix),
                            "--patches-dir", str(project.p.patches), "--work-dir", str(project.p.work)],
                           env=project.p.env(), capture_output=True, text=True, cwd=ROOT)
    assert check.returncode == 0, check.stdout + check.stderr
    run_dir = (project.p.results / "latest").resolve()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["overall"] == "passed"
    roll_md = (run_dir / "roll.md").read_text()
    for line in ("| 1 | mark-line-5-of-the-notes.patch | 3-way |",
                 "| 2 | mark-line-20-of-the-notes.patch | resolved by hand |",
                 "| 3 | mark-the-third-other-line.patch | dropped (already upstream) |",
                 "| 4 | mark-the-fifteenth-other-line.patch | clean |",
                 "| 5 | start-the-argument-count-at-the-api-value.patch | clean |",
                 "- between them: 1 upstream commits", "source 2 (archive): updated to",
                 "## What upstream changed in the outputs", "tiny/one: identical"):
        assert line in roll_md, line
    assert f"## Against the old pin's last passed run ({old_run})" in roll_md
    assert "no passed run of the old pin" not in roll_md
    assert "-line 20 (fork)" not in roll_md  # the resolution kept the fork's line
    assert "### mark-line-20-of-the-notes.patch: against its old version" in roll_md


# --------------------------------------------------------------------------- interrupted rolls

#: A ``git`` first on PATH that becomes ``sleep 120``, after touching $ROLL_MARK, where it would ``git am`` patch 2
#: of the series in the dev tree ($ROLL_DEV); every other call is the real git.
SLOW_AM = """#!/usr/bin/env bash
if [ "$PWD" = "$ROLL_DEV" ] && [[ " $* " == *" am "* ]] && [[ "$*" == *mark-line-20-of-the-notes.patch* ]]; then
    touch "$ROLL_MARK"
    exec sleep 120
fi
exec {git} "$@"
"""

#: ``roll`` with Ctrl-C sent to itself once triage has finished, before roll.md is written.
AFTER_TRIAGE = """
import os, signal, sys
from harness.upstream import roll_record
triage = roll_record.RollRecord.triage_against_old_pin
def then_interrupt(self, *args, **kwargs):
    triage(self, *args, **kwargs)
    os.kill(os.getpid(), signal.SIGINT)
roll_record.RollRecord.triage_against_old_pin = then_interrupt
from harness.cli import main
sys.exit(main(sys.argv[1:]))
"""


def wait_for(path: Path, what: str, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the roll ended (exit {proc.returncode}) before {what}:\n"
                                 + proc.stdout.read()[-3000:] + proc.stderr.read()[-3000:])
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def interrupted(proc: subprocess.Popen) -> tuple[str, str]:
    """Ctrl-C to the roll; its output, once it says how to go on or go back (exit 130)."""
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-3000:] + err[-3000:]
    assert "Traceback" not in err, err
    said = out + err
    assert "roll --continue` goes on from here" in said and "roll --abort` goes back" in said, said[-3000:]
    return out, err


def _interrupt_patch_2(project: Project, tmp_path: Path) -> str:
    """Roll onto the synthetic upstream and press Ctrl-C while the dev tree's ``git am`` of patch 2 runs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "git").write_text(SLOW_AM.format(git=shutil.which("git")))
    (bin_dir / "git").chmod(0o755)
    mark = tmp_path / "am-started"
    env = project.p.env()
    proc = project.start_roll(*project.onto(), PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", ROLL_MARK=str(mark),
                              ROLL_DEV=str(project.p.work / "dev" / "llama.cpp"))
    wait_for(mark, "patch 2's git am", proc)
    out, _ = interrupted(proc)
    assert "patch 1 mark-line-5-of-the-notes.patch: 3-way" in out and "patch 2" not in out
    assert project.branch() == f"roll/{project.new[:12]}"
    return out


def test_ctrl_c_during_the_series_is_undone_by_abort(project: Project, tmp_path: Path):
    before = project.checkout_state()
    _interrupt_patch_2(project, tmp_path)
    project.assert_restored(before)


def test_continue_after_ctrl_c_during_the_series_tries_the_patch_again(project: Project, tmp_path: Path):
    before = project.checkout_state()
    _interrupt_patch_2(project, tmp_path)
    again = project.roll("--continue")
    assert again.returncode == EXIT_INCOMPLETE, again.stdout + again.stderr  # patch 2 meets upstream's rewrite
    assert "patch 2 mark-line-20-of-the-notes.patch was being tried when the roll stopped; again" in again.stdout
    assert "patch 1" not in again.stdout  # done before the stop, not applied again
    assert "patch 2 of 5 mark-line-20-of-the-notes.patch: conflict — stopped" in again.stdout
    dev = project.p.work / "dev" / "llama.cpp"
    assert _git(dev, "rev-list", "--count", "refs/roll/new-base..HEAD") == "1"  # patch 1 once
    project.assert_restored(before)


def test_abort_at_a_conflict_restores_the_checkout_and_patches_check_passes(project: Project):
    before = project.checkout_state()
    proc = project.roll(*project.onto())
    assert proc.returncode == EXIT_INCOMPLETE, proc.stdout + proc.stderr
    assert "`llama-fork-harness roll --continue`" in proc.stdout and "`llama-fork-harness roll --abort`" in proc.stdout
    project.assert_restored(before)


def _interrupt_the_main_job(project: Project, where: str) -> tuple[str, str]:
    """Roll onto :meth:`Project.quiet_upstream` and press Ctrl-C during the main job's fork build or its first
    generation (``where``: build, compare)."""
    new = project.quiet_upstream()
    pids = project.root.parent / "pids"  # beside the checkout, not in it
    mark = project.root.parent / "generating"
    slow = {"build": {"FAKE_BUILD_SLEEP_S": "120", "FAKE_PIDS": str(pids)},
            "compare": {"FAKE_GEN_SLEEP_S": "120", "FAKE_SLOW_MARK": str(mark)}}[where]
    proc = project.start_roll("--onto", f"{project.p.repo}@{new}", "--platform", "linux-x86_64-cpu", "-j", "1",
                              **slow)
    wait_for(pids if where == "build" else mark, f"the main job's {where}", proc)
    out, err = interrupted(proc)
    assert f"roll: committed the new pin on roll/{new[:12]}" in out
    assert (project.p.work / "roll" / "state.json").is_file()  # the roll is not done: it goes on or goes back
    run = json.loads(((project.p.results / "latest").resolve() / "summary.json").read_text())
    assert run["overall"] == "incomplete"
    return out, err


@pytest.mark.slow
@pytest.mark.parametrize("where", ["build", "compare"])
def test_ctrl_c_during_the_main_job_is_undone_by_abort(project: Project, where: str):
    before = project.checkout_state()
    _interrupt_the_main_job(project, where)
    assert project.branch() != "main"
    project.assert_restored(before)
    assert not (project.root / "mirror" / f"llama.cpp-{_git(project.p.repo, 'rev-parse', 'quiet')[:12]}.tar.gz").exists()


@pytest.mark.slow
def test_continue_after_ctrl_c_in_the_main_job_runs_it_again_without_the_series(project: Project):
    _interrupt_the_main_job(project, "build")
    first = (project.p.results / "latest").resolve().name
    done = project.roll("--continue")
    assert done.returncode == EXIT_PASSED, done.stdout[-3000:] + done.stderr[-3000:]
    assert "running the main job on it again" in done.stdout
    assert "roll: patch" not in done.stdout and "committed the new pin" not in done.stdout  # the series not again
    assert "roll: the new pin passed" in done.stdout
    again = (project.p.results / "latest").resolve()
    assert again.name != first and json.loads((again / "summary.json").read_text())["overall"] == "passed"
    assert "**Verdict: the new pin passed**" in (again / "roll.md").read_text()
    assert not (project.p.work / "roll").exists()  # done: nothing left to go on with or go back to
    assert project.roll("--abort").returncode == EXIT_BAD_INPUT


@pytest.mark.slow
def test_ctrl_c_after_triage_is_undone_by_abort(project: Project):
    before = project.checkout_state()
    new = project.quiet_upstream()
    proc = project.roll("--onto", f"{project.p.repo}@{new}", "--platform", "linux-x86_64-cpu", "-j", "1",
                        launcher=("-c", AFTER_TRIAGE))
    assert proc.returncode == 130, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "roll --continue` goes on from here" in proc.stderr and "Traceback" not in proc.stderr
    run_dir = (project.p.results / "latest").resolve()
    assert json.loads((run_dir / "summary.json").read_text())["overall"] == "passed"  # the main job had finished
    assert not (run_dir / "roll.md").exists()
    project.assert_restored(before)


# --------------------------------------------------------------------------- the real series


def clone_of_this_checkout(dst: Path) -> Path:
    """A clone of this repository carrying the working tree as git sees it (tracked changes and untracked files
    git does not ignore), so that the roll commits there and never here."""
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(dst)], check=True)
    diff = subprocess.run(["git", "diff", "--binary", "HEAD"], cwd=ROOT, capture_output=True, check=True).stdout
    if diff:
        subprocess.run(["git", "apply", "--binary", "-"], cwd=dst, input=diff, check=True)
    untracked = subprocess.run(["git", "ls-files", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                               capture_output=True, check=True).stdout
    for name in filter(None, untracked.split(b"\0")):
        target = dst / os.fsdecode(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((ROOT / os.fsdecode(name)).read_bytes())
    if subprocess.run(["git", "status", "--porcelain"], cwd=dst, capture_output=True, text=True).stdout.strip():
        _git(dst, "add", "-A")
        _git(dst, "commit", "-q", "-m", "the working tree")
    return dst


@pytest.mark.slow
@pytest.mark.network
def test_roll_onto_the_real_0_3_35_sdist_stops_at_patch_1_in_build_info_and_abort_restores(tmp_path: Path):
    clone = clone_of_this_checkout(tmp_path / "clone")
    before = snapshot(clone)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_RUN")}
    argv = [sys.executable, "-m", "harness", "roll", "--onto", "pypi-sdist:llama-cpp-python==0.3.35"]
    proc = subprocess.run(argv, cwd=clone, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == EXIT_INCOMPLETE, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "patch 1 of 5 build-info-name-the-applied-patch-series.patch: conflict — stopped" in proc.stdout
    assert "common/build-info.cpp.in @@ -32,4 +37,5 @@" in proc.stdout  # as the forecast predicts (docs/forecast.md)
    assert _git(clone, "rev-parse", "--abbrev-ref", "HEAD") == "roll/4df29be4f4c3"
    assert "<<<<<<<" in (clone / ".harness" / "dev" / "llama.cpp" / "common" / "build-info.cpp.in").read_text()
    aborted = subprocess.run([*argv[:4], "--abort"], cwd=clone, env=env, capture_output=True, text=True)
    assert aborted.returncode == EXIT_PASSED, aborted.stderr
    assert snapshot(clone) == before


def test_an_sdist_whose_cached_checkout_vendors_another_commit_disagrees(project: Project, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch):
    from dataclasses import replace

    from harness.matrix.config import Source
    from harness.matrix.pin import pin_problems
    vendored = tmp_path / "cache" / "sdists" / "llama_cpp_python-9.9.9" / "llama_cpp_python-9.9.9" / "vendor" / "llama.cpp"
    vendored.parent.mkdir(parents=True)
    subprocess.run(["git", "clone", "--quiet", str(project.p.repo), str(vendored)], check=True)
    _git(vendored, "checkout", "-q", "--detach", project.new)
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    sdist = Source("pypi-sdist", package="llama-cpp-python", version="9.9.9", subdir="vendor/llama.cpp")
    matrix = replace(load_matrix(project.p.matrix), sources=(sdist,))
    problems = pin_problems(matrix, lambda keys: 1)
    assert problems == [f"{project.p.matrix}:1: base.sources.0.version: the pin disagrees with itself: "
                        f"llama-cpp-python 9.9.9 vendors commit {project.new} (its vendor/llama.cpp in the download "
                        f"cache), base.commit is {project.old[:12]} (`roll --onto SOURCE` writes every part of a pin)"]
    _git(vendored, "checkout", "-q", "--detach", project.old)
    assert pin_problems(matrix, lambda keys: 1) == []
