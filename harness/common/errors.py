"""The harness's exceptions and exit codes, declared in one place.

Every error the harness expects (bad input, a machine that lacks a tool) derives
from :class:`HarnessError` and carries the exit code of its kind; the command line
(harness.cli.main) prints ``error: <message>`` for them, without a traceback, and
exits with that code.  Anything else is a bug and keeps its traceback.

Exit codes of ``python -m harness`` (and of nox, see noxfile.py):

====  =========================================================================
0     passed: everything asked for ran, nothing failed (triage: no regression)
1     failed: a step failed or errored, a comparison is a failure (triage: a regression)
2     bad input or environment: matrix, patch series, command-line names, run ids, models;
      a tool, header or writable directory this machine lacks (the message names it); refused
      before anything runs, or after the build and before any generation for what needs the
      build (harness.stages.building.preflight)
3     incomplete: nothing failed, but something asked for did not run (or nothing ran; triage: run B
      was killed mid-way, harness.triage.triage)
130   interrupted (Ctrl-C, SIGINT); 143: terminated (SIGTERM) — 128 + the signal, harness.common.proc
====  =========================================================================
"""

from __future__ import annotations

EXIT_PASSED = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INCOMPLETE = 3
EXIT_ENVIRONMENT = 2  # told apart from bad input by the message, not the code
EXIT_INTERRUPTED = 130


class HarnessError(Exception):
    """An expected error: the message says what is wrong and how to fix it; ``exit_code`` its kind."""

    exit_code = EXIT_BAD_INPUT


class InputError(HarnessError):
    """Bad input: a file, key, name or argument the user gave (exit code 2)."""

    exit_code = EXIT_BAD_INPUT


class EnvironmentProblem(HarnessError):
    """This machine lacks a tool, package or writable path the command needs (exit code 2)."""

    exit_code = EXIT_ENVIRONMENT
