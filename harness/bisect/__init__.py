"""Bisect: the first patch of the series that makes a row of a run fail, judged the way the run judged it.

``python -m harness bisect [RUN] [--check ID]`` (RUN default: the newest run) takes every failing row of RUN
(harness.bisect.rows: a step or comparison, or one expectation, upstream test or generation of a failing
step; ``--check`` picks one by its id) and finds, for each, the first patch of RUN's series at which it fails.
Each point k (the first k patches) is a run of RUN's own stages on RUN's own selection
(harness.bisect.points), and a row is judged there by the verdict that run recorded
(harness.record.verdict: the step's declared statuses and the group's ``expect``); RUN itself is the point with
the whole series.  A speed rule is judged by the speed stage's own rule and statistics, at RUN's repeats; a point
where a row was not run or a rule could not decide is undecided and stepped around
(harness.bisect.search).  The result goes to RUN's folder as ``bisect.json`` and ``bisect.md``
(harness.bisect.record), and report.html links them.

``--upstream GOOD..BAD`` bisects the same rows across upstream commits instead, each commit with the whole series
on top, through the same stages and the same verdict (harness.bisect.upstream).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from typing import Callable, Sequence

from ..common.errors import InputError
from .points import Points, command_line, narrowed, narrowing
from .record import AT_BASE, FOUND, RANGE, UNDECIDED_BASE, BisectRecord, PointVerdict, RowBisect, patch_info, write
from .rows import Seen, Target, failing_rows, judge_at, suite_tests
from .search import BAD, GOOD, search
from .upstream import BisectError, bisect_upstream, first_parent, upstream_commits

__all__ = ["BisectError", "bisect_run", "bisect_upstream", "first_parent", "main", "run", "upstream_commits"]


def main(argv: Sequence[str]) -> int:
    """``bisect`` with ``argv``, parsed as the command line parses it (harness.cli); returns :func:`run`'s code."""
    from ..cli import parse_command
    return run(parse_command("bisect", argv))


def run(args: argparse.Namespace) -> int:
    """``bisect [RUN] [--check ID]`` (:func:`bisect_run`), or ``bisect --upstream GOOD..BAD ...``
    (harness.bisect.upstream.run).  Returns the exit code; raises InputError subclasses (exit 2)."""
    if args.upstream is not None:
        from .upstream import run as upstream_run
        return upstream_run(args)
    if args.repo is not None:
        raise InputError("--repo needs --upstream GOOD..BAD")
    return bisect_run(args)


def last_good_in_series(at: Callable[[int], str], n: int) -> int | None:
    """For a row that fails (or cannot be judged) with no patch applied: the nearest point below ``n`` where it
    passes, probed at n-1, n-2, n-4, ... down to 1 (``at(k)`` judges point k, memoised by the caller), or None
    where none of those passes.

    Such a row checks what the series itself brings (a placement under GGML_CUDA_MOE_PIN_LAYERS fails on
    upstream, which has no routing): the patch to blame is the first bad one after the series made it pass, so
    the search runs from that point, as ``git bisect`` runs from any good commit it is given.
    """
    step = 1
    while n - step >= 1:
        if at(n - step) == GOOD:
            return n - step
        step *= 2
    return None


def _bisect_row(target: Target, points: Points, n: int, run_text: str, say: Callable[[str], None]) -> RowBisect:
    """The bisection of ``target`` over k in [0, n]; k = n is the bisected run itself (bad, in ``run_text``)."""
    seen = Seen(target, points.at, say, verdicts={n: PointVerdict(n, BAD, run_text)})
    at, verdicts = seen.outcome, seen.verdicts
    good = 0 if at(0) == GOOD else last_good_in_series(at, n)
    if good is not None:
        found = search(at, good, n)
        outcome = FOUND if found.exact else RANGE
        first, last = found.first_bad, found.last_good
        row = RowBisect(target.id, outcome, patch_info(points.patches, first), last, verdicts[first].text,
                        verdicts[last].text, [])
    else:
        row = RowBisect(target.id, AT_BASE if verdicts[0].outcome == BAD else UNDECIDED_BASE, None, None,
                        verdicts[0].text, "", [])
    row.points = [verdicts[k] for k in sorted(verdicts)]
    row.builds_made, row.builds_reused, row.seconds = seen.cost(points.runs)
    return row


def bisect_run(args: argparse.Namespace) -> int:
    """Bisect the failing rows of run ``args.run`` (default: the newest under ``--results-dir``) across its series
    (module doc); print one line per row and write ``bisect.json``, ``bisect.md`` and the report again.

    Returns 0 when every row bisected has one first bad patch, 1 when one ended as a range or at the base.  Raises
    InputError (exit 2) for a run that cannot be found, has no failing row, or a ``--check`` naming none of them.
    """
    from ..matrix.config import load_matrix
    from ..stages.building.patches import read_series
    from ..views.report import write_report
    say = (lambda line: print(line, file=sys.stderr, flush=True)) if args.json else \
        (lambda line: print(line, flush=True))
    started = time.monotonic()
    run_dir, summary, chosen = failing_rows(args.run, args.results_dir, args.check)
    command = narrowed(command_line(run_dir), suite_tests(chosen))
    patches = read_series(command.args.patches_dir)
    if not patches:
        raise InputError(f"run {run_dir.name}: its series ({command.args.patches_dir}) holds no patch to bisect")
    matrix = load_matrix(command.args.matrix)
    platforms = list(dict.fromkeys(t.platform for t in chosen))
    points = Points(summary.run_id, command, matrix, patches, platforms,
                    (command.args.work_dir / "bisect").resolve(), say)
    say(f"bisect: run {run_dir.name}: {len(chosen)} failing row(s) across {len(patches)} patch(es) of "
        f"{command.args.patches_dir}; each point runs {' '.join(command.stages)} on {', '.join(platforms)}"
        + narrowing(command))
    rec = BisectRecord(summary.run_id, [p.name for p in patches])
    # with --json, standard output holds the JSON alone: the stages' console lines go to standard error
    with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
        for target in chosen:
            rec.rows.append(_bisect_row(target, points, len(patches), judge_at(target, summary).text, say))
            say(f"bisect: {rec.rows[-1].line()}")
    rec.points = [{"k": p.k, "run": str(p.run_dir), "builds_made": p.made, "builds_reused": p.reused,
                   "seconds": p.seconds} for p in sorted(points.runs.values(), key=lambda p: p.k)]
    rec.builds_made = sum(p.made for p in points.runs.values())
    rec.builds_reused = sum(p.reused for p in points.runs.values())
    rec.seconds = round(time.monotonic() - started, 1)
    json_path, md_path = write(run_dir, rec)
    write_report(run_dir)
    if args.json:
        print(json.dumps(rec.to_json(), indent=2))
    else:
        for row in rec.rows:
            print(row.line())
        print(f"bisect: {md_path} ({len(rec.points)} point(s), {rec.builds_made} build(s) made, "
              f"{rec.builds_reused} reused, {rec.seconds:.1f} s)")
    return 0 if all(r.outcome == FOUND for r in rec.rows) else 1

