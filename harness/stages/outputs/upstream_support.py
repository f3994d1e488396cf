"""Whether a fork failure is a mode that upstream itself cannot run.

A comparison against upstream's build in the same mode (same arguments, e.g.
``-sm row`` with ``--cpu-moe`` on two GPUs) can fail on both sides.  When every
run of upstream's build and every run of the fork's build failed, and both
failed the same way (the same error line once log prefixes and addresses are
taken out), the mode is unsupported upstream: the fork did not break it.  When
only the fork fails, or the two fail differently, the comparison stays a
failure with its own signature.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .compare import GenerationResult

#: llama.cpp's log prefix with timestamps (``0.03.664.896 E ``), pointers and hex ids vary between runs.
_VARYING = [(re.compile(r"^\d+\.\d+\.\d+\.\d+ [A-Z] "), ""), (re.compile(r"0x[0-9a-fA-F]+"), "0x?")]


def normalized_error(run: GenerationResult) -> str:
    """The run's failure as a comparable string: status, signal or exit code, and the error line without variable parts."""
    line = run.error_line or ""
    for pattern, repl in _VARYING:
        line = pattern.sub(repl, line)
    cause = run.signal or f"exit {run.returncode}"
    return f"{run.status} {cause}: {line.strip()}"


def unsupported_upstream(upstream_runs: Sequence[GenerationResult],
                         fork_runs: Sequence[GenerationResult]) -> str | None:
    """The reason a mode counts as unsupported upstream, or None when it does not.

    Takes upstream's runs (the reference, build ``base``) and the fork's runs
    of one prompt.  Returns a one-line detail naming the shared failure when
    every run on both sides failed (crashed or timed out) the same way, by
    :func:`normalized_error`; else None.
    """
    runs = [*upstream_runs, *fork_runs]
    if not upstream_runs or not fork_runs or any(r.status == "ok" for r in runs):
        return None
    failures = {normalized_error(r) for r in runs}
    if len(failures) != 1:
        return None
    return f"upstream's build fails the same way in this mode: {failures.pop()}"
