"""The end of a roll (harness.upstream.roll): the series exported, the new pin written and committed in one
commit on the roll's branch, then verified by the main job and triaged against the old pin.

The pin is every part of matrix.yaml that names or proves the commit (harness.matrix.pin): ``base.commit``,
``base.files`` (the file list written by harness.stages.building.source.write_pinned_files beside the old one, and
its sha256), and the sources that must yield the commit:

* ``archive``: a new trimmed mirror (harness.stages.building.source.export_mirror) named after the new commit
  beside the old one, or the archive the roll came from;
* ``pypi-sdist``: the sdist the roll came from (its version and sha256); an sdist that vendors the old
  commit cannot yield the new one and is removed;
* ``local`` and ``git``: kept (they yield whatever commit they hold).

What happened to each source is recorded (``pin`` in the roll's record, roll.md and the commit message).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import yaml

from ..common.errors import EXIT_PASSED
from ..common.fs import sha256_file
from ..common.statuses import RUN_ROLL
from ..matrix.config import CHECKOUT, Matrix, load_matrix
from ..matrix.pin import rewrite_yaml
from ..stages.building.patches import SERIES_FILE, export_series, series_digest
from ..stages.building.source import (GIT_IDENTITY, BaseTree, cache_dir, export_mirror, obtain_base, tree_state,
                                   unpacked_sdist, write_pinned_files)
from .forecast import OLD_VARIANT, obtain_onto, parse_onto, with_old_base
from .roll_state import (INTERRUPTED_MIN, ON_OR_BACK, OUTCOMES, PHASE_PIN, PHASE_VERIFY, RollError, State,
                         platforms_of, project_git, refuse_foreign_patch_files, roll_dir)

if TYPE_CHECKING:  # its type only: the roll's record is imported where it is made
    from .roll_record import RollRecord


def _renamed(text: str, old12: str, new12: str, default: str) -> str:
    """A path as matrix.yaml writes it, its commit prefix ``old12`` turned into ``new12``; without one, the
    file ``default`` in the same directory."""
    if old12 in text:
        return text.replace(old12, new12)
    head, sep, _ = text.rpartition("/")
    return f"{head}{sep}{default}"


def _resolved(matrix: Matrix, text: str) -> Path:
    """A path of matrix.yaml as harness.matrix.config resolves it (relative: against the harness's checkout)."""
    path = Path(text)
    return path if path.is_absolute() else (CHECKOUT / path)


def _checkout_relative(path: Path) -> str:
    """``path`` as matrix.yaml should write it: relative to the harness's checkout when inside it."""
    try:
        return path.resolve().relative_to(CHECKOUT).as_posix()
    except ValueError:
        return str(path.resolve())


def write_pin(matrix: Matrix, doc: dict, old: BaseTree, new: BaseTree, onto_spec: str,
              say: Callable[[str], None], keep: Callable[[Path], None] = lambda path: None,
              ) -> tuple[dict[tuple, str], list[tuple], list[str], list[Path], list[Path]]:
    """Write the files of the new pin (file list, mirror) and say what matrix.yaml must become.  ``keep`` is
    called with each file's path before it is written (the roll's state records it, for ``--abort``).

    Returns (scalars to replace by key path, list items to remove, one line per part of the pin for the
    record, files written, files to delete).  Raises harness.upstream.roll.RollError where a part cannot be
    derived (a file list needs the new commit's git objects)."""
    old12, new12 = old.commit[:12], new.commit[:12]
    values: dict[tuple, str] = {("base", "commit"): new.commit}
    remove: list[tuple] = []
    lines = [f"base.commit: {old.commit} -> {new.commit}"]
    written: list[Path] = []
    gone: list[Path] = []
    onto = parse_onto(onto_spec)
    files = doc["base"].get("files")
    if files:
        if new.git_rev != new.commit:
            raise RollError("the file list (base.files) is derived from the new commit's git objects; roll from a "
                            "git, local or pypi-sdist source")
        text = _renamed(files["path"], old12, new12, f"llama.cpp-{new12}.files")
        out = _resolved(matrix, text)
        keep(out)
        digest = write_pinned_files(new, out)
        written.append(out)
        if matrix.base_files and matrix.base_files.resolve() != out.resolve():
            gone.append(matrix.base_files)
        values[("base", "files", "path")] = text
        values[("base", "files", "sha256")] = digest
        lines.append(f"base.files: {text} (sha256 {digest}), written from the new commit's git objects")
    for i, src in enumerate(doc["base"]["sources"]):
        keys = ("base", "sources", i)
        kind = src["kind"]
        if kind in ("local", "git"):
            lines.append(f"source {i + 1} ({kind} {src.get('path') or src.get('url')}): kept")
        elif kind == "archive":
            if onto.source.kind == "archive":
                assert onto.source.path is not None  # an archive source has its path (harness.matrix.config)
                path = _checkout_relative(onto.source.path)
                values[(*keys, "path")] = path
                if onto.source.sha256:
                    digest = onto.source.sha256
                else:
                    assert onto.source.sha256_file is not None  # an archive without its digest has its sidecar
                    digest = onto.source.sha256_file.read_text().split()[0]
                if "sha256" in src:
                    values[(*keys, "sha256")] = digest
                else:
                    values[(*keys, "sha256_file")] = _checkout_relative(Path(str(onto.source.path) + ".sha256"))
                lines.append(f"source {i + 1} (archive): updated to {path}, the archive rolled onto (sha256 {digest})")
                continue
            text = _renamed(src["path"], old12, new12, f"llama.cpp-{new12}.tar.gz")
            out = _resolved(matrix, text)
            keep(out)
            keep(Path(str(out) + ".sha256"))
            started = time.monotonic()
            _, digest = export_mirror(new, out)
            written += [out, Path(str(out) + ".sha256")]
            values[(*keys, "path")] = text
            if "sha256" in src:
                values[(*keys, "sha256")] = digest
            if "sha256_file" in src:
                values[(*keys, "sha256_file")] = text + ".sha256"
            say(f"roll: wrote the mirror {out} ({time.monotonic() - started:.1f} s)")
            lines.append(f"source {i + 1} (archive): updated to {text} (sha256 {digest}), a new trimmed mirror of "
                         f"{new12} (serve it where the old one was served)")
        elif kind == "pypi-sdist":
            what = f"{src['package']}=={src['version']}"
            if onto.source.kind == "pypi-sdist" and onto.source.package == src["package"]:
                sdist, _ = unpacked_sdist(onto.source, cache_dir())
                digest = sha256_file(sdist)
                assert onto.source.version is not None  # a pypi-sdist source has its version
                values[(*keys, "version")] = onto.source.version
                values[(*keys, "sha256")] = digest
                lines.append(f"source {i + 1} (pypi-sdist): updated from {what} to {src['package']}=="
                             f"{onto.source.version} (sha256 {digest}), which vendors {new12}")
            else:
                remove.append(keys)
                lines.append(f"source {i + 1} (pypi-sdist {what}): removed: it vendors {old12}, not {new12}")
    return values, remove, lines, written, gone


def _commit(root: Path, paths: list[Path], message: str) -> str:
    """Stage exactly the files ``paths`` (written, or deleted where git tracks them; ignored ones and those outside
    ``root`` left out) in the checkout ``root`` and commit them; returns the commit id.  Without an identity in
    the person's git configuration (a CI runner) the harness's own commits it."""
    inside = []
    for p in paths:
        try:
            rel = str(p.resolve().relative_to(root.resolve()))
        except ValueError:
            continue
        if p.exists() or project_git(root, ["ls-files", "--", rel]).stdout.strip():
            inside.append(rel)
    tracked = [p for p in inside if project_git(root, ["check-ignore", "--quiet", p], check=False).returncode]
    project_git(root, ["add", "--all", "--", *tracked])
    identity: list[str] = []
    if not project_git(root, ["config", "user.email"], check=False).stdout.strip():
        identity = ["-c", f"user.name={GIT_IDENTITY[0]}", "-c", f"user.email={GIT_IDENTITY[1]}"]
    project_git(root, [*identity, "commit", "--quiet", "--no-verify", "-m", message])
    return project_git(root, ["rev-parse", "HEAD"]).stdout.strip()


def finish(state: State, args: argparse.Namespace, say: Callable[[str], None]) -> int:
    """Export the rebased series, write and commit the new pin (the state's phase ``pin``, each file written outside
    git kept in the state for ``--abort``), then verify it and write roll.md (:func:`verify_and_record`); returns
    the exit code of the verification (0 passed, 1 failed, 3 incomplete, 128+n interrupted)."""
    started = time.monotonic()
    work = args.work_dir.resolve()
    root = Path(state["checkout"])
    matrix = load_matrix(args.matrix)
    doc = yaml.safe_load(args.matrix.read_text(encoding="utf-8"))
    cache = cache_dir()
    old = obtain_base(matrix, cache)
    new = obtain_onto(matrix, parse_onto(state["onto"]), cache, say)
    dev = work / "dev" / "llama.cpp"
    refuse_foreign_patch_files(args.patches_dir, state["patches"])  # what appeared there while the roll stopped
    state.data.update(phase=PHASE_PIN, old_tree=str(old.path))
    state.data.setdefault("created", [])
    state.save()
    written = export_series(dev, new.git_rev, args.patches_dir)
    (work / "dev" / "tree.stamp").write_text(f"{new.git_rev} {series_digest(written)} {tree_state(dev)[0]}\n")

    def keep(path: Path) -> None:
        if not path.exists():
            state.data["created"].append(str(path.resolve()))
            state.save()
    values, remove, pin_lines, files, gone = write_pin(matrix, doc, old, new, state["onto"], say, keep)
    args.matrix.write_text(rewrite_yaml(args.matrix.read_text(encoding="utf-8"), values, remove), encoding="utf-8")
    for path in gone:
        path.unlink(missing_ok=True)
    outcomes = state["outcomes"]
    message = "\n".join([
        f"Roll upstream llama.cpp from {old.commit[:12]} to {new.commit[:12]}", "",
        f"`roll --onto {state['onto']}` moved the pin and the patch series to upstream {new.commit}.", "",
        *[f"- patch {o['index']} {o['name']}: {OUTCOMES[o['outcome']]}" for o in outcomes], "",
        *[f"- {line}" for line in pin_lines]]) + "\n"
    series = [args.patches_dir / SERIES_FILE, *(p.path for p in written),
              *(args.patches_dir / name for name in state["patches"])]  # the old ones: deleted or rewritten
    commit = _commit(root, [args.matrix, *series, *files, *gone], message)
    state.data.update(phase=PHASE_VERIFY, commit=commit, pin=pin_lines, new_patches=[p.name for p in written],
                      pin_seconds=round(time.monotonic() - started, 1))
    state.save()
    say(f"roll: committed the new pin on {state['branch']}: {commit[:12]}")
    for line in pin_lines:
        say(f"roll: {line}")
    return verify_and_record(state, args, say)


def verify_and_record(state: State, args: argparse.Namespace, say: Callable[[str], None]) -> int:
    """The state's phase ``verify``: the main job on the committed pin (:func:`verify`, or none with
    ``--no-verify``), triage and roll.md; then the roll's state is removed, the roll is done.  When the main job
    was interrupted the state stays (``roll --continue`` runs it again in a new run, ``roll --abort`` goes back)
    and 128+n is returned.  RollError when the old pin's base tree is gone from the download cache."""
    from .roll_record import RollRecord, write_record
    here = roll_dir(args.work_dir)
    old = BaseTree(Path(state["old_tree"]), state["old"]["commit"], state["old"]["git_rev"], state["old"]["source"])
    if not old.path.is_dir():
        raise RollError(f"the old pin's base tree {old.path} is gone from the download cache; `roll --abort` and "
                        "roll again")
    record = RollRecord(onto=state["onto"], old=dict(state["old"]), new=dict(state["new"]), branch=state["branch"],
                        commit=state["commit"], outcomes=state["outcomes"], pin=state["pin"], old_patches={},
                        started=state["started"], pin_seconds=state["pin_seconds"], **state["upstream"])
    for o in record.outcomes:
        path = here / "old-patches" / o["name"]
        record.old_patches[o["name"]] = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""
    record.new_patches = {name: (args.patches_dir / name).read_text(encoding="utf-8", errors="replace")
                          for name in state["new_patches"]}
    rc = EXIT_PASSED
    if getattr(args, "no_verify", False):
        from ..record.run import Run
        run = Run.open(args.results_dir, args.run_id, argv=sys.argv, kind=RUN_ROLL)
        try:
            run.write_summary()
            record.not_verified = "the main job was not run (--no-verify)"
            path = write_record(record, run.dir)
        finally:
            run.close()
    else:
        rc, path = verify(record, args, matrix_path=args.matrix, old=old, say=say)
        if path is None:  # the main job was interrupted: the roll goes on or goes back from here
            state.data.setdefault("interrupted_runs", []).append(record.run_id)
            state.save()
            say(f"roll: the main job on the new pin was interrupted (run {record.run_id}); {ON_OR_BACK}")
            return rc
    shutil.rmtree(here, ignore_errors=True)  # roll.md is written: the roll is done, nothing left to go back to
    say(f"roll: {path}")
    say(f"roll: {record.verdict_line()}")
    return rc


def verify(record: RollRecord, args: argparse.Namespace, *, matrix_path: Path, old: BaseTree,
           say: Callable[[str], None]) -> tuple[int, Path | None]:
    """The main job on the new pin with the ``old-base-vs-new-base`` groups (harness.upstream.forecast
    .with_old_base), then triage against the newest passed run of the old pin; writes roll.md into the run.
    Returns (the run's exit code: 0 passed, 1 failed, 3 incomplete, roll.md's path), or (128+n, None) when the
    main job was interrupted (no triage, no roll.md: the roll's state stays).  A signal after the main job, while
    triage runs or roll.md is written, raises harness.common.proc.Interrupted."""
    from ..args import split_names, stage_options
    from ..common import proc
    from ..pipeline import run_stages
    from ..record.run import Run
    from ..views.run_views import settle_killed, write_views
    from .roll_record import write_record
    matrix = load_matrix(matrix_path)  # the new pin, checked to agree with itself
    new_base = obtain_base(matrix, cache_dir())
    platforms = platforms_of(args, list(matrix.platforms))
    for name in platforms:
        matrix.platform(name)
    vmatrix, old_groups = with_old_base(matrix, platforms)
    groups = split_names(args.group)
    if groups:
        groups += [g for g, src in old_groups.items() if src in groups]
    opts = stage_options(args, platforms=platforms, groups=groups)
    started = time.monotonic()
    with proc.handle_signals():
        run = Run.open(args.results_dir, args.run_id, argv=sys.argv, kind=RUN_ROLL)
        try:
            try:
                settle_killed(run.root, run.dir, say)
                rc = run_stages(vmatrix, run, opts, ["build", "test", "compare-outputs"],
                                bases={"base": new_base, OLD_VARIANT: old})
            finally:
                write_views(run.dir)
            record.run_id = run.id
            if rc >= INTERRUPTED_MIN:
                return rc, None
            record.verify_seconds = round(time.monotonic() - started, 1)
            record.old_groups = dict(old_groups)
            record.platforms = platforms
            record.matrix_platforms = list(matrix.platforms)
            record.triage_against_old_pin(args.results_dir, run.dir, matrix)
            path = write_record(record, run.dir)
        finally:
            run.close()
    return rc, path
