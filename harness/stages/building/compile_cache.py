"""Reusing a passed compile step whose inputs are the same (docs/cache.md).

The compile step (harness.stages.building.cuda_compile) proves that a CUDA platform's code compiles and links
where nothing can run it.  Its outcome is a function of the source tree, the options, the plan it
was given (the base compiles the fork's units) and the tools, so a passed result is reused when all
of these are what they were:

* the source tree: git's tree id of ``HEAD`` (content-addressed: any byte of any file changes it),
  and no uncommitted change (``git status --porcelain`` empty; otherwise the step runs);
* the CMake options, the changed-file list, the link targets and the fork's plan (for the base),
  with the tree, build and work directory paths replaced by placeholders;
* the toolkit (its directory, named by the digest of the wheel versions, and nvcc's version), the
  host compiler (``c++ --version``), CMake and Ninja (``--version``);
* the harness code of the step (cuda_compile.py, unity.py, unity.cmake, this module), and the engine's source
  with the GPU kind's probe header (harness.stages.building.engine_target.engine_source_digest), the engine
  being one of the targets it links; the harness checkout's path in the options replaced by a placeholder.

A reused step writes the logs and ``compile.json`` of the run it came from into this run's
``compile-<variant>/`` and says ``reused from run <id>``.  Only passed steps are stored.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ...common.fs import sha256_files
from ...record.cache import ResultCache, abstract_paths, identity_key
from ...record.layout import COMPILE_FILES
from .cuda_compile import CompileResult, Plan
from .source import git
from ...common.statuses import STEP_PASSED

#: The entry kind of a compile step in the store.
KIND = "compile"

#: The harness package, whose files the options name (the engine's inject.cmake, a kind's probe header).
HARNESS_DIR = Path(__file__).resolve().parents[2]

#: The harness files whose code decides what the step does.
HARNESS_FILES = ("cuda_compile.py", "unity.py", "unity.cmake", "compile_cache.py")


def _version(argv: Sequence[str]) -> str:
    """What ``argv`` (a tool's ``--version``) prints, or why it could not run."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unavailable: {exc}"
    return (done.stdout + done.stderr).strip()


def tree_id(tree: Path) -> str | None:
    """git's tree id of ``HEAD`` in ``tree``, or None when the tree has uncommitted changes or is no git tree."""
    try:
        status = git(["status", "--porcelain", "--untracked-files=all"], tree, check=False)
        if status.returncode != 0 or status.stdout.strip():
            return None
        head = git(["rev-parse", "HEAD^{tree}"], tree, check=False)
    except OSError:
        return None
    return head.stdout.strip() if head.returncode == 0 else None


def _plan_used(like: Plan | None) -> dict[str, Any] | None:
    """The parts of the fork's plan that the base's step uses (harness.stages.building.cuda_compile.plan): not
    ``scanned``, a count that depends on the state of the fork's ninja log."""
    return {k: v for k, v in asdict(like).items() if k != "scanned"} if like else None


def step_identity(tree: Path, build_dir: Path, work: Path, options: Mapping[str, str], changed: Mapping[str, str],
                  targets: Sequence[str], like: Plan | None, cmake: str, ninja: str, nvcc: str,
                  env: Mapping[str, str], engine: str = "") -> dict[str, Any] | None:
    """The identity of one compile step (see the module docstring), None when the tree is not clean.  ``engine``:
    the digest of the engine's source and probe header (engine_target.engine_source_digest)."""
    tid = tree_id(tree)
    if tid is None:
        return None
    here = Path(__file__).resolve().parent
    code = sha256_files(here / n for n in HARNESS_FILES)
    paths = {str(tree): "<tree>", str(build_dir): "<build>", str(work): "<work>", str(HARNESS_DIR): "<harness>"}
    return {"tree": tid, "options": abstract_paths(dict(options), paths), "changed": dict(changed),
            "targets": list(targets), "like": _plan_used(like), "env": abstract_paths(dict(env), paths),
            "tools": {"cmake": _version([cmake, "--version"]), "ninja": _version([ninja, "--version"]),
                      "nvcc": _version([nvcc, "--version"]), "c++": _version(["c++", "--version"]),
                      "cc": _version(["cc", "--version"])},
            "harness": code, "engine": engine}


def compile_reusing(cache: ResultCache | None, run_id: str, identity: dict[str, Any] | None,
                    run: Callable[[], CompileResult], logs_dir: Path) -> tuple[CompileResult, str]:
    """The step's result: from ``cache`` when ``identity`` is stored (its logs written into ``logs_dir``),
    else ``run()`` (stored when it passed).  Returns the result and the run id it was reused from ("")."""
    key = identity_key(identity) if identity is not None else None
    if cache is not None and key is not None:
        hit = cache.get(KIND, key)
        if hit is not None:
            try:
                meta = hit.meta
                plan = Plan(**meta["plan"])
                logs_dir.mkdir(parents=True, exist_ok=True)
                for name, data in hit.files.items():
                    (logs_dir / name).write_bytes(data)
                result = CompileResult(STEP_PASSED, 0.0, plan, list(meta["linked"]), dict(meta["not_linked"]),
                                       f"reused from run {hit.run_id}: {meta['detail']}",
                                       {k: logs_dir / v for k, v in meta["logs"].items()})
                return result, hit.run_id
            except (KeyError, TypeError, OSError):
                pass
    result = run()
    if cache is not None and key is not None and result.status == STEP_PASSED and result.plan is not None:
        files = {p.name: p.read_bytes() for p in sorted(logs_dir.iterdir())  # what compile_tree wrote
                 if p.is_file() and (p.name.startswith(("configure", "build")) or p.name == COMPILE_FILES["record"])}
        meta = {"plan": asdict(result.plan), "linked": result.linked, "not_linked": result.not_linked,
                "detail": result.detail, "seconds": result.seconds,
                "logs": {k: v.name for k, v in result.logs.items()}}
        try:
            cache.put(KIND, key, run_id, identity or {}, meta, files)
        except OSError:
            pass
    return result, ""

