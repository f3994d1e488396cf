"""Command line: ``python -m harness STAGE [STAGE ...] [options]`` and the tool commands.

Stages: ``build``, ``test``, ``compare-outputs`` (any of them, in that order).
Tools: ``patches apply|export|check``, ``source fetch|export-mirror``,
``models``, ``ci-matrix``, ``check-windows``, ``triage``, ``bisect``, ``forecast``, ``report``, ``bench``,
``bench-compile``, ``bench-loop``, ``bench-cold``.
The nox sessions call exactly these commands and pass ``session.posargs`` through.
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import sys
from pathlib import Path
from typing import Sequence

from .common import proc
from .args import add_common, parse_defines, positive, split_names
from .matrix.config import SelectionError, load_matrix
from .common.errors import EXIT_BAD_INPUT, HarnessError, InputError
from .common.fs import describe, is_environment_error
from .stages.tests.native_tests import SANITIZERS

STAGES = ("build", "test", "compare-outputs")


def _bench_repeats(text: str) -> int:
    """An argparse type: timed rounds of the speed stage, an integer >= 5 (the matrix schema's minimum:
    fewer samples give the rank test no power; harness/common/statistics.py)."""
    value = positive(text)
    if value < 5:
        raise argparse.ArgumentTypeError(f"{text}: the speed stage needs at least 5 rounds")
    return value


def _bench_warmup(text: str) -> int:
    """An argparse type: untimed rounds of the speed stage before the timed ones, an integer from 0 to 20
    (the matrix schema's range for ``warmup``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text}: not a whole number of rounds") from None
    if not 0 <= value <= 20:
        raise argparse.ArgumentTypeError(f"{text}: the speed stage's warm-up rounds are 0 to 20")
    return value


def _stage_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m harness build|test|compare-outputs ...",
                                 description="Build the fork, run its native tests and greedy comparisons.")
    add_common(ap)
    ap.add_argument("--platform", action="append", default=[],
                    help="platform from matrix.yaml (repeatable or comma separated; default: all, "
                         "those this machine cannot run reported as skipped)")
    ap.add_argument("--results-dir", type=Path, default=Path("results"))
    ap.add_argument("--run-id", default=None, help="continue this run (default: $HARNESS_RUN_ID or a new run)")
    ap.add_argument("--cuda-arch", default=None, help="CMAKE_CUDA_ARCHITECTURES (default: from nvidia-smi)")
    ap.add_argument("-j", "--jobs", type=positive, default=None,
                    help="jobs at once, every build and compile step of the run together "
                         "(default: the cores this process may use; docs/platforms.md)")
    ap.add_argument("--sanitize", choices=SANITIZERS, default=None,
                    help="also run the native tests under compute-sanitizer with this tool")
    ap.add_argument("--model", action="append", default=[], help="only these models (repeatable)")
    ap.add_argument("--group", action="append", default=[], help="only these comparison groups (repeatable)")
    ap.add_argument("--n-predict", type=positive, default=None, help="tokens per generation (default: matrix)")
    ap.add_argument("--repeats", type=positive, default=None, help="runs per configuration (default: matrix)")
    ap.add_argument("--lanes", type=positive, default=None,
                    help="generations at once on a CPU platform, each process with cores/lanes threads "
                         "(default: the machine's cores, at most 8; 1: one at a time with llama.cpp's default "
                         "threads; docs/cache.md)")
    ap.add_argument("--no-bench", dest="bench", action="store_false",
                    help="compare-outputs without its speed stage (the groups' speed rules; docs/speed.md)")
    ap.add_argument("--bench-repeats", type=_bench_repeats, default=None,
                    help="timed rounds per speed rule (default: matrix; at least 5)")
    ap.add_argument("--bench-warmup", type=_bench_warmup, default=None, metavar="N",
                    help="untimed rounds before a speed rule's timed ones (default: matrix; 0-20)")
    ap.add_argument("-D", dest="defines", action="append", default=[], metavar="VAR=VALUE",
                    help="extra CMake cache option passed through to every configure")
    ap.add_argument("--no-cache", action="store_true",
                    help="regenerate every generation, rerun every native test and measure every speed pair "
                         "instead of reusing results "
                         "whose inputs are byte-identical (docs/cache.md); fresh results still refresh the cache")
    return ap


def run_stages_cmd(stages: list[str], argv: Sequence[str]) -> int:
    """``python -m harness build test ...``: run the stages; the exit code of the run's verdict (harness.common.errors)."""
    from .pipeline import Options, run_stages
    from .record.results import Run
    args = _stage_parser().parse_args(argv)
    matrix = load_matrix(args.matrix)
    defines = parse_defines(args.defines)
    platforms = split_names(args.platform, "--platform")
    for name in platforms:
        matrix.platform(name)  # unknown names fail before anything runs
    for name in split_names(args.model, "--model"):
        if name not in matrix.models:
            raise SelectionError(f"unknown model {name!r}; {matrix.path} defines: {', '.join(sorted(matrix.models))}")
    for name in split_names(args.group, "--group"):
        if name not in matrix.groups:
            raise SelectionError(f"unknown group {name!r}; {matrix.path} defines: {', '.join(sorted(matrix.groups))}")
    opts = Options(platforms=platforms, cmake_defines=defines, cuda_arch=args.cuda_arch, jobs=args.jobs,
                   sanitize=args.sanitize, models=split_names(args.model, "--model"),
                   groups=split_names(args.group, "--group"),
                   n_predict=args.n_predict, repeats=args.repeats, work_dir=args.work_dir,
                   patches_dir=args.patches_dir, bench=args.bench, bench_repeats=args.bench_repeats,
                   bench_warmup=args.bench_warmup,
                   no_cache=args.no_cache, lanes=args.lanes)
    order = [s for s in STAGES if s in stages]
    # what the inputs alone prove cannot run, refused before anything starts; in every stage command, since
    # `nox -s build test compare-outputs` runs one per session with the same arguments
    from .stages.build.preflight import check_inputs
    from .stages.build.source import cache_dir
    check_inputs(matrix, platforms, opts.groups, opts.models, args.n_predict, cache_dir(),
                 compare="compare-outputs" in order)
    from .stages.build.patches import read_series
    read_series(args.patches_dir)  # a malformed patch is bad input, as `patches check` says; a stale one the build's
    with proc.handle_signals():
        run = Run.open(args.results_dir, args.run_id, argv=sys.argv)
        try:
            return run_stages(matrix, run, opts, order)
        finally:
            run.close()


def patches_cmd(argv: Sequence[str]) -> int:
    """``python -m harness patches apply|export|check``."""
    from .stages.build.patches import check_series, export_series, prepare_series_tree, read_series, series_digest
    from .stages.build.source import obtain_base, scratch_tree, tree_state, unexported_work
    ap = argparse.ArgumentParser(prog="python -m harness patches",
                                 description="apply: the series onto the base in .harness/dev/llama.cpp (the tree "
                                             "you edit; builds use their own tree); export: its commits back into "
                                             "patches/; check: fail when patches/ differs from what export writes")
    ap.add_argument("action", choices=("apply", "export", "check"))
    ap.add_argument("--force", action="store_true", help="apply even if the dev tree holds unexported work")
    add_common(ap)
    args = ap.parse_args(argv)
    matrix = load_matrix(args.matrix)
    base = obtain_base(matrix)
    work = args.work_dir.resolve()
    if args.action == "apply":
        patches = read_series(args.patches_dir)
        pending = unexported_work(work, "dev")
        if pending and not args.force:
            raise InputError(f"{pending}; export it first (nox -s patches -- export) or pass --force")
        (work / "dev" / "tree.stamp").unlink(missing_ok=True)
        tree = prepare_series_tree(base, work, "dev", patches)
        print(f"applied {len(patches)} patches onto {base.commit[:12]} in {tree}")
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
        for p in problems:
            print("  " + p.replace("\n", "\n  "))
        return 1
    print(f"patches/ is up to date ({len(read_series(args.patches_dir))} patches)")
    return 0


def source_cmd(argv: Sequence[str]) -> int:
    """``python -m harness source fetch|export-mirror|files [--out PATH]``."""
    from .stages.build.source import export_mirror, obtain_base, write_pinned_files
    ap = argparse.ArgumentParser(prog="python -m harness source",
                                 description="fetch: obtain the base; export-mirror: write the trimmed mirror "
                                             "archive; files: write the pinned commit's file list (base.files)")
    ap.add_argument("action", choices=("fetch", "export-mirror", "files"))
    ap.add_argument("--out", type=Path, default=None,
                    help="mirror archive path (default: mirror/llama.cpp-<commit12>.tar.gz) or file list path "
                         "(default: upstream-files/llama.cpp-<commit12>.files)")
    add_common(ap)
    args = ap.parse_args(argv)
    matrix = load_matrix(args.matrix)
    log: list[str] = []
    base = obtain_base(matrix, log=log)
    for line in log:
        print(line)
    print(f"base {base.commit} at {base.path} (from {base.source})")
    if args.action == "export-mirror":
        out = args.out or Path("mirror") / f"llama.cpp-{base.commit[:12]}.tar.gz"
        path, digest = export_mirror(base, out)
        print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB), sha256 {digest}")
    if args.action == "files":
        out = args.out or Path("upstream-files") / f"llama.cpp-{base.commit[:12]}.files"
        digest = write_pinned_files(base, out)
        print(f"wrote {out}; pin it in {args.matrix} as base.files: {{path: {out}, sha256: {digest}}}")
    return 0


def models_cmd(argv: Sequence[str]) -> int:
    """``python -m harness models [NAME ...]``: assemble, generate or derive models and print their paths.

    A derived (``quantized``) model takes llama-quantize from a finished base build of the host's CPU
    platform under ``--work-dir`` (harness.stages.build.quantize_tool.built_tool); without one its line says
    which build to make.  This command builds nothing."""
    from .matrix.models import ModelStore
    from .stages.build.quantize_tool import built_tool
    from .stages.build.source import cache_dir, obtain_base
    ap = argparse.ArgumentParser(prog="python -m harness models")
    ap.add_argument("names", nargs="*")
    add_common(ap)
    args = ap.parse_args(argv)
    matrix = load_matrix(args.matrix)
    cache = cache_dir()
    models = ModelStore(matrix.models, cache, lambda: obtain_base(matrix, cache).path, matrix.path,
                        lambda: built_tool(matrix, args.work_dir))
    rc = 0
    for name in args.names or list(matrix.models):
        if name not in matrix.models:
            print(f"error: unknown model {name!r} (known: {', '.join(sorted(matrix.models))})")
            rc = 2
            continue
        try:
            print(f"{name}: {models.path(name)}")
        except Exception as exc:
            print(f"{name}: error: {exc}")
            rc = 1
    return rc


#: Commands beside the stages: the module under harness/ that holds each and its entry point.
TOOL_COMMANDS = {"ci-matrix": ("tools.ci_matrix", "main"), "check-windows": ("tools.windows_check", "main"),
                 "bench": ("tools.bench", "main"), "bench-compile": ("tools.compile_bench", "main"),
                 "bench-loop": ("tools.bench_loop", "main"), "bench-cold": ("tools.bench_cold", "main"),
                 "triage": ("analysis.triage", "main"), "bisect": ("analysis.bisect", "main"),
                 "forecast": ("analysis.forecast", "main"), "report": ("analysis.report", "report_main")}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code (see harness.common.errors).

    This is the one place expected errors (harness.common.errors.HarnessError, a missing file,
    Ctrl-C) become ``error: <message>`` on stderr and their exit code, without a traceback.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    stages = []
    while argv and argv[0] in STAGES:
        stages.append(argv.pop(0))
    try:
        if stages:
            return run_stages_cmd(stages, argv)
        if not argv or argv[0] in ("-h", "--help"):
            print(__doc__)
            return 0
        cmd, rest = argv[0], argv[1:]
        commands = {"patches": patches_cmd, "source": source_cmd, "models": models_cmd}
        if cmd in TOOL_COMMANDS:  # imported only when asked for: one tool's needs never stop another
            module, attr = TOOL_COMMANDS[cmd]
            commands[cmd] = getattr(importlib.import_module(f"harness.{module}"), attr)
        if cmd not in commands:
            print(f"error: unknown command {cmd!r}; expected one of: {', '.join([*STAGES, *commands, *TOOL_COMMANDS])}",
                  file=sys.stderr)
            return EXIT_BAD_INPUT
        return commands[cmd](rest)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except proc.Interrupted as exc:  # before or after the stages ran: nothing to record
        print(f"{exc}", file=sys.stderr)
        return exc.exit_code
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as exc:
        if is_environment_error(exc):
            print(f"error: {describe(exc)}", file=sys.stderr)
            return EXIT_BAD_INPUT
        raise


if __name__ == "__main__":
    sys.exit(main())
