"""Which configurations load, probe and free their model again in one process (harness.stages.checks.reloads).

Apart from the check, so that the comparisons (harness.stages.outputs.sessions), which ask for the
reloads, import only this.
"""

from __future__ import annotations

from ...kinds.registry import gpu_of
from ...matrix.config import Matrix, Platform, RunConfig
from .expectation_rules import uses_mmap


def pin_configuration(platform: Platform, config: RunConfig) -> bool:
    """True for a configuration whose expert tensors the fork pins: the fork's build on a platform with a GPU,
    ``--cpu-moe``, mmap off (:func:`uses_mmap`), the kind's ``no-pinned`` variable (GGML_CUDA_NO_PINNED:
    harness.kinds.shape.GpuKind.pin_vars) unset."""
    kind = gpu_of(platform)
    return (kind.has_device and config.build == "fork"
            and ("--cpu-moe" in config.args or "-cmoe" in config.args) and not uses_mmap(config.args)
            and kind.pin_vars.get("no-pinned") not in config.env)


def reload_count(matrix: Matrix, platform: Platform, config: RunConfig) -> int:
    """How many times the comparisons load, probe and free the model of ``config`` on ``platform`` in one engine
    process: the configuration's ``reloads`` where it sets one, else ``defaults.reloads.count`` for a
    :func:`pin_configuration` and 0 for any other."""
    if config.reloads is not None:
        return config.reloads
    return matrix.reloads.count if pin_configuration(platform, config) else 0
