"""The speed stage's records: step names of speed rules and ``<platform>/speed/bench.json``.

harness.stages.speed writes them; the summary's readers (JUnit, signatures, report, triage) read
them through this module, so none of them needs the stage itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .results import RunLayout

#: Step names of the speed rules start with this: ``speed:<group>:<metric>``, config = the candidate.
STEP_PREFIX = "speed:"
#: The metrics a rule can judge: prompt processing and generation, both in tok/s.
METRICS = ("pp", "tg")


def step_name(group: str, metric: str) -> str:
    """The step of a speed rule: ``speed:<group>:<metric>``."""
    return f"{STEP_PREFIX}{group}:{metric}"


def parse_step(step: str) -> tuple[str, str] | None:
    """(group, metric) of a speed rule's step name, None for any other step."""
    if not step.startswith(STEP_PREFIX):
        return None
    group, _, metric = step[len(STEP_PREFIX):].rpartition(":")
    return (group, metric) if group and metric in METRICS else None


def bench_json(run_dir: Path, platform: str) -> Path:
    """``<platform>/speed/bench.json`` of the run in ``run_dir``."""
    return RunLayout(run_dir).speed(platform) / "bench.json"


def read_bench(run_dir: Path, platform: str) -> dict[str, Any] | None:
    """The parsed bench.json of ``platform`` in a run, or None when it has none or it cannot be read."""
    try:
        data = json.loads(bench_json(run_dir, platform).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def bench_platforms(run_dir: Path) -> list[str]:
    """The platforms of a run that have a bench.json, sorted."""
    return sorted(d.parent.parent.name for d in run_dir.glob("*/speed/bench.json"))
