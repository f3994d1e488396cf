"""The ``build`` step: every variant a selected platform needs (the fork always, the base where a comparison
uses it), configured and built with CMake and Ninja (harness.stages.building.build), then the platform's
``environment.json``.  A platform this machine cannot build is recorded as skipped with the reason; a
CUDA platform without a GPU is compiled instead, by the compile stage beside this one."""

from __future__ import annotations

from ...common.statuses import STEP_ERROR, STEP_FAILED, STEP_PASSED, STEP_SKIPPED
from ..shape import Context, Stage, StepSpec


def run_build(ctx: Context) -> None:
    """Build every needed variant of every platform :meth:`Context.platforms` selects for ``build``; each build
    records its ``build`` step (harness.stages.building.builds.Builds.build_variant)."""
    for p in ctx.platforms("build"):
        for variant in ctx.builds.variants_for(p):
            ctx.builds.build_variant(p, variant)
        ctx.builds.write_environment(p)


STAGE = Stage("build", command="build", role="building", reads=("matrix", "source"),
              writes=("builds", "steps", "files"),
              steps=(StepSpec("build", (STEP_PASSED, STEP_FAILED, STEP_ERROR, STEP_SKIPPED), "build-logs", timed=True),), run=run_build)
