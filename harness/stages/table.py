"""Every stage of a run, in the order it runs: the one table the run loop (harness.pipeline) reads.

A command of the command line (``build``, ``test``, ``compare-outputs``) runs its stages of this
table in this order (a stage ``beside`` runs in a thread beside the ones after it in its command).
A new stage is one module that defines its ``STAGE`` (harness.stages.shape.Stage) and one line here;
docs/layout.md shows one worked through.
"""

from __future__ import annotations

from .building import build_stage, compile_stage
from .checks import expectations, reloads
from .outputs import compare_stage, sanitized_generation
from typing import Iterable

from ..record.records import StepRecord
from .shape import COMMANDS, Stage, StepSpec
from .speed import speed
from .native_tests import tests_stage, upstream_suite

#: The stages, in the order they run.
STAGES: tuple[Stage, ...] = (
    compile_stage.STAGE,   # build: the CUDA compile step, beside the builds
    build_stage.STAGE,     # build: base and fork of every platform
    tests_stage.STAGE,     # test: ctest by label
    upstream_suite.STAGE,  # test, with --upstream-tests: upstream's suite on base and fork, test-backend-ops on a GPU
    sanitized_generation.STAGE,  # test, with --sanitize: a short generation of each pin configuration under the tool
    compare_stage.STAGE,   # compare-outputs: the generate steps and greedy comparisons
    sanitized_generation.CRASH_STAGE,  # compare-outputs: a crashed GPU generation once more under memcheck
    expectations.STAGE,    # compare-outputs: placement, pinning, mmap and warnings, from the records
    reloads.STAGE,         # compare-outputs: repeated loads of the pin configurations give back what they took
    speed.STAGE,           # compare-outputs: pp and tg tok/s, judged by the speed rules
)


def stages_of(command: str, table: tuple[Stage, ...] = STAGES) -> tuple[Stage, ...]:
    """The stages of ``command`` in ``table``, in table order; ValueError for a command not in
    harness.stages.shape.COMMANDS."""
    if command not in COMMANDS:
        raise ValueError(f"unknown command {command!r}; known: {', '.join(COMMANDS)}")
    return tuple(s for s in table if s.command == command)


def steps_of_role(role: str, table: tuple[Stage, ...] = STAGES) -> tuple[str, ...]:
    """The step names the stages of ``role`` in ``table`` declare (JUnit's checks file: role ``checks``)."""
    return tuple(step for s in table if s.role == role for step in s.step_names)


def step_spec(step: str, table: tuple[Stage, ...] | None = None) -> StepSpec | None:
    """The declaration of step name ``step`` by the first stage of ``table`` (default :data:`STAGES`) that declares
    it (harness.stages.shape.Stage.spec), None for a step no stage declares (a run of an older harness)."""
    return next((spec for s in (STAGES if table is None else table) if (spec := s.spec(step)) is not None), None)


def undeclared(steps: Iterable[StepRecord], table: tuple[Stage, ...] = STAGES) -> list[str]:
    """``<platform> <step> <config>: <status>`` for each of ``steps`` that no stage of ``table`` declares with its
    status (harness.stages.shape.Stage.declares); [] when the stages recorded only what they declare."""
    return [f"{s.platform} {s.step} {s.config}: {s.status}" for s in steps
            if not any(stage.declares(s.step, s.status) for stage in table)]
