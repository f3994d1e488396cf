"""What the commands of a roll share (harness.analysis.roll, roll_pin, roll_record): the state of a roll in
progress (``<work-dir>/roll/state.json``), its error, the outcomes' names and git in the person's checkout."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path
from typing import Any

from ..args import split_names
from ..common.errors import InputError
from ..common.statuses import PATCH_3WAY, PATCH_CLEAN

#: The outcome of a patch dropped by hand in a roll (git am --skip).
SKIPPED_BY_HAND = "skipped"
#: The outcome of a patch in a roll, for people (roll.md, the console, the commit message).
OUTCOMES = {PATCH_CLEAN: PATCH_CLEAN, PATCH_3WAY: PATCH_3WAY, "dropped": "dropped (already upstream)",
            "resolved": "resolved by hand", SKIPPED_BY_HAND: "dropped by hand (git am --skip)"}
#: Prefix of the branch a roll makes in the checkout; the new commit's first 12 hex digits follow.
BRANCH_PREFIX = "roll/"
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


# --------------------------------------------------------------------------- state


def option_json(value: Any) -> Any:
    """An option's value as state.json holds it (a path as {"__path__": text})."""
    return {"__path__": str(value)} if isinstance(value, Path) else value


def option_value(value: Any) -> Any:
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

    def __getitem__(self, key: str) -> Any:
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

