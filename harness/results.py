"""Stage 6: the results directory of a run.

Layout (documented in results/README.md)::

    results/<run-id>/
        run.json                      run id, command line, times, platforms
        summary.json  summary.md      every step and every comparison
        <platform>/
            environment.json          OS, compilers, CUDA, GPU, RAM, base commit, patches
            build-base/ build-fork/   configure.log, build.log (+ .rc files)
            tests/                    ctest.log, junit.xml
            <config>/                 config.json, gen/<model>/<prompt>.r<k>.{stdout,stderr,cmd}, compare.json
    results/latest -> <run-id>

No run overwrites another: run ids are UTC timestamps plus a random suffix and
the directory is created exclusively.  The summary is rewritten after every
step, so a run that dies keeps everything it collected.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
from dataclasses import asdict, dataclass, field, is_dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from .fs import writable_dir
from .locks import RunLock

#: ``interrupted``: the step was running when the run was stopped (a signal, an exception, a full disk).
STEP_STATUSES = ("passed", "failed", "skipped", "error", "interrupted")
COMPARISON_STATUSES = ("identical", "diverged", "crashed", "timeout")


@dataclass
class StepRecord:
    """One step of one configuration: ``status`` is passed, failed, skipped, error or interrupted."""

    platform: str
    config: str
    step: str
    status: str
    seconds: float = 0.0
    detail: str = ""
    log: str = ""

    def __post_init__(self) -> None:
        if self.status not in STEP_STATUSES:
            raise ValueError(f"step status {self.status!r} not in {STEP_STATUSES}")


@dataclass
class ComparisonRecord:
    """One prompt of one comparison group: ``status`` is identical, diverged, crashed or timeout.

    ``first_divergence`` is None or {index, reference: {id, piece}, candidate: {id, piece}}
    where index counts generated tokens from 0.
    """

    platform: str
    group: str
    model: str
    prompt: str
    reference: str
    candidate: str
    status: str
    first_divergence: dict | None = None
    detail: str = ""
    nondeterministic: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.status not in COMPARISON_STATUSES:
            raise ValueError(f"comparison status {self.status!r} not in {COMPARISON_STATUSES}")


def _jsonable(obj: Any) -> Any:
    if is_dataclass(obj) and not isinstance(obj, type):
        return {k: _jsonable(v) for k, v in asdict(obj).items()}
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, bytes):
        return obj.decode("utf-8", errors="replace")
    return obj


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` (dataclasses, paths and bytes allowed) as indented UTF-8 JSON, atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_jsonable(data), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(path)


def new_run_id(now: datetime | None = None) -> str:
    """A fresh run id: UTC time to the second plus 4 random hex digits, e.g. 20261130T120501Z-3fa2."""
    now = now or datetime.now(timezone.utc)
    return now.strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(2)


class Run:
    """An open results directory; records steps and comparisons and keeps the summary current."""

    def __init__(self, root: Path, run_id: str, *, create: bool = True, argv: Iterable[str] = ()):
        self.root = root
        self.id = run_id
        self.dir = root / run_id
        self.steps: list[StepRecord] = []
        self.comparisons: list[ComparisonRecord] = []
        self.skipped_platforms: dict[str, str] = {}
        self.incomplete: list[str] = []
        self._lock: RunLock | None = None
        now = datetime.now(timezone.utc).isoformat()
        if create:
            writable_dir(root, "results directory")
        if create and not self.dir.exists():
            self.dir.mkdir(parents=True, exist_ok=False)
            self._own()
            write_json(self.dir / "run.json", {"run_id": run_id, "started": now,
                                               "commands": [{"argv": list(argv), "started": now}]})
            self._point_latest()
        elif self.dir.exists():
            if create:
                self._own()
            if (self.dir / "summary.json").exists():
                self._load()
            if create and (self.dir / "run.json").exists():
                # a later stage continues the run (HARNESS_RUN_ID or --run-id): record its command too
                info = json.loads((self.dir / "run.json").read_text(encoding="utf-8"))
                info.setdefault("commands", []).append({"argv": list(argv), "started": now})
                write_json(self.dir / "run.json", info)

    def _own(self) -> None:
        """Hold the run directory for this process (harness.locks.RunLock); raises RunInUse when taken."""
        self._lock = RunLock(self.dir)
        self._lock.acquire()

    def close(self) -> None:
        """Give the run directory up (a later process may continue the run)."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    @classmethod
    def open(cls, root: Path, run_id: str | None = None, argv: Iterable[str] = ()) -> "Run":
        """Open run ``run_id`` under ``root`` (continuing it if it exists) or start a new one.

        Several stages of one invocation (``nox -s build test compare-outputs``)
        share a run through the HARNESS_RUN_ID environment variable, one
        process after the other: a run held by a live process is refused
        (RunInUse).  Raises EnvironmentProblem when ``root`` cannot hold runs.
        """
        run_id = run_id or os.environ.get("HARNESS_RUN_ID") or new_run_id()
        return cls(root, run_id, argv=argv)

    def _point_latest(self) -> None:
        link = self.root / "latest"
        tmp = self.root / f".latest-{self.id}"
        try:
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(self.id, target_is_directory=True)
            tmp.replace(link)
        except OSError:
            (self.root / "LATEST").write_text(self.id + "\n")

    def _load(self) -> None:
        data = json.loads((self.dir / "summary.json").read_text(encoding="utf-8"))
        self.steps = [StepRecord(**s) for s in data.get("configurations", [])]
        self.comparisons = [ComparisonRecord(**c) for c in data.get("comparisons", [])]
        self.skipped_platforms = dict(data.get("skipped_platforms", {}))
        self.incomplete = list(data.get("incomplete", []))

    def platform_dir(self, platform: str) -> Path:
        """``results/<run-id>/<platform>/`` (created)."""
        path = self.dir / platform
        path.mkdir(parents=True, exist_ok=True)
        return path

    def record_step(self, step: StepRecord) -> None:
        """Add or replace (same platform, config, step) a step record and rewrite the summary."""
        key = (step.platform, step.config, step.step)
        for i, s in enumerate(self.steps):
            if (s.platform, s.config, s.step) == key:
                self.steps[i] = step  # keep the table's order stable
                break
        else:
            self.steps.append(step)
        self.write_summary()

    def step(self, platform: str, config: str, step: str) -> StepRecord | None:
        """The recorded step (platform, config, step), or None."""
        for s in self.steps:
            if (s.platform, s.config, s.step) == (platform, config, step):
                return s
        return None

    def record_comparisons(self, records: Iterable[ComparisonRecord]) -> None:
        """Add comparison records (replacing same platform/group/model/prompt/candidate) and rewrite the summary."""
        new = list(records)
        keys = {(r.platform, r.group, r.model, r.prompt, r.candidate) for r in new}
        self.comparisons = [c for c in self.comparisons
                            if (c.platform, c.group, c.model, c.prompt, c.candidate) not in keys] + new
        self.write_summary()

    def mark_incomplete(self, reason: str) -> None:
        """Record that something the user asked for did not run (e.g. an explicitly selected platform was skipped)."""
        if reason not in self.incomplete:
            self.incomplete.append(reason)
        self.write_summary()

    def overall(self) -> str:
        """The run's verdict.

        ``failed`` when a step failed or errored or a comparison is not
        identical; else ``incomplete`` when something explicitly asked for did
        not run; else ``skipped`` when nothing ran at all; else ``passed``.
        Only ``passed`` is a success.
        """
        if any(s.status in ("failed", "error") for s in self.steps) or \
                any(c.status != "identical" for c in self.comparisons):
            return "failed"
        if self.incomplete or any(s.status == "interrupted" for s in self.steps):
            return "incomplete"
        if not any(s.status == "passed" for s in self.steps) and not self.comparisons:
            return "skipped"
        return "passed"

    def write_summary(self) -> None:
        """Write summary.json and summary.md for everything recorded so far."""
        data = {"run_id": self.id, "updated": datetime.now(timezone.utc).isoformat(),
                "overall": self.overall(), "configurations": self.steps, "comparisons": self.comparisons,
                "skipped_platforms": self.skipped_platforms, "incomplete": self.incomplete}
        try:
            write_json(self.dir / "summary.json", data)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            _overwrite_in_place(self.dir / "summary.json", data)
            raise
        (self.dir / "summary.md").write_text(render_markdown(self), encoding="utf-8")


def _overwrite_in_place(path: Path, data: Any) -> None:
    """On a full disk, rewrite ``path`` in its own blocks as compact JSON (smaller than the indented
    file it replaces), so the summary on disk still tells what happened; best effort, never raises."""
    path.with_name(path.name + ".tmp").unlink(missing_ok=True)
    try:
        with open(path, "r+b") as fh:
            fh.write(json.dumps(_jsonable(data), ensure_ascii=False, separators=(",", ":")).encode() + b"\n")
            fh.truncate()
    except OSError:
        pass


_ICON = {"incomplete": "⚠️ incomplete", "interrupted": "⏹️ interrupted", "passed": "✅ passed", "failed": "❌ failed", "error": "💥 error", "skipped": "⏭️ skipped",
         "identical": "✅ identical", "diverged": "❌ diverged", "crashed": "💥 crashed", "timeout": "⏱️ timeout"}


#: Longest text a summary table cell shows; the full text stays in summary.json and the logs.
CELL_MAX = 300


def _cell(text: str) -> str:
    text = " ".join(text.split())
    if len(text) > CELL_MAX:
        text = text[:CELL_MAX - 1] + "…"
    return text.replace("|", "\\|")


def render_markdown(run: Run) -> str:
    """The run summary as Markdown: overall verdict, a steps table and a comparisons table."""
    lines = [f"# Run {run.id}: {_ICON.get(run.overall(), run.overall())}", ""]
    if run.incomplete:
        lines += ["Did not run although asked for:", ""] + [f"- {_cell(r)}" for r in run.incomplete] + [""]
    if run.skipped_platforms:
        lines += ["| platform | skipped because |", "|---|---|"]
        lines += [f"| {p} | {_cell(r)} |" for p, r in sorted(run.skipped_platforms.items())]
        lines.append("")
    if run.steps:
        lines += ["## Steps", "", "| platform | config | step | status | time | detail |", "|---|---|---|---|---:|---|"]
        for s in run.steps:
            lines.append(f"| {s.platform} | {s.config} | {s.step} | {_ICON.get(s.status, s.status)} "
                         f"| {s.seconds:.1f} s | {_cell(s.detail)} |")
        lines.append("")
    if run.comparisons:
        counts: dict[str, int] = {}
        for c in run.comparisons:
            counts[c.status] = counts.get(c.status, 0) + 1
        lines += ["## Greedy comparisons", "",
                  ", ".join(f"{n} {k}" for k, n in sorted(counts.items())), "",
                  "| platform | group | model | prompt | reference | candidate | status | first divergent token |",
                  "|---|---|---|---|---|---|---|---|"]
        for c in run.comparisons:
            div = ""
            if c.first_divergence:
                d = c.first_divergence
                ref = d.get("reference") or {}
                cand = d.get("candidate") or {}
                div = (f"#{d.get('index')}: {ref.get('piece')!r} vs {cand.get('piece')!r}")
            elif c.status != "identical":
                div = c.detail
            if c.nondeterministic:
                div += f" (nondeterministic: {', '.join(c.nondeterministic)})"
            lines.append(f"| {c.platform} | {c.group} | {c.model} | {c.prompt} | {c.reference} | {c.candidate} "
                         f"| {_ICON.get(c.status, c.status)} | {_cell(div)} |")
        lines.append("")
    return "\n".join(lines)

