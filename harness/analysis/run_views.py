"""What a run's record is shown as once its stages end: the failure signatures (signatures.json,
harness.analysis.signatures) and the report (report.html, harness.analysis.report).  The command line writes them
after the run loop returns or stops (harness.cli, harness.analysis.forecast); the run loop itself writes only the
record (harness.pipeline), so data flows one way: stages -> record -> views.
"""

from __future__ import annotations

from pathlib import Path

from .report import write_report
from .signatures import classify_run


def write_views(run_dir: Path) -> Path:
    """Classify the failures of the run in ``run_dir`` into signatures.json, then write report.html (which shows
    them); returns the report's path.  Raises OSError when a file cannot be written."""
    classify_run(run_dir)
    return write_report(run_dir)
