"""What a run's record is shown as once its stages end: the failure signatures (signatures.json,
harness.analysis.signatures) and the report (report.html, harness.analysis.report).  The command line writes them
after the run loop returns or stops (harness.commands, harness.analysis.forecast), and again for a run whose harness
was killed once the next run has recorded it so (:func:`settle_killed`); the run loop itself writes only the record
(harness.pipeline), so data flows one way: stages -> record -> views.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..record.leftovers import settle_killed_runs
from ..record.results import KILLED
from .report import write_report
from .signatures import classify_run


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
