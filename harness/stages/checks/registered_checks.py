"""The checks every compare-outputs stage runs after a platform's comparisons, in order.

Each is a harness.stages.checks.checks.Check; a new check is one entry in :data:`CHECKS` and its
step name in :data:`STEP_NAMES` (JUnit writes those steps as ``checks-<platform>.xml``).
"""

from __future__ import annotations

from . import expectations
from .checks import Check

#: The checks, in the order they run.
CHECKS: tuple[Check, ...] = (expectations.check,)

#: The step names they record.
STEP_NAMES: tuple[str, ...] = (expectations.STEP_NAME,)
