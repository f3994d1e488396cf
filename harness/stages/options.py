"""The command-line options every stage reads, each declared once (:data:`STAGE_OPTIONS`), and the stages' typed
:class:`Options` they fill in.

One :class:`StageOption` per option, in the manner of nox's own ``_options.py``: its flags, the parser's type,
default and help, the parent parser it belongs to (``paths``, ``build``, ``run``) and the :class:`Options` field
it fills.  harness.args builds the parent parsers from them and turns a parsed command line into
:class:`Options`; noxfile.py names them in the stage sessions' help; docs/layout.md#the-command-line holds
their table (:func:`markdown_table`, kept current by tests/test_stage_options.py).

Standard library only: ``--help`` of every command and the noxfile import it before any requirement is
installed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Literal

#: compute-sanitizer tools the native tests can run under (harness.stages.native_tests.native_tests).
SANITIZERS = ("memcheck", "racecheck", "initcheck", "synccheck")

#: How a parsed value becomes its :class:`Options` field: ``value`` as parsed, ``names`` through
#: harness.args.split_names (repeatable, comma separated), ``defines`` through harness.args.parse_defines.
Convert = Literal["value", "names", "defines"]

#: The parent parsers of harness.args: the checkout's paths, what a build takes (the stages, forecast, bisect,
#: bench-compile), what shapes a run (the stages, forecast).
Group = Literal["paths", "build", "run"]


@dataclass(frozen=True)
class StageOption:
    """One command-line option of the stages, declared once.

    ``flags``: its option strings, the first the name it is known by (``("-j", "--jobs")`` lists the short one
    first as argparse shows it).  ``field``: the :class:`Options` field it fills; ``dest``: the parsed namespace's
    attribute where it differs (:attr:`attribute`).  ``group``: the parent parser that declares it (:data:`Group`).  ``help``: its line in
    ``--help`` and docs/layout.md.  ``action``, ``kind`` (the argparse ``type``: a name in harness.args,
    ``int``-like checks there), ``choices``, ``metavar``: as argparse takes them; ``default``: the parser's
    default (None for a path: ``checkout`` names it in the checkout instead, harness.args.in_checkout).
    ``convert``: how the parsed value becomes the field (:data:`Convert`).  ``completes``: the matrix's names
    tab completion offers for its value (harness.args.MatrixNames), None for file names.
    """

    flags: tuple[str, ...]
    field: str
    group: Group
    help: str
    action: str | None = None
    kind: Literal["positive", "bench_repeats", "bench_warmup", "path"] | None = None
    default: object = None
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    checkout: str | None = None
    convert: Convert = "value"
    dest: str = ""
    completes: Literal["platforms", "groups", "models"] | None = None

    @property
    def attribute(self) -> str:
        """The parsed namespace's attribute: ``dest`` where the command line's name differs from the field's
        (``--platform`` gives ``args.platform``, a list of comma-separated names; the field holds the names)."""
        return self.dest or self.field

    @property
    def name(self) -> str:
        """The long flag (``--jobs`` of ``("-j", "--jobs")``, ``-D`` when there is none)."""
        return next((f for f in self.flags if f.startswith("--")), self.flags[0])


def _path(flag: str, field_name: str, name: str, what: str) -> StageOption:
    return StageOption((flag,), field_name, "paths", f"{what} (default: {name} of the checkout)", kind="path",
                       checkout=name)


#: Every option the stages take, in the order ``--help`` lists them: one declaration each.
STAGE_OPTIONS: tuple[StageOption, ...] = (
    _path("--matrix", "matrix", "matrix.yaml", "matrix file"),
    _path("--patches-dir", "patches_dir", "patches/", "patch series directory"),
    _path("--work-dir", "work_dir", ".harness/", "work trees and build directories"),
    _path("--results-dir", "results_dir", "results/", "where runs are written, one directory each"),
    StageOption(("--platform",), "platforms", "build", action="append", default=[], convert="names", dest="platform",
                completes="platforms",
                help="platform from matrix.yaml (repeatable or comma separated; default: every platform, those "
                     "this machine cannot run reported as skipped; forecast: linux-x86_64-cpu and "
                     "linux-x86_64-cuda; bisect: exactly one)"),
    StageOption(("--gpu-arch", "--cuda-arch"), "cuda_arch", "build", metavar="ARCH",
                help="the GPU architectures to build for, as the GPU kind's CMake variable takes them "
                     "(CMAKE_CUDA_ARCHITECTURES; default: asked of the kind's tool, nvidia-smi, where the matrix "
                     "says auto); --cuda-arch is the same option"),
    StageOption(("-j", "--jobs"), "jobs", "build", kind="positive",
                help="jobs at once, every build and compile step of the run together (default: the cores this "
                     "process may use; docs/platforms.md)"),
    StageOption(("-D",), "cmake_defines", "build", action="append", default=[], metavar="VAR=VALUE",
                convert="defines", dest="defines", help="extra CMake cache option passed through to every configure"),
    StageOption(("--run-id",), "run_id", "run", help="continue this run (default: $HARNESS_RUN_ID or a new run)"),
    StageOption(("--sanitize",), "sanitize", "run", choices=SANITIZERS,
                help="also run the native tests under compute-sanitizer with this tool"),
    StageOption(("--upstream-tests",), "upstream_tests", "run", action="store_true", default=False,
                help="the test command also runs upstream's own ctest suite (matrix.yaml upstream_tests) on base "
                     "and fork side by side, and test-backend-ops on a GPU (docs/upstream-tests.md)"),
    StageOption(("--upstream-test",), "upstream_only", "run", action="append", default=[], convert="names",
                dest="upstream_test", metavar="NAME",
                help="with --upstream-tests: only these tests of upstream's suite, built and run on base and fork "
                     "(repeatable; default: the whole label; bisect narrows its points to the tests it bisects)"),
    StageOption(("--model",), "models", "run", action="append", default=[], convert="names", dest="model", completes="models",
                help="only these models (repeatable)"),
    StageOption(("--group",), "groups", "run", action="append", default=[], convert="names", dest="group", completes="groups",
                help="only these comparison groups (repeatable)"),
    StageOption(("--n-predict",), "n_predict", "run", kind="positive", help="tokens per generation (default: matrix)"),
    StageOption(("--repeats",), "repeats", "run", kind="positive", help="runs per configuration (default: matrix)"),
    StageOption(("--lanes",), "lanes", "run", kind="positive",
                help="generations at once on a CPU platform, each process with cores/lanes threads (default: the "
                     "machine's cores, at most 8; 1: one at a time with llama.cpp's default threads; "
                     "docs/cache.md)"),
    StageOption(("--no-bench",), "bench", "run", action="store_false", default=True,
                help="compare-outputs without its speed stage (the groups' speed rules; docs/speed.md)"),
    StageOption(("--bench-repeats",), "bench_repeats", "run", kind="bench_repeats",
                help="timed rounds per speed rule (default: matrix; at least 5)"),
    StageOption(("--bench-warmup",), "bench_warmup", "run", kind="bench_warmup", metavar="N",
                help="untimed rounds before a speed rule's timed ones (default: matrix; 0-20)"),
    StageOption(("--no-cache",), "no_cache", "run", action="store_true", default=False,
                help="regenerate every generation, rerun every native test and measure every speed pair instead "
                     "of reusing results whose inputs are byte-identical (docs/cache.md); fresh results still "
                     "refresh the cache"),
)


def declared(group: Group) -> tuple[StageOption, ...]:
    """The options of parent parser ``group``, in :data:`STAGE_OPTIONS`'s order."""
    return tuple(o for o in STAGE_OPTIONS if o.group == group)


@dataclass
class Options:
    """The stages' options, one field per :class:`StageOption` that a stage reads (its help says what it
    means: :data:`STAGE_OPTIONS`); ``--matrix``, ``--results-dir`` and ``--run-id`` choose the run itself and
    are read by harness.commands instead.  ``platforms`` empty: every platform; ``cmake_defines``: the ``-D``
    options as a mapping; ``jobs`` None: the cores this process may use
    (:meth:`harness.stages.building.builds.Builds.job_budget`); ``lanes`` None:
    :func:`harness.stages.outputs.greedy.lanes_for` decides; None elsewhere: the matrix's value.
    """

    platforms: list[str] = field(default_factory=list)
    cmake_defines: dict[str, str] = field(default_factory=dict)
    cuda_arch: str | None = None
    jobs: int | None = None
    sanitize: str | None = None
    models: list[str] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    n_predict: int | None = None
    repeats: int | None = None
    work_dir: Path = Path(".harness")
    patches_dir: Path = Path("patches")
    bench: bool = True
    bench_repeats: int | None = None
    bench_warmup: int | None = None
    no_cache: bool = False
    lanes: int | None = None
    upstream_tests: bool = False
    upstream_only: list[str] = field(default_factory=list)


#: The declared options that choose the run rather than shape it: no :class:`Options` field.
RUN_CHOICE = frozenset({"matrix", "results_dir", "run_id"})


def undeclared_fields() -> list[str]:
    """:class:`Options` fields no :class:`StageOption` fills, and declared options (outside :data:`RUN_CHOICE`)
    that name no field; empty when the two agree (tests/test_stage_options.py)."""
    have = {f.name for f in fields(Options)}
    named = {o.field for o in STAGE_OPTIONS} - RUN_CHOICE
    return sorted(have ^ named)


def markdown_table() -> str:
    """The stages' options as the Markdown table of docs/layout.md#the-command-line: flag, parser, help."""
    rows = ["| option | parser | what it does |", "|---|---|---|"]
    for o in STAGE_OPTIONS:
        flag = ", ".join(f"`{f}`" for f in o.flags)
        rows.append(f"| {flag} | {o.group} | {o.help.replace('|', '/')} |")
    return "\n".join(rows) + "\n"
