"""The command line: ``llama-fork-harness COMMAND [options]`` (or ``python -m harness COMMAND [options]``).

Every command and its options are declared here, from the parent parsers of harness.args; the code that runs a
command is imported only when it runs, so ``--help`` needs nothing but the standard library.  Tab completion of
commands and options comes from argcomplete (imported only when the shell asks for completions:
``eval "$(register-python-argcomplete llama-fork-harness)"``).  The nox sessions
call exactly these commands and pass ``session.posargs`` through.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path
from typing import NoReturn, Sequence

from . import __version__
from .args import (build_options, completes, find_checkout, matrix_options, patches_options, positive,
                   results_options, run_options, strip_dashdash, work_options)
from .common import proc
from .common.errors import EXIT_BAD_INPUT, EXIT_ENVIRONMENT, HarnessError
from .common.fs import describe, free_note, is_environment_error
from .common.interpreter import NEEDED_MODULES
from .stages.command_names import STAGE_COMMANDS

PROG = "llama-fork-harness"

#: The stages, in the order one command runs them (``build test compare-outputs``): harness.stages.command_names.
STAGES = tuple(STAGE_COMMANDS)


def _version() -> str:
    """``--version``'s text: the harness's version, the base commit of the checkout's matrix.yaml and the
    digest of its patch series (harness.stages.building.patches.series_digest, the key builds are cached by).
    What cannot be read (no checkout, a broken matrix or series) is named in place of its value."""
    lines = [f"{PROG} {__version__}"]
    root = find_checkout()
    if root is None:
        return "\n".join([*lines, "no checkout here: no matrix.yaml in this directory or any above it"])
    try:
        from .matrix.config import load_matrix
        lines.append(f"base commit: {load_matrix(root / 'matrix.yaml').base_commit} ({root / 'matrix.yaml'})")
    except Exception as exc:  # the version is still worth printing
        lines.append(f"base commit: unknown ({type(exc).__name__}: {exc})")
    try:
        from .stages.building.patches import read_series, series_digest
        patches = read_series(root / "patches")
        lines.append(f"series digest: {series_digest(patches)} ({len(patches)} patches in {root / 'patches'})")
    except Exception as exc:
        lines.append(f"series digest: unknown ({type(exc).__name__}: {exc})")
    return "\n".join(lines)


class _VersionAction(argparse.Action):
    """``--version``: print :func:`_version` and exit 0 (its imports happen only when asked)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(_version())
        parser.exit(0)


def _add(sub: argparse._SubParsersAction, name: str, handler: str, summary: str, description: str = "",
         parents: Sequence[argparse.ArgumentParser] = ()) -> argparse.ArgumentParser:
    """Declare command ``name``: ``summary`` is its line in the top-level help, ``description`` (default: the
    summary) its own help's, ``handler`` the ``module:function`` under harness/ that runs it with the parsed
    arguments."""
    ap = sub.add_parser(name, help=summary, description=description or summary, parents=list(parents),
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.set_defaults(handler=handler)
    return ap


def _stage_commands(sub: argparse._SubParsersAction) -> None:
    stage = [matrix_options(), patches_options(), work_options(), results_options(), build_options(), run_options()]
    order = ", ".join(STAGES)
    for name, line in STAGE_COMMANDS.items():
        ap = _add(sub, name, "commands:run_stages", line,
                  f"{line}.\n\nStages run in the order {order}, all of one command "
                  f"in one run: `{PROG} {' '.join(STAGES)} [options]`.", stage)
        ap.add_argument("stages", nargs="*", metavar="STAGE",
                        help=f"further stages to run in the same run: {', '.join(STAGES[1:])}")
        ap.add_argument("--json", action="store_true",
                        help="print the run's verdict as one JSON object on stdout (verdict, whether it is final, "
                             "the failing steps and comparisons with why, the run directory); the progress lines "
                             "go to stderr")


def _tool_commands(sub: argparse._SubParsersAction) -> None:
    common = [matrix_options(), patches_options(), work_options()]
    ap = _add(sub, "patches", "commands:patches", "the patch series workflow: apply, export, check",
              "apply: the series onto the base in .harness/dev/llama.cpp (the tree you edit; builds use their "
              "own tree); export: its commits back into patches/; check: fail when patches/ differs from what "
              "export writes (docs/patches.md)", common)
    ap.add_argument("action", choices=("apply", "export", "check"), help="what to do with the series")
    ap.add_argument("--force", action="store_true", help="apply even if the dev tree holds unexported work")

    ap = _add(sub, "source", "commands:source", "obtain the base; write the trimmed offline mirror or file list",
              "fetch: obtain the base; export-mirror: write the trimmed mirror archive and the data archive of "
              "upstream's suite beside it; files: write the pinned "
              "commit's file list (base.files)", common)
    ap.add_argument("action", choices=("fetch", "export-mirror", "files"), help="what to do with the base")
    ap.add_argument("--out", type=Path, default=None,
                    help="mirror archive path (default: mirror/llama.cpp-<commit12>.tar.gz of the checkout) or "
                         "file list path (default: upstream-files/llama.cpp-<commit12>.files of the checkout)")
    ap.add_argument("--no-data", action="store_true",
                    help="export-mirror: leave out the data archive of upstream's suite (<mirror>.data.tar.xz: the "
                         "vocabularies and chat templates of models/ its tests read; those tests are then skipped)")

    ap = _add(sub, "models", "commands:models", "assemble, generate or derive the matrix's models",
              "Assemble, generate or derive the matrix's models and print their paths.  A derived (quantized) "
              "model takes llama-quantize from a finished base build of the host's CPU platform under "
              "--work-dir; this command builds nothing.", common)
    ap.add_argument("names", nargs="*", metavar="NAME", help="models of matrix.yaml (default: all)")

    ap = _add(sub, "llama-bench-rows", "tools.llama_bench_rows:run",
              "runs' speed measurements as llama-bench JSONL rows (for upstream's compare-llama-bench.py); "
              "a platform's kind (its backend, whether it has GPUs) is read from --matrix",
              parents=[results_options(), matrix_options()])
    ap.add_argument("runs", nargs="+", metavar="RUN", help="run id (under --results-dir) or run directory")
    completes(ap.add_argument("--platform", action="append", default=[], help="platform whose bench.json to "
                              "convert (repeatable; default: every one with a bench.json)"), "platforms")
    ap.add_argument("--out", type=Path, default=None,
                    help="one JSONL file for all rows (default: each run's <platform>/speed/llama-bench.jsonl)")

    ap = _add(sub, "ci-matrix", "tools.ci_matrix:run", "the GitHub Actions job matrix (JSON) derived from matrix.yaml",
              parents=[matrix_options(), patches_options()])
    completes(ap.add_argument("--platform", action="append", default=[], help="only this platform (repeatable "
                              "or comma separated; default: every platform with ci)"), "platforms")
    ap.add_argument("--github-output", action="store_true",
                    help="also append matrix=<json> to the file named by $GITHUB_OUTPUT, and the platforms "
                         "left out to $GITHUB_STEP_SUMMARY")
    ap.add_argument("--self-hosted", default="false", type=lambda v: v.strip().lower(),
                    help="self-hosted runners exist (the repository variable HARNESS_SELF_HOSTED_RUNNERS; "
                         "default false: platforms that need them are left out)")
    ap.add_argument("--event", default="",
                    help="the workflow's github.event_name: self-hosted runners are used only for a push to the "
                         "default branch, a scheduled run, or a pull request or manual run approved in the "
                         "approval environment (APPROVAL_ENVIRONMENT of harness/tools/ci_matrix.py; default: "
                         "the --self-hosted value alone decides)")
    ap.add_argument("--ref", default="", help="the workflow's github.ref (for --event push and workflow_dispatch)")
    ap.add_argument("--default-branch", default="",
                    help="the repository's default branch (for --event push and workflow_dispatch)")
    ap.add_argument("--repo", default=None,
                    help="repository name for the Windows path budget (default: from $GITHUB_REPOSITORY, "
                         "else the checkout directory's name)")

    ap = _add(sub, "check-windows", "tools.windows_check:run",
              "compile the patches' Windows-only host code with MinGW-w64 on Linux",
              "Compile the fork's Windows-only host code with MinGW-w64 and its POSIX side with g++ (syntax "
              "only).", common)
    ap.add_argument("--tree", type=Path, default=None,
                    help="patched source tree (default: the fork work tree <work-dir>/fork/llama.cpp, "
                         "made from the series when missing)")
    ap.add_argument("--log-dir", type=Path, default=None, help="compile logs (default: <work-dir>/check-windows)")
    ap.add_argument("--cuda-include", type=Path, default=None,
                    help="CUDA include directory (default: the nvidia-cuda-runtime wheel, $CUDA_PATH, "
                         "/usr/local/cuda)")
    ap.add_argument("--mingw-cxx", default=None,
                    help="MinGW-w64 C++ compiler (default: the first of MINGW_CANDIDATES of "
                         "harness/tools/windows_check.py on PATH)")
    ap.add_argument("--host-cxx", default=None, help="host C++ compiler for the POSIX side (default: g++)")
    ap.add_argument("--only", action="append", default=[], metavar="PATH",
                    help="check only this file of the list (repeatable)")


def _analysis_commands(sub: argparse._SubParsersAction) -> None:
    ap = _add(sub, "triage", "triage.triage:run", "what changed between two runs; exit 1 on a regression",
              "Report what changed between two result runs.  --matrix names each fork configuration's upstream "
              "configuration in its mode, the preferred reference of its speed ratios (without the file every "
              "reference counts as fork-only).", [results_options(), matrix_options(), work_options()])
    ap.add_argument("runs", nargs="*", metavar="RUN",
                    help="run ids or directories: A B, or only B (A: the previous run covering its platforms); "
                         "default: latest against its previous run")
    ap.add_argument("--json", action="store_true", help="print a machine-readable JSON object")
    ap.add_argument("--strict", action="store_true",
                    help="count a record of A that B did not run (or was interrupted in) as a regression")
    ap.add_argument("--confirm", action="store_true",
                    help="re-measure each suspect speed change with both runs' builds interleaved on this machine "
                         "(as asv continuous does; run B's builds from --work-dir); exit 1 when one is confirmed")
    ap.add_argument("--a-work-dir", type=Path, action="append", default=[],
                    help="--confirm: a work directory holding run A's builds (repeatable; default: --work-dir)")

    ap = _add(sub, "bisect", "bisect:run", "the first patch (or upstream commit) that makes a row fail",
              "Bisect each failing row of a run (or the one --check names) across its series, each point judged "
              "as the run judged it; bisect.json and bisect.md in the run's folder (docs/triage.md).",
              [matrix_options(), patches_options(), work_options(), results_options(), build_options()])
    ap.add_argument("run", nargs="?", default=None, metavar="RUN",
                    help="run id or directory whose failing rows to bisect (default: the newest run)")
    ap.add_argument("--check", default=None, metavar="ID",
                    help="the one failing row to bisect, named as the run's records name it (e.g. 'linux-x86_64-cpu "
                         "fork expectations: mapped moe-small')")
    ap.add_argument("--upstream", metavar="GOOD..BAD", default=None,
                    help="bisect the rows across the upstream commits on BAD's first-parent line after GOOD instead, "
                         "each with the whole series applied; a commit where it does not apply is skipped")
    ap.add_argument("--repo", type=Path, default=None,
                    help="with --upstream: git repository holding the commits (default: the matrix's first local "
                         "source that has them, else a clone fetched from its git source)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")

    ap = _add(sub, "forecast", "upstream.forecast:run",
              "what the series would hit on another upstream commit (docs/forecast.md)",
              "What the patch series would hit on another upstream commit: every patch tried, what applied "
              "built, tested and compared (docs/forecast.md).",
              [matrix_options(), patches_options(), work_options(), results_options(), build_options(),
               run_options()])
    ap.add_argument("--onto", required=True, metavar="SOURCE",
                    help="pypi-sdist:PACKAGE==VERSION, URL@COMMIT, ARCHIVE.tar.gz#sha256=HEX or PATH[@REV]")
    ap.add_argument("--patches-only", action="store_true", help="stop after the patch stage (no builds)")
    ap.add_argument("--bisect", metavar="ID", nargs="?", const="", default=None,
                    help="also bisect the forecast's failing rows (alone: every one; ID: as bisect --check) across "
                         "the upstream commits between the two bases; needs a local or git source")

    ap = _add(sub, "roll", "upstream.roll:run",
              "move the pin and the series to another upstream commit, on a branch, verified (docs/roll.md)",
              "Move the pin and the patch series to another upstream commit in one command: the branch "
              "roll/<commit12>, the series rebased patch by patch with git am -3 in the dev tree (stopping at a "
              "conflict like git rebase), the new pin written and committed, the main job run on it and "
              "results/<run>/roll.md written (docs/roll.md).",
              [matrix_options(), patches_options(), work_options(), results_options(), build_options(),
               run_options()])
    ap.add_argument("--onto", metavar="SOURCE", default=None,
                    help="pypi-sdist:PACKAGE==VERSION, URL@COMMIT, ARCHIVE.tar.gz#sha256=HEX or PATH[@REV]")
    action = ap.add_mutually_exclusive_group()
    action.add_argument("--continue", dest="continue_", action="store_true",
                        help="go on after resolving the conflict in the dev tree and `git am --continue` there")
    action.add_argument("--abort", action="store_true",
                        help="return to the branch the roll started from, every file as it was")
    ap.add_argument("--no-verify", action="store_true",
                    help="commit the new pin and write roll.md without running the main job on it")

    ap = _add(sub, "report", "views.report:run", "a run's report.html, one self-contained page",
              "Write a run's HTML report and print its path.", [results_options()])
    ap.add_argument("run", nargs="?", default="latest", help="run id or directory (default: latest)")
    ap.add_argument("--markdown", action="store_true",
                    help="also print the Markdown summary to stdout (the path then goes to stderr)")
    ap.add_argument("--against", default="previous", metavar="RUN",
                    help="list changes since this earlier run: a run directory, or a run id beside RUN, else under "
                         "--results-dir (default 'previous': triage's choice, the newest earlier run beside RUN of "
                         "the same patch series covering its platforms and groups, if any; 'none': no changes "
                         "section)")
    ap.add_argument("--out", type=Path, default=None, help="HTML file (default: <run>/report.html)")


def _bench_commands(sub: argparse._SubParsersAction) -> None:
    ap = _add(sub, "bench", "tools.bench:run", "the pin-ladder benchmark on a CUDA machine")
    ap.add_argument("--build-dir", type=Path, required=True, help="CUDA build of the fork (bin/ with shared libs)")
    ap.add_argument("--model", type=Path, default=None, help="MoE GGUF for llama-bench")
    ap.add_argument("--n-layer", type=positive, default=8, help="the model's layer count (for PIN_LAYERS=half)")
    ap.add_argument("--gib", type=float, default=4.0, help="host buffer size for the ladder measurements, GiB")
    ap.add_argument("--out", type=Path, default=None, help="also write the results to this JSON file")
    ap.add_argument("--child", choices=("ladder", "plain"), help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--reps", type=positive, default=5,
                    help="registrations per process in the ladder cost measurement")

    ap = _add(sub, "bench-compile", "tools.compile_bench:run", "time the CUDA compile step, fork and base",
              "Time the compile step of a CUDA platform (default: linux-x86_64-cuda), fork and base, in a fresh "
              "work directory (docs/benchmarks.md).", [matrix_options(), patches_options(), build_options()])
    ap.add_argument("--cold", action="store_true", help="start from an empty ccache directory")
    ap.add_argument("--fork-only", action="store_true", help="time the fork's compile only, not the base's")
    ap.add_argument("--keep", type=Path, default=None, help="work and results directory to keep (default: temporary)")

    clone = argparse.ArgumentParser(add_help=False)
    clone.add_argument("--clone-dir", type=Path, default=None,
                       help="where to clone (default: a new directory under the system's temporary directory)")
    clone.add_argument("harness_args", nargs=argparse.REMAINDER,
                       help="after --: arguments for the harness stages (default: none, the main job)")
    ap = _add(sub, "bench-loop", "tools.bench_loop:run", "time edit -> verdict on a fresh clone with warm caches",
              "Time edit -> verdict on a fresh clone of HEAD with this machine's warm caches (docs/cache.md).",
              [clone])
    ap.add_argument("--keep", action="store_true", help="keep the clone (its builds and results) afterwards")
    ap.add_argument("--scenario", action="append", default=[],
                    help="run only this scenario (repeatable; warm-up, no-op, comment, code-patch-3, code-patch-2; "
                         "default: all, in that order)")
    ap = _add(sub, "bench-cold", "tools.bench_cold:run",
              "time the README's first command on a fresh clone with empty caches",
              "Time the README's first command on a fresh clone with empty caches (docs/benchmarks.md).", [clone])
    ap.add_argument("--keep", action="store_true", help="keep the clone, its environment, caches and results")
    ap.add_argument("--reuse-python", action="store_true",
                    help="no new environment and no pip install: run nox with this Python")


class _Parser(argparse.ArgumentParser):
    """argparse's parser whose usage errors are one ``error:`` line (the command, what is wrong, where the help
    is) and exit 2, as every other expected error of the command line (README.md, "Exit codes"); its
    sub-parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        """Print ``error: <prog>: <message> (<prog> --help tells the options)`` to stderr and exit 2."""
        self.exit(EXIT_BAD_INPUT, f"error: {self.prog}: {message} (`{self.prog} --help` tells the options)\n")


def parser() -> argparse.ArgumentParser:
    """The whole command line: one sub-parser per command, each option declared once (harness.args).  Its
    defaults point into the checkout holding the working directory (harness.args.find_checkout)."""
    top = _Parser(
        prog=PROG, description="Build, test and compare the llama.cpp fork (upstream at one commit plus "
                               "patches/) on each platform of matrix.yaml; results in results/<run-id>/.",
        epilog=f"`{PROG} COMMAND --help` tells a command's options.  Exit codes: 0 passed, 1 failed, 2 bad input "
               "or environment, 3 incomplete, 130/143 interrupted (README.md).")
    top.add_argument("--version", action=_VersionAction,
                     help="print the harness's version, the base commit and the patch series' digest")
    sub = top.add_subparsers(title="commands", metavar="COMMAND", dest="command")
    _stage_commands(sub)
    _tool_commands(sub)
    _analysis_commands(sub)
    _bench_commands(sub)
    return top


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """``argv`` (``COMMAND [options]``) parsed; the stage commands' ``stages`` are every stage named, in the
    order they run.  Raises SystemExit (argparse's, 2) on an unknown command or option."""
    argv = list(argv)
    if argv[1:2] == ["--"]:  # nox passes its posargs after one
        del argv[1]
    args = parser().parse_args(argv)
    if args.command in STAGES:
        named = {args.command, *args.stages}
        unknown = named - set(STAGES)
        if unknown:
            parser().error(f"{', '.join(sorted(unknown))}: not a stage; stages: {', '.join(STAGES)}")
        args.stages = [s for s in STAGES if s in named]
    return args


def parse_command(command: str, argv: Sequence[str]) -> argparse.Namespace:
    """The arguments of ``command`` (its own ``argv``, a leading ``--`` dropped) parsed as the command line
    parses them: what a module's ``main(argv)`` runs with."""
    return parse([command, *strip_dashdash(argv)])


def run(args: argparse.Namespace) -> int:
    """Run the command ``args`` names (its ``handler``, imported now); returns its exit code."""
    module, _, function = args.handler.partition(":")
    return getattr(importlib.import_module(f"harness.{module}"), function)(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code (see harness.common.errors): no command prints the help
    and returns 2.

    This is the one place expected errors (harness.common.errors.HarnessError, a missing file,
    Ctrl-C) become ``error: <message>`` on stderr and their exit code, without a traceback.
    """
    if "_ARGCOMPLETE" in os.environ:  # the shell asks for completions (argcomplete, README.md): answer and exit
        import argcomplete
        argcomplete.autocomplete(parser())
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        parser().print_help(sys.stderr)
        print(f"error: {PROG}: a command is needed (the commands are listed above)", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        args = parse(argv)
    except SystemExit as exc:  # --help, --version (0) or a usage error (2), already printed
        return int(exc.code or 0)
    try:
        return run(args)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in NEEDED_MODULES:
            raise
        print(f"error: {args.command} needs the module {exc.name}, which this Python ({sys.executable}) lacks: "
              "run `python -m pip install --require-hashes -r requirements.txt` in the project's environment",
              file=sys.stderr)
        return EXIT_ENVIRONMENT
    except HarnessError as exc:
        print(f"error: {without_error_prefix(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except proc.Interrupted as exc:  # before or after the stages ran: nothing to record
        print(f"{exc}", file=sys.stderr)
        return exc.exit_code
    except FileNotFoundError as exc:
        print(f"error: {without_error_prefix(str(exc))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as exc:
        if is_environment_error(exc):
            where = Path(exc.filename) if exc.filename else Path.cwd()
            print(f"error: {describe(exc)}{free_note(exc, where)}", file=sys.stderr)
            return EXIT_BAD_INPUT
        raise


def without_error_prefix(message: str) -> str:
    """``message`` without the ``error:`` its own text may start with (a tool's, pip's ``ERROR:``), so the line
    printed starts with exactly one ``error:``."""
    while message[:6].lower() == "error:":
        message = message[6:].lstrip()
    return message


def console() -> None:
    """The ``llama-fork-harness`` console script: :func:`main`'s code as the process's exit status."""
    sys.exit(main())

