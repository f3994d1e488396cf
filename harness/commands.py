"""The commands harness.cli declares that belong to no one module: the stages, ``patches``, ``source`` and
``models``."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
from typing import Iterator

from .args import in_checkout, stage_options
from .common import proc
from .common.errors import InputError
from .matrix.config import SelectionError, load_matrix


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """For the block, what this process and its children write to standard output goes to standard error (file
    descriptor 1 and ``sys.stdout`` both), so that the output of ``--json`` is the JSON alone."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 1)
        os.close(saved)


def stage_run_kind(args: argparse.Namespace) -> str:
    """The kind a stage command's run records (harness.common.statuses.RUN_KINDS): ``args.run_kind`` where the
    caller set one (a bisect point sets ``RUN_BISECT``); else ``RUN_SERIES`` when ``--patches-dir`` is another
    directory than the ``patches/`` beside ``--matrix`` (a planted fault, an experiment), ``RUN_FORK`` when it
    is that one: the fork on its own series."""
    from .common.statuses import RUN_FORK, RUN_SERIES
    if getattr(args, "run_kind", None):
        return str(args.run_kind)
    own = args.matrix.absolute().parent / "patches"
    return RUN_FORK if args.patches_dir.resolve() == own.resolve() else RUN_SERIES


def run_stages(args: argparse.Namespace) -> int:
    """``build test compare-outputs``: run ``args.stages``; the exit code of the run's verdict
    (harness.common.errors)."""
    from .views.run_views import annotate_failures, settle_killed, verdict_json, verdict_line, write_views
    from .cli import STAGES
    from .common.console import Console
    from .pipeline import run_stages as run_pipeline
    from .record.run import Run
    matrix = load_matrix(args.matrix)
    opts = stage_options(args)
    for name in opts.platforms:
        matrix.platform(name)  # unknown names fail before anything runs
    for name in opts.models:
        if name not in matrix.models:
            raise SelectionError(f"unknown model {name!r}; {matrix.path} defines: {', '.join(sorted(matrix.models))}")
    for name in opts.groups:
        if name not in matrix.groups:
            raise SelectionError(f"unknown group {name!r}; {matrix.path} defines: {', '.join(sorted(matrix.groups))}")
    # what the inputs alone prove cannot run, refused before anything starts; in every stage command, since
    # `nox -s build test compare-outputs` runs one per session with the same arguments
    from .common.fs import existing_dir, room_problem
    from .stages.building.preflight import check_inputs
    from .stages.building.source import cache_dir, storage_places
    check_inputs(matrix, opts.platforms, opts.groups, opts.models, args.n_predict, cache_dir(),
                 compare="compare-outputs" in args.stages)
    from .stages.building.patches import read_series
    read_series(args.patches_dir)  # a malformed patch is bad input, as `patches check` says; a stale one the build's
    for what, path in storage_places(args.work_dir).items():  # a full or read-only one: refused before any work
        problem = room_problem(existing_dir(path, what), what)
        if problem is not None:
            raise problem
    with proc.handle_signals():
        run = Run.open(args.results_dir, args.run_id, argv=sys.argv, kind=stage_run_kind(args))
        try:
            # with --json, standard output holds the JSON alone: the console's lines go to standard error
            with stdout_to_stderr() if getattr(args, "json", False) else contextlib.nullcontext():
                settle_killed(run.root, run.dir, lambda line: print(line, flush=True))
                return run_pipeline(matrix, run, opts, args.stages)
        finally:
            try:  # after an interrupt or an error too: the views of what was recorded
                report = write_views(run.dir)
                if getattr(args, "json", False):
                    print(json.dumps(verdict_json(run, report, STAGES), indent=2), flush=True)
                else:
                    annotate_failures(run, Console())
                    print(verdict_line(run, report, STAGES), flush=True)
            finally:
                run.close()


def patches(args: argparse.Namespace) -> int:
    """``patches apply|export|check``: 0, or 1 when ``check`` finds patches/ differing from what export
    writes.  Raises InputError where the dev tree holds work that apply would lose or export cannot write."""
    from .stages.building.patches import check_series, export_series, prepare_series_tree, read_series, series_digest
    from .stages.building.source import obtain_base, scratch_tree, tree_state, unexported_work
    matrix = load_matrix(args.matrix)
    base = obtain_base(matrix)
    work = args.work_dir.resolve()
    if args.action == "apply":
        series = read_series(args.patches_dir)
        pending = unexported_work(work, "dev")
        if pending and not args.force:
            raise InputError(f"{pending}; export it first (nox -s patches -- export) or pass --force")
        (work / "dev" / "tree.stamp").unlink(missing_ok=True)
        tree = prepare_series_tree(base, work, "dev", series)
        print(f"applied {len(series)} patches onto {base.commit[:12]} in {tree}")
        print("edit and commit there (git commit, git rebase -i), then run: nox -s patches -- export")
        return 0
    if args.action == "export":
        tree = work / "dev" / "llama.cpp"
        if not tree.exists():
            raise InputError(f"no work tree at {tree}; run `nox -s patches -- apply` first")
        if tree_state(tree)[1]:
            raise InputError(f"{tree} has uncommitted changes; commit them (export writes commits only)")
        written = export_series(tree, base.git_rev, args.patches_dir)
        # the dev tree now matches patches/: a later apply may replace it without losing anything
        (work / "dev" / "tree.stamp").write_text(f"{base.git_rev} {series_digest(written)} {tree_state(tree)[0]}\n")
        for p in written:
            print(f"exported {p.name}  sha256 {p.sha256[:12]}")
        return 0
    scratch = scratch_tree(base)
    try:
        problems = check_series(scratch, base.git_rev, args.patches_dir)
    finally:
        shutil.rmtree(scratch.parent, ignore_errors=True)
    if problems:
        print("patches/ is not what export would write:")
        for problem in problems:
            print("  " + problem.replace("\n", "\n  "))
        return 1
    print(f"patches/ is up to date ({len(read_series(args.patches_dir))} patches)")
    return 0


def source(args: argparse.Namespace) -> int:
    """``source fetch|export-mirror|files``: obtain the base and write what ``action`` asks for (export-mirror: the
    mirror and, unless ``--no-data``, the data archive of upstream's suite beside it); returns 0."""
    from .stages.building.source import export_data, export_mirror, obtain_base, write_pinned_files
    matrix = load_matrix(args.matrix)
    log: list[str] = []
    base = obtain_base(matrix, log=log)
    for line in log:
        print(line)
    print(f"base {base.commit} at {base.path} (from {base.source})")
    if args.action == "export-mirror":
        out = args.out or in_checkout("mirror") / f"llama.cpp-{base.commit[:12]}.tar.gz"
        path, digest = export_mirror(base, out)
        print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB), sha256 {digest}")
        if not args.no_data:
            data, digest = export_data(base, path)
            print(f"wrote {data} ({data.stat().st_size / 2**20:.1f} MiB, upstream's suite data), sha256 {digest}")
    if args.action == "files":
        out = args.out or in_checkout("upstream-files") / f"llama.cpp-{base.commit[:12]}.files"
        digest = write_pinned_files(base, out)
        print(f"wrote {out}; pin it in {args.matrix} as base.files: {{path: {out}, sha256: {digest}}}")
    return 0


def models(args: argparse.Namespace) -> int:
    """``models [NAME ...]``: assemble, generate or derive models and print their paths; 0, 1 when one cannot
    be made, 2 for an unknown name.

    A derived (``quantized``) model takes llama-quantize from a finished base build of the host's CPU
    platform under ``--work-dir`` (harness.stages.building.quantize_tool.built_tool); without one its line says
    which build to make.  This command builds nothing."""
    from .matrix.model_sources.registry import ModelStore
    from .stages.building.quantize_tool import built_tool
    from .stages.building.source import cache_dir, obtain_base
    matrix = load_matrix(args.matrix)
    cache = cache_dir()
    store = ModelStore(matrix.models, cache, lambda: obtain_base(matrix, cache).path, matrix.path,
                       lambda: built_tool(matrix, args.work_dir))
    rc = 0
    for name in args.names or list(matrix.models):
        if name not in matrix.models:
            print(f"error: unknown model {name!r} (known: {', '.join(sorted(matrix.models))})")
            rc = 2
            continue
        try:
            print(f"{name}: {store.path(name)}")
        except Exception as exc:
            print(f"{name}: error: {exc}")
            rc = 1
    return rc
