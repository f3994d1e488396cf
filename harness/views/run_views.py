"""What a run's record is shown as once its stages end: the failure signatures (signatures.json,
harness.triage.signatures) and the report (report.html, harness.views.report).  The command line writes them
after the run loop returns or stops (harness.commands, harness.upstream.forecast), and again for a run whose harness
was killed once the next run has recorded it so (:func:`settle_killed`); the run loop itself writes only the record
(harness.pipeline), so data flows one way: stages -> record -> views.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

from ..common.console import Console
from ..record.leftovers import settle_killed_runs
from ..record.run import Run
from ..common.statuses import KILLED, VERDICT_EXIT_CODES, VERDICT_FAILED
from ..record.verdict import judge
from .report import write_report
from ..triage.signatures import classify_run


def write_views(run_dir: Path) -> Path:
    """Classify the failures of the run in ``run_dir`` into signatures.json, then write report.html (which shows
    them); returns the report's path.  Raises OSError when a file cannot be written."""
    classify_run(run_dir)
    return write_report(run_dir)


def settle_killed(root: Path, skip: Path, say: Callable[[str], None]) -> None:
    """Before a run in ``root`` (the results directory) begins: every other run there whose harness process was
    killed is recorded as incomplete and the processes it left running are ended (harness.record.leftovers),
    then its views are written again; ``skip`` is the new run's own directory, ``say`` gets one line per run."""
    for dead in settle_killed_runs(root, skip=skip):
        say(f"run {dead.run_dir.name}: its harness process was killed before its command ended; recorded as "
            f"incomplete ({KILLED}), {dead.ended} process(es) it left running ended")
        write_views(dead.run_dir)


def not_run_yet(run: Run, commands: Sequence[str]) -> list[str]:
    """The stage ``commands`` (in order) that no process of ``run`` has begun: while there are some and nothing
    failed, the run's verdict is not yet known (a failure is final whatever runs after it).  The first command
    (``build``) counts as begun once a later one is: each builds what it needs."""
    if run.overall() == VERDICT_FAILED:
        return []
    later = [c for c in commands[1:] if c in run.commands]
    return [c for i, c in enumerate(commands) if c not in run.commands and not (i == 0 and later)]


def verdict_line(run: Run, report: Path, commands: Sequence[str]) -> str:
    """The console's last line of a stage command: ``results: <dir> — <headline> (report: <path>)``, the headline
    naming what failed.  Where stage commands were not asked for and nothing failed (``build test``, ``build``
    alone), the line reads as the finished run of what was asked: ``passed: build and test, as asked; not asked:
    compare-outputs``, never as work still pending."""
    later = not_run_yet(run, commands)
    headline = run.headline()
    if later:
        asked = [c for c in commands if c not in later]
        headline = f"{headline}: {' and '.join(asked)}, as asked; not asked: {', '.join(later)}"
    return f"results: {run.dir} — {headline} (report: {report})"


def verdict_json(run: Run, report: Path, commands: Sequence[str]) -> dict[str, Any]:
    """What ``--json`` prints of a stage command's run: ``verdict`` (harness.common.statuses.VERDICT), ``final``
    (False while stage commands are still to run and nothing failed), ``exit_code``, ``headline``, the
    ``run_dir``, ``report``, the commands begun and ``not_run_yet``, and each failing step and comparison with
    why (harness.record.verdict.Row.to_json)."""
    rows = judge(run.steps, run.comparisons)
    later = not_run_yet(run, commands)
    overall = run.overall()
    return {"run_id": run.id, "run_dir": str(run.dir), "verdict": overall, "final": not later,
            "exit_code": VERDICT_EXIT_CODES[overall], "headline": run.headline(), "report": str(report),
            "commands": list(run.commands), "not_run_yet": later,
            "failing_steps": [r.to_json() for r in rows if r.kind == "step" and r.verdict.fails],
            "failing_comparisons": [r.to_json() for r in rows if r.kind == "comparison" and r.verdict.fails]}


def annotate_failures(run: Run, console: Console) -> None:
    """On GitHub Actions, one ``::error`` annotation per failing comparison (a failing step is annotated by its
    console end line) and one for the run's headline, each saying why (harness.record.verdict)."""
    for row in judge((), run.comparisons):
        if row.verdict.fails:
            console.error(row.verdict.why, row.name)
    if run.overall() == VERDICT_FAILED:
        console.error(run.headline(), f"run {run.id}: failed")
