"""What the commands of a roll share (harness.upstream.roll, roll_pin, roll_record): the state of a roll in
progress (``<work-dir>/roll/state.json``), its error, the outcomes' names and git in the person's checkout."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path
from typing import Any

from ..args import split_names
from ..common.errors import InputError
from ..stages.building.patches import SERIES_FILE
from ..common.statuses import PATCH_3WAY, PATCH_CLEAN
from ..common.json_value import JSON

#: The outcome of a patch dropped by hand in a roll (git am --skip).
SKIPPED_BY_HAND = "skipped"
#: The outcome of a patch in a roll, for people (roll.md, the console, the commit message).
OUTCOMES = {PATCH_CLEAN: PATCH_CLEAN, PATCH_3WAY: PATCH_3WAY, "dropped": "dropped (already upstream)",
            "resolved": "resolved by hand", SKIPPED_BY_HAND: "dropped by hand (git am --skip)"}
#: Prefix of the branch a roll makes in the checkout; the new commit's first 12 hex digits follow.
BRANCH_PREFIX = "roll/"
#: The phases of a roll in its state (``phase``): the series rebased patch by patch, the pin written and committed,
#: the main job and roll.md.  Each is undone by ``--abort`` and gone on with by ``--continue``.
PHASE_SERIES, PHASE_PIN, PHASE_VERIFY = "series", "pin", "verify"
#: The exit codes of a run stopped by a signal start here (128 + the signal's number: 130 SIGINT, 143 SIGTERM).
INTERRUPTED_MIN = 128
#: What every stop of a roll says: the two commands that go on or go back.
ON_OR_BACK = ("`llama-fork-harness roll --continue` goes on from here; `llama-fork-harness roll --abort` goes back "
              "to where the roll started, every file as it was")
#: Options of the command that are not the roll's state (what --continue and --abort take anew).
ACTIONS = ("continue_", "abort", "handler", "command")


class RollError(InputError):
    """A roll that cannot start or go on: a dirty checkout, no roll in progress, git refusing (exit code 2)."""


def roll_dir(work_dir: Path) -> Path:
    """``<work-dir>/roll``: the state of the roll in progress, the series as it was, the upstream repository."""
    return work_dir.resolve() / "roll"


def project_git(root: Path, args: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``git args`` in the checkout ``root`` with the person's own configuration (their identity commits the
    roll); raises RollError with git's message when ``check`` and it fails."""
    proc = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
    if check and proc.returncode:
        raise RollError(f"git {' '.join(args)} failed in {root}: {proc.stderr.strip()}")
    return proc


def checkout_root(matrix: Path) -> Path:
    """The git work tree holding ``matrix`` (the checkout the roll commits to); RollError when there is none."""
    proc = project_git(matrix.resolve().parent, ["rev-parse", "--show-toplevel"], check=False)
    if proc.returncode:
        raise RollError(f"{matrix} is not in a git checkout; a roll commits the new pin on a branch")
    return Path(proc.stdout.strip())


def uncommitted(root: Path) -> list[str]:
    """The tracked files of ``root`` with changes not committed (staged or not), as ``git status`` names them."""
    out = project_git(root, ["status", "--porcelain", "--untracked-files=no"]).stdout
    return [line[3:] for line in out.splitlines() if line.strip()]


def foreign_patch_files(patches_dir: Path, names: list[str]) -> list[str]:
    """The entries of ``patches_dir`` that are neither ``series`` nor one of the patch files ``names``, sorted
    (a directory with a trailing ``/``): what ``nox -s patches -- export`` does not write, whatever its
    extension (a ``.diff``, an ``.orig`` left by patch(1), an editor's backup)."""
    keep = {SERIES_FILE, *names}
    return sorted(f"{p.name}/" if p.is_dir() else p.name for p in patches_dir.iterdir() if p.name not in keep)


def refuse_foreign_patch_files(patches_dir: Path, names: list[str]) -> None:
    """RollError (exit 2) naming every :func:`foreign_patch_files` entry: the roll commits ``patches/`` as the
    export writes it and nothing else."""
    foreign = foreign_patch_files(patches_dir, names)
    if foreign:
        raise RollError(f"{patches_dir} holds {', '.join(foreign)}, not part of the series: the roll commits "
                        f"{patches_dir.name}/ exactly as `nox -s patches -- export` writes it (series and the "
                        "patches it lists); move or delete them first")


# --------------------------------------------------------------------------- state


def option_json(value: JSON) -> JSON:
    """An option's value as state.json holds it (a path as {"__path__": text})."""
    return {"__path__": str(value)} if isinstance(value, Path) else value


def option_value(value: JSON) -> JSON:
    """An option's value read back from state.json (:func:`option_json`)."""
    return Path(value["__path__"]) if isinstance(value, dict) and "__path__" in value else value


class State:
    """The roll in progress, as ``<work-dir>/roll/state.json`` holds it: where it goes (``onto``, ``old``,
    ``new``), where it came from (``previous`` branch, ``head``), the dev tree as it was (``dev``), the
    options it was started with (``options``), the patches done (``outcomes``) and where it stopped
    (``stopped``: the patch's outcome with its conflicts; ``stopped_at``: HEAD of the dev tree then)."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = path
        self.data = data

    @classmethod
    def load(cls, work_dir: Path) -> "State":
        """The roll in progress under ``work_dir``; RollError when there is none."""
        path = roll_dir(work_dir) / "state.json"
        if not path.is_file():
            raise RollError(f"no roll in progress ({path} does not exist); start one with roll --onto SOURCE")
        return cls(path, json.loads(path.read_text(encoding="utf-8")))

    def save(self) -> None:
        """Write the state (atomically: a rename)."""
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2) + "\n", encoding="utf-8")
        tmp.replace(self.path)

    def __getitem__(self, key: str) -> JSON:
        return self.data[key]

    def args(self, given: argparse.Namespace) -> argparse.Namespace:
        """The options the roll was started with, for ``--continue``."""
        saved = {k: option_value(v) for k, v in self.data["options"].items()}
        return argparse.Namespace(**{**saved, **{k: getattr(given, k) for k in ACTIONS if hasattr(given, k)}})


# --------------------------------------------------------------------------- the command


def platforms_of(args: argparse.Namespace, names: list[str]) -> list[str]:
    """The platforms to verify on: ``--platform``, else the CPU and CUDA platforms of Linux the matrix has
    (as the forecast)."""
    return split_names(args.platform) or [p for p in ("linux-x86_64-cpu", "linux-x86_64-cuda") if p in names]

