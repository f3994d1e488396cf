"""An upstream forecast's record, ``forecast.json`` (harness.record.layout.RunLayout.forecast_json), typed: written by
harness.upstream.forecast, read by its ``forecast.md`` and by the report's forecast section (harness.views.report).

It holds where the series was moved (``onto``, ``old_base``: spec, commit, source), the one-line ``verdict``, what
needs work and which outputs change, one :class:`PatchOutcome` per patch of the series (with its
:class:`HunkConflict` s), one :class:`ForecastStage` per step of the forecast's run with its signature
(harness.triage.signatures), the ``first_failure``, upstream's own comparisons (old base against new base), what
did not run and the times.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from .json_files import read_record_json
from .records import RecordError
from ..common.statuses import IDENTICAL, PATCH


@dataclass
class HunkConflict:
    """One place where a patch met upstream code it cannot be merged with.

    ``file``: path in the tree; ``hunk``: the patch's ``@@`` header (old-base line numbers);
    ``wanted``: the lines the patch's hunk writes there (context and ``+`` lines);
    ``upstream_line``: 1-based line of the new base's file where the met lines start (0 when
    the file is not in the new base); ``upstream``: those lines (at most MET_MAX_LINES, then a
    count); ``reason``: what git said when it could not merge the file at all, else '';
    ``renamed_from``: the path the patch names, where upstream renamed that file to ``file``, else ''.
    """

    file: str
    hunk: str
    wanted: list[str]
    upstream_line: int
    upstream: list[str]
    reason: str = ""
    renamed_from: str = ""

    def place(self) -> str:
        """``file`` and, where upstream renamed it, the patch's name for it: ``new (renamed from old)``."""
        return f"{self.file} (renamed from {self.renamed_from})" if self.renamed_from else self.file

    def to_json(self) -> dict[str, Any]:
        """The conflict as forecast.json holds it: ``renamed_from`` only where upstream renamed the file, so a
        record written before the field existed is written back as it was read."""
        out = asdict(self)
        if not self.renamed_from:
            del out["renamed_from"]
        return out


@dataclass
class PatchOutcome:
    """What one patch did on the new base.

    ``index``: 1-based position in the series; ``status``: one of harness.common.statuses.PATCH;
    ``files``: the paths it changes; ``detail``: one line for people; ``conflicts``: for
    ``conflict``, where and what it met; ``applied_without``: for a patch that applied, the
    earlier patches of the series that were left out before it; ``commit``: the commit it made
    in the trial repository ('' when none); ``seconds``: wall time of its git calls.
    """

    index: int
    name: str
    subject: str
    status: str
    files: list[str]
    detail: str
    conflicts: list[HunkConflict] = field(default_factory=list)
    applied_without: list[str] = field(default_factory=list)
    commit: str = ""
    seconds: float = 0.0

    def __post_init__(self) -> None:
        PATCH.check(self.status)

    @property
    def applied(self) -> bool:
        """True when the patch made a commit (clean or 3-way)."""
        return bool(self.commit)


@dataclass(frozen=True)
class ForecastStage:
    """One step of the forecast's run: its identity, ``status`` (harness.common.statuses.STEP), ``seconds``,
    ``detail`` and ``signature`` (a signature of harness.triage.signatures as JSON; None when it did not fail).
    The ``first_failure`` of a record has no status or seconds ("" and 0)."""

    platform: str
    config: str
    step: str
    status: str = ""
    seconds: float = 0.0
    detail: str = ""
    signature: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class UpstreamComparison:
    """One comparison of upstream's old base against its new base: identity, ``status``
    (harness.common.statuses.COMPARISON) and the ``difference`` for people."""

    platform: str
    group: str
    model: str
    prompt: str
    status: str
    difference: str = ""


@dataclass(frozen=True)
class ForecastRecord:
    """A forecast.json (see the module): ``onto`` and ``old_base`` map spec, commit and source; ``needs_work``
    holds {patch or step, why}; ``output_changes`` the fork's failed comparisons outside upstream's groups
    ({platform, group, model, prompt, candidate, reference, difference}); ``seconds`` the times per phase;
    ``applied_series`` the names of the patches the forecast's fork was built from (those that applied)."""

    onto: Mapping[str, str]
    old_base: Mapping[str, str]
    written: str
    verdict: str
    needs_work: tuple[Mapping[str, str], ...] = ()
    output_changes: tuple[Mapping[str, Any], ...] = ()
    upstream_comparisons: tuple[UpstreamComparison, ...] = ()
    patches: tuple[PatchOutcome, ...] = ()
    stages: tuple[ForecastStage, ...] = ()
    first_failure: ForecastStage | None = None
    incomplete: tuple[str, ...] = ()
    not_built: tuple[str, ...] = ()
    seconds: Mapping[str, float] = field(default_factory=dict)
    applied_series: tuple[str, ...] = ()
    bisect: Mapping[str, Any] | None = None

    @property
    def upstream_output_changes(self) -> tuple[UpstreamComparison, ...]:
        """Upstream's comparisons that are not identical."""
        return tuple(u for u in self.upstream_comparisons if u.status != IDENTICAL)

    def to_json(self) -> dict[str, Any]:
        """The record as forecast.json holds it (what :meth:`from_json` reads back): upstream's changed comparisons
        written out beside all of them, the first failure without a status or seconds, ``bisect`` only where one
        ran."""
        def stage(s: ForecastStage, timed: bool = True) -> dict[str, Any]:
            head = {"platform": s.platform, "config": s.config, "step": s.step}
            timing = {"status": s.status, "seconds": s.seconds} if timed else {}
            return {**head, **timing, "detail": s.detail, "signature": s.signature}

        out: dict[str, Any] = {
            "onto": dict(self.onto), "old_base": dict(self.old_base), "written": self.written, "verdict": self.verdict,
            "needs_work": [dict(w) for w in self.needs_work], "output_changes": [dict(c) for c in self.output_changes],
            "upstream_output_changes": [asdict(u) for u in self.upstream_output_changes],
            "upstream_comparisons": [asdict(u) for u in self.upstream_comparisons],
            "patches": [{**asdict(p), "conflicts": [c.to_json() for c in p.conflicts]} for p in self.patches], "stages": [stage(s) for s in self.stages],
            "first_failure": stage(self.first_failure, timed=False) if self.first_failure else None,
            "incomplete": list(self.incomplete), "seconds": dict(self.seconds),
            "applied_series": list(self.applied_series), "not_built": list(self.not_built)}
        if self.bisect is not None:
            out["bisect"] = self.bisect
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ForecastRecord":
        """The record from its JSON object; raises ValueError (KeyError, TypeError, AttributeError included) naming
        what is not of the shape above."""
        try:
            def stage(s: Mapping[str, Any]) -> ForecastStage:
                known = {f.name for f in fields(ForecastStage)}
                return ForecastStage(**{k: v for k, v in s.items() if k in known})

            def outcome(p: Mapping[str, Any]) -> PatchOutcome:
                known = {f.name for f in fields(PatchOutcome)}
                values = {k: v for k, v in p.items() if k in known}
                values["conflicts"] = [HunkConflict(**c) for c in p.get("conflicts", [])]
                return PatchOutcome(**values)

            first = data.get("first_failure")
            return cls(
                onto={str(k): str(v) for k, v in data["onto"].items()},
                old_base={str(k): str(v) for k, v in data["old_base"].items()},
                written=str(data.get("written", "")), verdict=str(data["verdict"]),
                needs_work=tuple(dict(w) for w in data.get("needs_work", [])),
                output_changes=tuple(dict(c) for c in data.get("output_changes", [])),
                upstream_comparisons=tuple(UpstreamComparison(**u) for u in data.get("upstream_comparisons", [])),
                patches=tuple(outcome(p) for p in data.get("patches", [])),
                stages=tuple(stage(s) for s in data.get("stages", [])),
                first_failure=stage(first) if first else None,
                incomplete=tuple(str(i) for i in data.get("incomplete", [])),
                not_built=tuple(str(i) for i in data.get("not_built") or []),
                seconds=dict(data.get("seconds") or {}),
                applied_series=tuple(str(p) for p in data.get("applied_series") or []),
                bisect=data.get("bisect") or None)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a forecast record ({type(exc).__name__}: {exc})") from None


def read_forecast(path: Path) -> ForecastRecord:
    """The forecast record at ``path``.  Raises FileNotFoundError naming the file when there is none (the run is no
    forecast), harness.record.records.RecordError naming it when it is not JSON or not of a forecast's shape."""
    data = read_record_json(path, "no forecast.json; the run is not a forecast")
    if not isinstance(data, Mapping):
        raise RecordError(f"{path}: not a forecast record")
    try:
        return ForecastRecord.from_json(data)
    except ValueError as exc:
        raise RecordError(f"{path}: {exc}") from None
