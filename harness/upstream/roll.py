"""Roll upstream: move the pin and the patch series to another upstream commit in one command, on a branch.

``llama-fork-harness roll --onto SOURCE [stage options]`` (``nox -s roll --``; SOURCE as ``forecast --onto``,
harness.upstream.forecast.parse_onto):

1. refuses a checkout with uncommitted changes, a dev tree holding work not exported, a roll already in
   progress and an entry of ``patches/`` the export does not write (exit 2); creates and checks out the branch
   ``roll/<commit12>`` of the checkout;
2. rebases the series onto the new commit in the dev tree (``<work-dir>/dev/llama.cpp``) patch by patch with
   ``git am -3`` (harness.upstream.forecast_patches.try_patch: clean, 3-way, already upstream, conflict).  A
   patch upstream already holds is dropped.  At a conflict it stops like ``git rebase`` (exit 3): the dev tree
   holds git's conflict and the console names the patch, its files, hunks and the upstream lines met.
   ``roll --continue`` goes on once the person ran ``git am --continue`` (or ``--skip``) there;
   ``roll --abort`` returns to the branch the roll started from, every file as it was;
3. writes the new pin in one commit on the branch (harness.upstream.roll_pin): ``base.commit``, the file
   list and its sha256, ``patches/`` exported, the mirror archive and the sdist source;
4. verifies it: the main job (build, test, compare-outputs) on the new pin with the forecast's
   ``old-base-vs-new-base`` groups, then triage against the newest passed run of the old pin;
5. writes ``results/<run>/roll.md`` (harness.upstream.roll_record), which is also the pull request's body.

Exit codes (harness.common.errors): 0 the new pin passes; 1 it fails a check; 2 bad input (a dirty checkout,
an unreadable SOURCE, nothing to roll); 3 stopped at a conflict, or something asked for did not run; 130 or 143
interrupted (SIGINT, SIGTERM).

The state of a roll in progress is ``<work-dir>/roll/state.json`` with the series as it was
(``<work-dir>/roll/old-patches/``): ``--continue`` and ``--abort`` read it.  It lives from the start until
roll.md is written, through three phases (roll_state.PHASE_SERIES, PHASE_PIN, PHASE_VERIFY), so that from any
point, a conflict, Ctrl-C or a killed main job, ``--abort`` goes back and ``--continue`` goes on: in the series
from the patch that was being tried, in the pin by writing it again, in the main job by running it again in a
new run.  Every stop prints both commands (roll_state.ON_OR_BACK).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from ..common import proc
from ..common.errors import EXIT_INCOMPLETE, HarnessError
from ..common.statuses import PATCH_ALREADY_UPSTREAM, PATCH_CONFLICT
from ..matrix.config import load_matrix
from ..record.forecast import HunkConflict
from ..stages.building.patches import Git, read_series, reset_to_base
from ..stages.building.source import unexported_work
from .forecast import forecast_base, obtain_pinned_and_onto, parse_onto
from .forecast_patches import try_patch
from .roll_record import upstream_facts, write_stopped
from .roll_state import (ACTIONS, BRANCH_PREFIX, ON_OR_BACK, OUTCOMES, PHASE_PIN, PHASE_SERIES, PHASE_VERIFY,
                         SKIPPED_BY_HAND, RollError, State, checkout_root, option_json, project_git,
                         refuse_foreign_patch_files, roll_dir, uncommitted)


def run(args: argparse.Namespace) -> int:
    """``roll --onto SOURCE | --continue | --abort``; returns the exit code (module docstring).  Raises RollError
    (exit 2) for what cannot start or go on, harness.upstream.forecast.ForecastError and
    harness.stages.building.source.SourceError for an unreadable SOURCE."""
    if args.abort:
        return abort(args.work_dir, print)
    if not args.continue_ and not args.onto:
        raise RollError("roll needs --onto SOURCE (or --continue / --abort of a roll in progress)")
    state_path = roll_dir(args.work_dir) / "state.json"
    in_progress = state_path.is_file()
    try:
        if args.continue_:
            return resume(State.load(args.work_dir), args, print)
        return start(args, print)
    except (KeyboardInterrupt, proc.Interrupted) as exc:
        code = proc.exit_code_for(exc)
        if state_path.is_file() and not (in_progress and not args.continue_):
            print(f"roll: interrupted; {ON_OR_BACK}", file=sys.stderr)
        else:
            print("roll: interrupted before the roll began; nothing was changed", file=sys.stderr)
        return code
    except HarnessError as exc:  # stopped by an error once the roll began: its error: line says how to go on or back
        if state_path.is_file() and not (in_progress and not args.continue_):
            exc.args = (f"{exc}\nroll: stopped; {ON_OR_BACK}",)
        raise


def resume(state: State, given: argparse.Namespace, say: Callable[[str], None]) -> int:
    """``roll --continue``: go on from the state's phase: the series (after a conflict resolved by hand, or an
    interrupt), the pin (written again from the committed checkout), or the main job (run again in a new run,
    the series not re-applied)."""
    args = state.args(given)
    phase = state.data.get("phase", PHASE_SERIES)
    if phase == PHASE_VERIFY:
        say(f"roll: the pin is committed ({state['commit'][:12]}); running the main job on it again")
        args.run_id = None  # a new run: the interrupted one stays as it was recorded
        from .roll_pin import verify_and_record
        return verify_and_record(state, args, say)
    if phase == PHASE_PIN:
        say("roll: the pin was being written when the roll stopped; writing it again")
        undo_pin(state, Path(state["checkout"]), args.patches_dir)
    return _rebase(state, args, say, resume=True)


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
    patches = read_series(args.patches_dir)
    refuse_foreign_patch_files(args.patches_dir, [p.name for p in patches])
    onto = parse_onto(args.onto)
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
        "stopped_at": None, "trying": None, "phase": PHASE_SERIES, "started": time.time(), "options": options,
        "upstream": upstream_facts(onto, old, new)})
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
        refuse_foreign_patch_files(args.patches_dir, state["patches"])  # left there while the roll stopped
        stopped = state["stopped"]
        trying = state.data.get("trying")
        if not stopped and trying:  # interrupted while a patch was tried: back to before it, then try it again
            _back_to(dev, trying["head"])
            say(f"roll: patch {trying['index']} {trying['name']} was being tried when the roll stopped; again")
        elif not stopped:
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
        state.data["trying"] = {"index": index, "name": patch.name, "head": head}
        state.save()
        o = try_patch(dev, patch, index, leave_conflict=True)
        record = {"index": index, "name": patch.name, "subject": patch.subject, "files": o.files,
                  "detail": o.detail, "conflicts": [asdict(c) for c in o.conflicts]}
        if o.status == PATCH_CONFLICT:
            state.data["stopped"] = record
            state.data["stopped_at"] = head
            state.data["trying"] = None
            state.save()
            _say_conflict(say, record, dev.cwd, len(names), state)
            path = write_stopped(state, here / "roll.md")
            say(f"roll: {path}")
            return EXIT_INCOMPLETE
        outcome = "dropped" if o.status == PATCH_ALREADY_UPSTREAM else o.status
        outcomes.append({**record, "outcome": outcome})
        state.data["trying"] = None
        state.save()
        say(f"roll: patch {index} {patch.name}: {OUTCOMES[outcome]} — {o.detail}")
    from .roll_pin import finish
    return finish(state, args, say)


def _say_conflict(say: Callable[[str], None], record: dict, dev: Path, total: int, state: State) -> None:
    """The console's account of a stop: the patch, then per conflict its file, hunk and the upstream lines met."""
    say(f"roll: patch {record['index']} of {total} {record['name']}: conflict — stopped")
    for c in (HunkConflict(**c) for c in record["conflicts"]):
        say(f"  {c.place()} {c.hunk}" + (f" ({c.reason})" if c.reason else ""))
        say("    the patch writes:")
        say("".join(f"      {line}\n" for line in c.wanted).rstrip("\n") or "      (nothing)")
        where = f"line {c.upstream_line} of the new base" if c.upstream_line else "not in the new base"
        say(f"    upstream has there ({where}):")
        say("".join(f"      {line}\n" for line in c.upstream).rstrip("\n") or "      (nothing)")
    say(f"roll: {dev} holds the conflict: resolve it, `git add` the files and `git am --continue` there "
        f"(or `git am --skip` to drop the patch), then `llama-fork-harness roll --continue`; "
        f"`llama-fork-harness roll --abort` returns to {state['previous']} with every file as it was")


def _quit_am(git: Git) -> None:
    """End a ``git am`` stopped in the dev tree (a conflict, or an interrupt while a patch was applied)."""
    if git.am_in_progress():
        git.run(["am", "--abort"], check=False)
        if git.am_in_progress():
            git.run(["am", "--quit"])


def _back_to(git: Git, head: str) -> None:
    """The dev tree at ``head``, as before the patch that was being tried: its ``git am`` ended, the tree clean."""
    _quit_am(git)
    git.run(["reset", "--quiet", "--hard", head])
    git.clean_tree()


def undo_pin(state: State, root: Path, patches_dir: Path) -> None:
    """Undo what writing the pin did outside the commits (the state's phases ``pin`` and ``verify``): the files it
    created that git does not track (a new mirror and its .sha256; the new file list where not yet committed),
    the patch files the export added to ``patches_dir`` (every entry not in the series as it was, which the roll
    copied), and the tracked files and index of the checkout back as the commit the roll started from has them
    (phase ``pin``: a pin commit made just before the stop is dropped too) or the pin's commit (phase ``verify``)."""
    for text in state.data.get("created", []):
        Path(text).unlink(missing_ok=True)
    kept = {p.name for p in (roll_dir(state.args(argparse.Namespace()).work_dir) / "old-patches").iterdir()}
    for entry in patches_dir.iterdir():
        if entry.name not in kept and entry.is_file():
            entry.unlink()
    project_git(root, ["reset", "--quiet", "--hard", state["head"] if state["phase"] == PHASE_PIN else "HEAD"])


def abort(work_dir: Path, say: Callable[[str], None]) -> int:
    """``roll --abort``, from any phase: the pin's files undone (:func:`undo_pin`), the checkout back on the branch
    the roll started from (the roll's branch deleted, every tracked file as that branch has it), the dev tree back
    at its commit (or removed when the roll made it), the roll's directory removed; returns 0.  The runs of the
    main job stay in the results directory, as recorded.  RollError when no roll is in progress."""
    state = State.load(work_dir)
    work = work_dir.resolve()
    root = Path(state["checkout"])
    if state.data.get("phase", PHASE_SERIES) != PHASE_SERIES:
        undo_pin(state, root, state.args(argparse.Namespace()).patches_dir)
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
        _quit_am(git)
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
    say(f"roll: aborted; {root} is on {state['previous']} as it was, the dev tree and the pin's files too")
    return 0


def main(argv: list[str]) -> int:
    """``roll`` with ``argv``, parsed as the command line parses it (harness.cli); returns :func:`run`'s code."""
    from ..cli import parse_command
    return run(parse_command("roll", argv))
