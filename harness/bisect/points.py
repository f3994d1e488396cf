"""A bisect point: the run's own stages, on the run's own selection, with the first k patches of its series.

A point is a run of the stage table (harness.pipeline.run_stages, harness.stages.table.STAGES) with the options
the bisected run was started with (its command lines in run.json, parsed as the command line parses them), only
the series cut to its first k patches and the platforms to those of the rows being bisected.  Nothing of a
point runs a program or judges a row on its own: the stages do, and the point's summary.json holds their
verdicts (harness.record.verdict).

Every point of a bisection shares one work directory, ``<work-dir>/bisect/work`` (so the base is built once and
the fork's build directory is rebuilt incrementally from one prefix to the next, ccache based there as in any
run), and its run is recorded under ``<work-dir>/bisect/runs/<run-id>-k<k>/``, outside the results directory:
a bisect point is never a run of the fork.  Its run.json records the kind ``bisect``
(harness.common.statuses.RUN_BISECT), by which history and triage leave it out wherever it lies.
"""

from __future__ import annotations

import argparse
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

from ..common.errors import InputError
from ..common.statuses import RUN_BISECT, STEP_PASSED
from ..matrix.config import Matrix
from ..record.inputs import read_run_info
from ..record.layout import RunLayout
from ..record.summary import RunSummary, read_run
from ..stages.building.patches import SERIES_FILE, Patch, read_series

@dataclass(frozen=True)
class RunCommandLine:
    """How the bisected run was started: ``stages`` (its stage commands, in table order) and ``args``, the options
    of its last stage command parsed as harness.cli parses them."""

    stages: tuple[str, ...]
    args: argparse.Namespace


def command_line(run_dir: Path) -> RunCommandLine:
    """The stage commands and options of the run in ``run_dir``, from its run.json.  Raises InputError naming
    run.json when it records no stage command (a run of another command, or of a harness that did not record
    its command lines)."""
    from ..cli import STAGES, parse
    info = read_run_info(RunLayout(run_dir).run_json)
    stages: list[str] = []
    last = None
    for command in info.commands:
        argv = list(command.argv[1:])
        if not argv or argv[0] not in STAGES:
            continue
        try:
            parsed = parse(argv)
        except SystemExit:
            raise InputError(f"{RunLayout(run_dir).run_json}: the command line {' '.join(argv)!r} does not parse "
                             "as this harness parses it; bisect the run with the harness that made it") from None
        stages += parsed.stages
        last = parsed
    if last is None:
        raise InputError(f"{RunLayout(run_dir).run_json}: no stage command (build, test, compare-outputs) recorded; "
                         "only a run of the stages can be bisected")
    return RunCommandLine(tuple(s for s in STAGES if s in stages), last)


def narrowed(command: RunCommandLine, tests: Sequence[str]) -> RunCommandLine:
    """``command`` with upstream's suite cut to ``tests`` (``--upstream-test``), or ``command`` itself where
    ``tests`` is empty or the run did not run the suite.  A point of a bisection whose rows are tests of the suite
    (harness.bisect.rows.suite_tests) builds and runs those tests alone on base and fork: the other tests decide
    no row bisected, and the whole suite is minutes of CPU at every point."""
    if not tests or not getattr(command.args, "upstream_tests", False):
        return command
    args = argparse.Namespace(**vars(command.args))
    args.upstream_test = list(tests)
    return RunCommandLine(command.stages, args)


def narrowing(command: RunCommandLine) -> str:
    """The words bisect's first line adds for a :func:`narrowed` command: "" where the suite is whole."""
    tests = getattr(command.args, "upstream_test", None) or []
    return f" (upstream's suite: only {', '.join(tests)}, the tests bisected)" if tests else ""


def write_prefix(patches: Sequence[Patch], k: int, out: Path) -> Path:
    """Write the first ``k`` of ``patches`` as a series in ``out`` (emptied first); returns ``out``."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for p in patches[:k]:
        shutil.copyfile(p.path, out / p.name)
    (out / SERIES_FILE).write_text(f"# the first {k} of {len(patches)} patches, for a bisect point\n"
                                   + "".join(f"{p.name}\n" for p in patches[:k]), encoding="utf-8")
    return out


def later_targets(patches: Sequence[Patch], k: int) -> dict[str, str]:
    """Test target -> the patch after the first ``k`` that brings it: its source file
    (``tests/<target>.cpp``, harness.stages.building.patch_diff.added_files) or its CMake definition
    (harness.stages.building.patch_diff.defined_targets); the first such patch wins."""
    from ..stages.building.patch_diff import added_files, defined_targets
    found: dict[str, str] = {}
    for p in patches[k:]:
        for target in [*(Path(f).stem for f in added_files(p)), *defined_targets(p)]:
            found.setdefault(target, p.name)
    return found


def matrix_at(matrix: Matrix, platforms: Sequence[str], patches: Sequence[Patch], k: int) -> tuple[Matrix, list[str]]:
    """``matrix`` without the test targets of ``platforms`` that a patch after the first ``k`` brings
    (:func:`later_targets`): the point's fork cannot build them, as a forecast's fork cannot build the tests of a
    patch that did not apply.  Returns the matrix and one line per target left out."""
    gone = later_targets(patches, k)
    plats, lines = dict(matrix.platforms), []
    for name in platforms:
        q = matrix.platform(name)
        lines += [f"{name}: test target {t} left out: it comes with {gone[t]}" for t in q.test_targets if t in gone]
        plats[name] = replace(q, test_targets=tuple(t for t in q.test_targets if t not in gone))
    return replace(matrix, platforms=plats), lines


@dataclass
class Point:
    """One point, run: ``k`` (patches applied), its run directory, its summary (harness.record.summary.RunSummary),
    the builds it ``made`` and ``reused`` (build steps that built something and those found up to date), and its
    wall time in ``seconds``."""

    k: int
    run_dir: Path
    summary: RunSummary
    made: int
    reused: int
    seconds: float


def build_counts(summary: RunSummary) -> tuple[int, int]:
    """(builds made, builds reused) of a run: its passed ``build`` steps, by whether they found nothing to do."""
    builds = [s for s in summary.steps if s.step == "build" and s.status == STEP_PASSED]
    reused = sum(s.up_to_date for s in builds)
    return len(builds) - reused, reused


@dataclass
class Points:
    """The points of one bisection of the run ``run_id``: ``command`` how it was started, ``matrix`` its matrix,
    ``patches`` its series, ``platforms`` those of the rows bisected, ``root`` the bisection's directory
    (``<work-dir>/bisect``), ``say`` for progress lines.  Each k is run at most once (:meth:`at`)."""

    run_id: str
    command: RunCommandLine
    matrix: Matrix
    patches: Sequence[Patch]
    platforms: Sequence[str]
    root: Path
    say: Callable[[str], None] = print
    runs: dict[int, Point] = field(default_factory=dict)

    def at(self, k: int) -> Point:
        """The point with the first ``k`` patches, run now or earlier in this bisection."""
        if k not in self.runs:
            self.runs[k] = self._run(k)
        return self.runs[k]

    def _run(self, k: int) -> Point:
        series = write_prefix(self.patches, k, self.root / "series" / f"k{k}")
        matrix, dropped = matrix_at(self.matrix, self.platforms, self.patches, k)
        for line in dropped:
            self.say(f"bisect: k={k}: {line}")
        self.say(f"bisect: k={k}: {', '.join(self.command.stages)} with patches 1..{k} of {len(self.patches)}")
        return run_point(k, f"{self.run_id}-k{k}", self.command, matrix, self.platforms, series, self.root / "work",
                         self.root / "runs", [f"k={k}"])


def run_point(k: int, name: str, command: RunCommandLine, matrix: Matrix, platforms: Sequence[str], series: Path,
              work: Path, runs: Path, label: Sequence[str]) -> Point:
    """Run ``command``'s stages (harness.pipeline.run_stages) with its options, on ``platforms``, with ``matrix``
    (its base commit is the point's upstream) and the series in ``series``, in the work directory ``work``; the
    run is ``runs/<name>``, of kind ``bisect``, its argv ``bisect LABEL STAGES``.  The one way any bisect point
    runs (across the series: :class:`Points`; across upstream commits: harness.bisect.upstream).  Returns the
    point at position ``k``.  Raises harness.stages.building.patches.PatchError for a series that cannot be read.
    """
    from ..args import stage_options
    from ..common import proc
    from ..pipeline import run_stages
    from ..record.run import Run
    from ..views.run_views import write_views
    started = time.monotonic()
    read_series(series)  # what the stages read, checked before they start
    opts = stage_options(command.args, platforms=list(platforms), work_dir=work, patches_dir=series)
    shutil.rmtree(runs / name, ignore_errors=True)
    with proc.handle_signals():
        run = Run.open(runs, name, argv=["bisect", *label, *command.stages], kind=RUN_BISECT)
        try:
            run_stages(matrix, run, opts, list(command.stages), say=lambda line: None)
            write_views(run.dir)
        finally:
            run.close()
    summary = read_run(run.dir)
    made, reused = build_counts(summary)
    return Point(k, run.dir, summary, made, reused, round(time.monotonic() - started, 1))
