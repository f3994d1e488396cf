"""A run file read for a view that leaves a blank where the file is gone: summary.md's review table
(review.py) and the llama-bench rows (llama_bench.py).  A reader that must say why a file cannot be read
uses harness.record.json_files.read_record_json instead."""

from __future__ import annotations

import json
from pathlib import Path
from ..common.json_value import JSON


def read_json_or_none(path: Path) -> JSON:
    """The JSON value in the file at ``path`` (UTF-8), or None when it is missing, unreadable or not JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
