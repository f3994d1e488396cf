"""Run ids (``20261130T120501Z-3fa2``); standard library only, so that noxfile.py can make one in any Python."""

from __future__ import annotations

import secrets
from datetime import datetime, timezone


def new_run_id(now: datetime | None = None) -> str:
    """A fresh run id: UTC time to the second plus 4 random hex digits, e.g. 20261130T120501Z-3fa2."""
    now = now or datetime.now(timezone.utc)
    return now.strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(2)
