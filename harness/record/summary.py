"""A run's ``summary.json`` read back, typed: the one reader for everything that looks at a finished (or
stopped) run: triage, the report, the signatures, the forecast, the speed tools.

:func:`read_run` gives a :class:`RunSummary`: its steps are :class:`~harness.record.records.StepRecord`, its
comparisons :class:`~harness.record.records.ComparisonRecord`, and the run's own facts (verdict, skipped
platforms, what did not run, the result cache's counts) are fields.  A summary of a harness process that died
mid-way reads as settled (harness.record.json_files.settle_dead_progress).  Readers never index the JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..common.fs import write_text_whole
from .json_files import load_records
from .layout import RunLayout
from .records import ComparisonRecord, RecordError, StepRecord
from ..common.statuses import KILLED, STEP_SKIPPED
from .summary_md import SummaryView, render_markdown
from .verdict import unproven_notes
from ..common.json_value import JSON

#: A step's identity in a run: (platform, config, step).
StepKey = tuple[str, str, str]


@dataclass(frozen=True)
class RunSummary:
    """What a run's summary.json holds: ``run_id``; ``overall``, the verdict it was written with (one of
    harness.common.statuses.VERDICT); the ``steps`` and ``comparisons`` in the order recorded;
    ``skipped_platforms`` (platform -> why); ``incomplete`` (what was asked for and did not run); ``cache`` (the
    result cache's counts, kind -> event -> n); ``interrupted`` (``killed`` for a run whose harness process died,
    else ""); ``updated`` (when it was last written, ISO 8601 UTC; "" when unknown)."""

    run_id: str
    overall: str
    steps: list[StepRecord] = field(default_factory=list)
    comparisons: list[ComparisonRecord] = field(default_factory=list)
    skipped_platforms: dict[str, str] = field(default_factory=dict)
    incomplete: list[str] = field(default_factory=list)
    cache: dict[str, dict[str, int]] = field(default_factory=dict)
    interrupted: str = ""
    updated: str = ""

    @property
    def killed(self) -> bool:
        """True when the run's harness process died before its command ended."""
        return self.interrupted == "killed"

    def steps_by_key(self) -> dict[StepKey, StepRecord]:
        """Each step by (platform, config, step)."""
        return {(s.platform, s.config, s.step): s for s in self.steps}

    def comparisons_by_key(self) -> dict[tuple[str, ...], ComparisonRecord]:
        """Each comparison by :meth:`ComparisonRecord.key`."""
        return {c.key(): c for c in self.comparisons}

    def step_status(self, platform: str, config: str, step: str) -> str | None:
        """The status of step (platform, config, step), None when the run has no such step."""
        found = self.steps_by_key().get((platform, config, step))
        return found.status if found else None

    def view(self, run_dir: Path) -> SummaryView:
        """What summary.md shows of this run, read from ``run_dir`` (harness.record.summary_md.render_markdown): the
        verdict it was written with, the notes it does not cover (killed, platforms skipped, what passing steps do not
        prove), the records."""
        n = len(self.skipped_platforms)
        notes = ([KILLED] if self.killed else []) + ([f"{n} platform{'s' if n != 1 else ''} skipped"] if n else []) \
            + unproven_notes(self.steps)
        return SummaryView(self.run_id, self.overall, notes, list(self.steps), list(self.comparisons),
                           list(self.incomplete), dict(self.skipped_platforms), dict(self.cache), RunLayout(run_dir))

    def covered_platforms(self) -> set[str]:
        """Platforms that ran at least one step (a platform whose steps were all skipped does not count)."""
        return {s.platform for s in self.steps if s.status != STEP_SKIPPED}


def _text(value: JSON) -> str:
    return "" if value is None else str(value)


def read_run(run_dir: Path) -> RunSummary:
    """The summary.json of the run in ``run_dir``, typed.

    Raises FileNotFoundError (naming the file) when there is none, and
    harness.record.records.RecordError naming the file when it is not JSON, was written by a newer record
    format, or holds an entry with an undeclared status or without its identity keys.
    """
    steps, comparisons, data = load_records(run_dir)
    try:
        return RunSummary(
            run_id=_text(data.get("run_id")) or run_dir.name, overall=_text(data.get("overall")),
            steps=steps, comparisons=comparisons,
            skipped_platforms={str(k): _text(v) for k, v in (data.get("skipped_platforms") or {}).items()},
            incomplete=[_text(r) for r in data.get("incomplete") or []],
            cache={str(k): dict(v) for k, v in (data.get("cache") or {}).items()},
            interrupted=_text(data.get("interrupted")), updated=_text(data.get("updated")))
    except (AttributeError, TypeError, ValueError) as exc:
        raise RecordError(f"{RunLayout(run_dir).summary_json}: not of a summary's shape ({exc})") from None


def run_dirs_under(root: Path) -> list[Path]:
    """Every run directory at any depth below ``root`` (a folder holding a summary.json), sorted; [] when
    ``root`` is no directory."""
    return sorted(p.parent for p in root.rglob(RunLayout.SUMMARY_NAME)) if root.is_dir() else []


def write_summary_md(run_dir: Path) -> Path:
    """Render the summary.md of the run in ``run_dir`` again from its summary.json (a committed run rendered by
    today's harness) and write it whole; returns its path.  Raises what :func:`read_run` raises, and OSError
    when it cannot be written."""
    path = RunLayout(run_dir).summary_md
    write_text_whole(path, render_markdown(read_run(run_dir).view(run_dir)))
    return path
