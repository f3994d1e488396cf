"""Roll upstream: move the pin and the patch series to another upstream commit in one command, on a branch.

``llama-fork-harness roll --onto SOURCE [stage options]`` (``nox -s roll --``; SOURCE as ``forecast --onto``,
harness.analysis.forecast.parse_onto):

1. refuses a checkout with uncommitted changes, a dev tree holding work not exported and a roll already in
   progress (exit 2); creates and checks out the branch ``roll/<commit12>`` of the checkout;
2. rebases the series onto the new commit in the dev tree (``<work-dir>/dev/llama.cpp``) patch by patch with
   ``git am -3`` (harness.analysis.forecast_patches.try_patch: clean, 3-way, already upstream, conflict).  A
   patch upstream already holds is dropped.  At a conflict it stops like ``git rebase`` (exit 3): the dev tree
   holds git's conflict and the console names the patch, its files, hunks and the upstream lines met.
   ``roll --continue`` goes on once the person ran ``git am --continue`` (or ``--skip``) there;
   ``roll --abort`` returns to the branch the roll started from, every file as it was;
3. writes the new pin in one commit on the branch (harness.analysis.roll_pin): ``base.commit``, the file
   list and its sha256, ``patches/`` exported, the mirror archive and the sdist source;
4. verifies it: the main job (build, test, compare-outputs) on the new pin with the forecast's
   ``old-base-vs-new-base`` groups, then triage against the newest passed run of the old pin;
5. writes ``results/<run>/roll.md`` (harness.analysis.roll_record), which is also the pull request's body.

Exit codes (harness.common.errors): 0 the new pin passes; 1 it fails a check; 2 bad input (a dirty checkout,
an unreadable SOURCE, nothing to roll); 3 stopped at a conflict, or something asked for did not run.

The state of a roll in progress is ``<work-dir>/roll/state.json`` with the series as it was
(``<work-dir>/roll/old-patches/``): ``--continue`` and ``--abort`` read it.
"""

from __future__ import annotations

import argparse
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from ..common.errors import EXIT_INCOMPLETE
from ..common.statuses import PATCH_ALREADY_UPSTREAM, PATCH_CONFLICT
from ..matrix.config import load_matrix
from ..record.forecast import HunkConflict
from ..stages.building.patches import Git, read_series, reset_to_base
from ..stages.building.source import unexported_work
from .forecast import forecast_base, obtain_pinned_and_onto, parse_onto
from .forecast_patches import try_patch
from .roll_state import (ACTIONS, BRANCH_PREFIX, OUTCOMES, SKIPPED_BY_HAND, RollError, State, checkout_root, option_json, project_git,
                         roll_dir, uncommitted)


def run(args: argparse.Namespace) -> int:
    """``roll --onto SOURCE | --continue | --abort``; returns the exit code (module docstring).  Raises RollError
    (exit 2) for what cannot start or go on, harness.analysis.forecast.ForecastError and
    harness.stages.building.source.SourceError for an unreadable SOURCE."""
    if args.abort:
        return abort(args.work_dir, print)
    if args.continue_:
        state = State.load(args.work_dir)
        return _rebase(state, state.args(args), print, resume=True)
    if not args.onto:
        raise RollError("roll needs --onto SOURCE (or --continue / --abort of a roll in progress)")
    return start(args, print)


def start(args: argparse.Namespace, say: Callable[[str], None]) -> int:
    """Check the checkout, obtain both bases, make the branch and the dev tree, then rebase (:func:`_rebase`)."""
    work = args.work_dir.resolve()
    state_path = roll_dir(work) / "state.json"
    if state_path.is_file():
        raise RollError(f"a roll is in progress ({state_path}): roll --continue or roll --abort")
    matrix = load_matrix(args.matrix)  # a pin that disagrees with itself is refused here
    root = checkout_root(args.matrix)
    dirty = uncommitted(root)
    if dirty:
        raise RollError(f"{root} has uncommitted changes ({', '.join(dirty[:5])}{' ...' if len(dirty) > 5 else ''}); "
                        "commit or stash them first: the roll commits the new pin on a branch")
    pending = unexported_work(work, "dev")
    if pending:
        raise RollError(f"{pending}; export it first (nox -s patches -- export) or discard it: the roll rebases "
                        "the series in the dev tree")
    onto = parse_onto(args.onto)
    patches = read_series(args.patches_dir)
    old, new = obtain_pinned_and_onto(matrix, onto, say)
    if new.commit == old.commit:
        raise RollError(f"{args.onto} is {new.commit[:12]}, the commit already pinned; nothing to roll")
    branch = BRANCH_PREFIX + new.commit[:12]
    if project_git(root, ["rev-parse", "--verify", "--quiet", f"refs/heads/{branch}"], check=False).returncode == 0:
        raise RollError(f"branch {branch} already exists in {root}; delete it (git branch -D {branch}) to roll again")
    previous = project_git(root, ["symbolic-ref", "--quiet", "--short", "HEAD"], check=False).stdout.strip()
    head = project_git(root, ["rev-parse", "HEAD"]).stdout.strip()
    here = roll_dir(work)
    shutil.rmtree(here / "old-patches", ignore_errors=True)
    (here / "old-patches").mkdir(parents=True)
    for p in patches:
        shutil.copyfile(p.path, here / "old-patches" / p.name)
    shutil.copyfile(args.patches_dir / "series", here / "old-patches" / "series")
    dev = work / "dev" / "llama.cpp"
    stamp = work / "dev" / "tree.stamp"
    dev_before = None
    if (dev / ".git").exists():
        dev_git = Git(dev)
        dev_before = {"head": dev_git.commit_id("HEAD"),
                      "branch": dev_git.out(["symbolic-ref", "--quiet", "--short", "HEAD"], check=False),
                      "stamp": stamp.read_text() if stamp.is_file() else None}
    options = {k: option_json(v) for k, v in vars(args).items() if k not in ACTIONS}
    state = State(state_path, {
        "onto": onto.spec, "old": {"commit": old.commit, "git_rev": old.git_rev, "source": old.source},
        "new": {"commit": new.commit, "git_rev": new.git_rev, "source": new.source},
        "checkout": str(root), "previous": previous or head, "head": head, "branch": branch,
        "dev": dev_before, "patches": [p.name for p in patches], "outcomes": [], "stopped": None,
        "stopped_at": None, "started": time.time(), "options": options})
    state.save()
    project_git(root, ["checkout", "--quiet", "-b", branch])
    say(f"roll: {old.commit[:12]} -> {new.commit[:12]} ({new.source}) on branch {branch} of {root}")
    upstream = forecast_base(new, old, patches, here / "upstream")
    if not (dev / ".git").exists():
        shutil.rmtree(dev, ignore_errors=True)
        dev.parent.mkdir(parents=True, exist_ok=True)
        Git(dev.parent).run(["clone", "--quiet", "--no-checkout", str(upstream.path), str(dev)])
    dev_git = Git(dev)
    # the new commit, and the pinned base with the whole series: every blob a patch's index lines name
    dev_git.run(["fetch", "--quiet", "--no-tags", str(upstream.path), f"+{new.git_rev}:refs/roll/new-base",
                 "+refs/heads/forecast-old-fork:refs/roll/old-fork"])
    stamp.unlink(missing_ok=True)
    reset_to_base(dev_git, new.git_rev)
    return _rebase(state, args, say, resume=False)


def _rebase(state: State, args: argparse.Namespace, say: Callable[[str], None], *, resume: bool) -> int:
    """Apply the patches not done yet in the dev tree; stop at a conflict (exit 3), else finish the roll."""
    work = args.work_dir.resolve()
    dev = Git(work / "dev" / "llama.cpp")
    outcomes: list[dict] = state["outcomes"]
    if resume:
        stopped = state["stopped"]
        if not stopped:
            say("roll: nothing was stopped; going on")
        else:
            if dev.am_in_progress():
                raise RollError(f"git am is still stopped in {dev.cwd}: resolve the conflict, `git add` the files and "
                                "`git am --continue` there (or `git am --skip` to drop the patch), then roll --continue")
            head = dev.commit_id("HEAD")
            if head == state["stopped_at"]:
                outcome = SKIPPED_BY_HAND
                detail = "skipped by hand: git am --skip, nothing committed"
            elif dev.out(["rev-parse", f"{head}^"]) == state["stopped_at"]:
                outcome = "resolved"
                detail = "its conflicts resolved by hand: " + stopped["detail"].removeprefix("conflicts in ")
            else:
                raise RollError(f"{dev.cwd}: HEAD {head[:12]} is not one commit on {state['stopped_at'][:12]} (where "
                                f"the roll stopped at {stopped['name']}); one patch, one commit")
            outcomes.append({**stopped, "outcome": outcome, "detail": detail})
            state.data["stopped"] = state.data["stopped_at"] = None
            state.save()
            say(f"roll: patch {stopped['index']} {stopped['name']}: {OUTCOMES[outcome]}")
    here = roll_dir(work)
    names: list[str] = state["patches"]
    patches = read_series(here / "old-patches")
    for index, patch in enumerate(patches[len(outcomes):], start=len(outcomes) + 1):
        head = dev.commit_id("HEAD")
        o = try_patch(dev, patch, index, leave_conflict=True)
        record = {"index": index, "name": patch.name, "subject": patch.subject, "files": o.files,
                  "detail": o.detail, "conflicts": [asdict(c) for c in o.conflicts]}
        if o.status == PATCH_CONFLICT:
            state.data["stopped"] = record
            state.data["stopped_at"] = head
            state.save()
            _say_conflict(say, record, dev.cwd, len(names), state)
            from .roll_record import write_stopped
            path = write_stopped(state, here / "roll.md")
            say(f"roll: {path}")
            return EXIT_INCOMPLETE
        outcome = "dropped" if o.status == PATCH_ALREADY_UPSTREAM else o.status
        outcomes.append({**record, "outcome": outcome})
        state.save()
        say(f"roll: patch {index} {patch.name}: {OUTCOMES[outcome]} — {o.detail}")
    from .roll_pin import finish
    return finish(state, args, say)


def _say_conflict(say: Callable[[str], None], record: dict, dev: Path, total: int, state: State) -> None:
    """The console's account of a stop: the patch, then per conflict its file, hunk and the upstream lines met."""
    say(f"roll: patch {record['index']} of {total} {record['name']}: conflict — stopped")
    for c in (HunkConflict(**c) for c in record["conflicts"]):
        say(f"  {c.file} {c.hunk}" + (f" ({c.reason})" if c.reason else ""))
        say("    the patch writes:")
        say("".join(f"      {line}\n" for line in c.wanted).rstrip("\n") or "      (nothing)")
        where = f"line {c.upstream_line} of the new base" if c.upstream_line else "not in the new base"
        say(f"    upstream has there ({where}):")
        say("".join(f"      {line}\n" for line in c.upstream).rstrip("\n") or "      (nothing)")
    say(f"roll: {dev} holds the conflict: resolve it, `git add` the files and `git am --continue` there "
        f"(or `git am --skip` to drop the patch), then `llama-fork-harness roll --continue`; `roll --abort` "
        f"returns to {state['previous']} with every file as it was")


def abort(work_dir: Path, say: Callable[[str], None]) -> int:
    """``roll --abort``: the checkout back on the branch the roll started from (the roll's branch deleted, every
    tracked file as that branch has it), the dev tree back at its commit (or removed when the roll made it), the
    roll's directory removed; returns 0.  RollError when no roll is in progress."""
    state = State.load(work_dir)
    work = work_dir.resolve()
    root = Path(state["checkout"])
    project_git(root, ["checkout", "--quiet", "--force", state["previous"]])
    if project_git(root, ["rev-parse", "--verify", "--quiet", f"refs/heads/{state['branch']}"],
                   check=False).returncode == 0:
        project_git(root, ["branch", "--quiet", "-D", state["branch"]])
    dev = work / "dev" / "llama.cpp"
    before = state["dev"]
    if before is None:
        shutil.rmtree(dev, ignore_errors=True)
        stamp = work / "dev" / "tree.stamp"
        stamp.unlink(missing_ok=True)
        try:
            (work / "dev").rmdir()
        except OSError:
            pass
    elif (dev / ".git").exists():
        git = Git(dev)
        if git.am_in_progress():
            git.run(["am", "--abort"], check=False)
            if git.am_in_progress():
                git.run(["am", "--quit"])
        if before["branch"]:
            git.run(["checkout", "--quiet", "--force", "-B", before["branch"], before["head"]])
        else:
            git.run(["checkout", "--quiet", "--force", "--detach", before["head"]])
        git.clean_tree()
        for ref in ("refs/roll/new-base", "refs/roll/old-fork"):
            git.run(["update-ref", "-d", ref], check=False)
        stamp = work / "dev" / "tree.stamp"
        if before["stamp"] is None:
            stamp.unlink(missing_ok=True)
        else:
            stamp.write_text(before["stamp"])
    shutil.rmtree(roll_dir(work), ignore_errors=True)
    try:
        work.rmdir()  # the roll made it
    except OSError:
        pass
    say(f"roll: aborted; {root} is on {state['previous']} as it was, the dev tree too")
    return 0


def main(argv: list[str]) -> int:
    """``roll`` with ``argv``, parsed as the command line parses it (harness.cli); returns :func:`run`'s code."""
    from ..cli import parse_command
    return run(parse_command("roll", argv))
