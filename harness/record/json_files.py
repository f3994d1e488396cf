"""The run's JSON files read and written: summary.json read back (:func:`read_summary`, :func:`load_records`,
with the steps of a harness process that died settled as interrupted), a run file's JSON for the typed readers
(:func:`read_record_json`) and any record written atomically (:func:`write_json`).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any, Mapping

from ..common.fs import write_text_whole
from ..common.locks import RunLock
from ..common.statuses import KILLED, STEP, STEP_INTERRUPTED, STEP_PASSED, VERDICT_FAILED, VERDICT_INCOMPLETE
from .records import RECORD_VERSION, RecordError, StepRecord, ComparisonRecord
from .layout import RunLayout
from ..common.json_value import JSON

def read_record_json(path: Path, missing: str) -> JSON:
    """The parsed JSON of the run file at ``path``, for the typed readers of harness.record.  Raises
    FileNotFoundError naming the file followed by ``missing`` (why a run may have none) when there is none, and
    :class:`RecordError` naming it when it cannot be read or is not JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: {missing}") from None
    except (OSError, ValueError) as exc:
        raise RecordError(f"{path}: cannot be read as JSON ({exc})", f"cannot be read ({exc})") from None


def read_summary(run_dir: Path) -> dict:
    """The parsed summary.json of ``run_dir``.

    Raises FileNotFoundError (naming the file) when there is none and :class:`RecordError`
    when it is not JSON or was written by a newer record format than :data:`RECORD_VERSION`.
    """
    path = RunLayout(run_dir).summary_json
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no summary.json; is {run_dir} a results run directory?") from None
    except ValueError as exc:
        raise RecordError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise RecordError(f"{path}: not a summary object")
    version = data.get("record_version", 1)
    if not isinstance(version, int) or version > RECORD_VERSION:
        raise RecordError(f"{path}: record format {version!r} is newer than this harness reads ({RECORD_VERSION}); "
                          "update the harness")
    try:
        return settle_dead_progress(data, run_dir)
    except (TypeError, ValueError, KeyError) as exc:
        raise RecordError(f"{path}: its in_progress record cannot be read ({exc})") from None


def progress_alive(progress: Mapping[str, Any], run_dir: Path) -> bool:
    """Whether the harness process that wrote ``progress`` (a summary's ``in_progress``) still runs the run
    ``run_dir``: it is this process, or it is the run's live owner (``.owner``, harness.common.locks.RunLock).
    A pid of the record that is dead, or that no longer owns the run, is a process that died mid-way."""
    pid = progress.get("pid")
    return pid == os.getpid() or (pid is not None and RunLock.live_owner(run_dir) == pid)


def settle_dead_progress(data: dict, run_dir: Path) -> dict:
    """``data`` (a parsed summary.json of ``run_dir``) as it reads once its harness process is known to be dead.

    A summary whose ``in_progress`` names a process that no longer runs the run
    (:func:`progress_alive`) was left by a harness killed mid-way (SIGKILL, a crash, the machine
    stopped): its steps in progress become ``interrupted``, its command and the stages it had not
    reached are listed in ``incomplete`` as :data:`KILLED`, ``in_progress`` is dropped and the
    verdict is computed again (``failed`` when a failure was recorded before, else ``incomplete``).
    Any other summary is returned as it is.  Raises KeyError, TypeError or ValueError for a
    malformed ``in_progress``.
    """
    progress = data.get("in_progress")
    if not progress or progress_alive(progress, run_dir):
        return data
    why = f"{KILLED} (harness process {progress['pid']} ended before its command did)"
    steps = [StepRecord.from_json(s) for s in data.get("configurations", [])]
    by_key = {(s.platform, s.config, s.step): i for i, s in enumerate(steps)}
    incomplete = list(data.get("incomplete", []))
    for platform, config, step, recheck in progress.get("doing", []):
        steps_at = by_key.get((platform, config, step))
        if recheck and steps_at is not None and steps[steps_at].status == STEP_PASSED:
            continue  # a build found up to date again: its record stands (harness.record.progress.Doing)
        record = StepRecord(platform, config, step, STEP_INTERRUPTED, 0.0, f"{why}; did not finish")
        if steps_at is None:
            steps.append(record)
        else:
            steps[steps_at] = record
        incomplete.append(f"{platform}: {step} {config}: {KILLED}; did not finish")
    incomplete.append(f"{progress.get('command', '?')}: {why}; did not finish")
    incomplete += [f"{stage}: not run ({KILLED})" for stage in progress.get("to_run", [])]
    comparisons = [ComparisonRecord.from_json(c) for c in data.get("comparisons", [])]
    failed = any(STEP.is_failure(s.status) for s in steps) or any(c.failed() for c in comparisons)
    out = {k: v for k, v in data.items() if k != "in_progress"}
    out.update(configurations=[judged_json(s) for s in steps], incomplete=incomplete, interrupted="killed",
               overall=VERDICT_FAILED if failed else VERDICT_INCOMPLETE)
    return out


def load_records(run_dir: Path) -> tuple[list[StepRecord], list[ComparisonRecord], dict]:
    """The step and comparison records of ``run_dir`` (any record format) and the raw summary.

    Raises what :func:`read_summary` raises, and RecordError naming the file for an entry
    with an undeclared status.
    """
    data = read_summary(run_dir)
    try:
        steps = [StepRecord.from_json(s) for s in data.get("configurations", [])]
        comparisons = [ComparisonRecord.from_json(c) for c in data.get("comparisons", [])]
    except ValueError as exc:
        raise RecordError(f"{RunLayout(run_dir).summary_json}: {exc}") from None
    return steps, comparisons, data


def jsonable(obj: object) -> JSON:
    """``obj`` as JSON holds it: dataclasses and dicts as objects (keys as strings), lists and tuples as arrays,
    paths as strings, bytes decoded as UTF-8 (undecodable bytes replaced); anything else as it is."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return {k: jsonable(v) for k, v in asdict(obj).items()}
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, bytes):
        return obj.decode("utf-8", errors="replace")
    return obj


def judged_json(record: StepRecord | ComparisonRecord) -> dict:
    """A step or comparison record as summary.json holds it: its fields, and beside its status its ``verdict``
    (passes, fails, not run) and ``why`` (harness.record.verdict), for readers of the JSON; this harness's
    readers judge the record again from its status and drop the two keys."""
    v = record.verdict()
    return {**jsonable(record), "verdict": v.verdict, "why": v.why}


def write_json(path: Path, data: object) -> None:
    """Write ``data`` (dataclasses, paths and bytes allowed) as indented UTF-8 JSON, atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_whole(path, json.dumps(jsonable(data), indent=2, ensure_ascii=False) + "\n")
