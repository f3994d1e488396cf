"""How a configuration loads its model, read from its arguments and environment: whether llama memory-maps it,
whether the fork pins its expert tensors, and how many times it is loaded, probed and freed again in one
process (harness.stages.checks.reloads).

Below the stages, so that every stage that asks (the comparisons, which start the reloads; the sanitized
generations, which pick the pin configurations; the checks) reads one answer.
"""

from __future__ import annotations

from typing import Sequence

from ..kinds.registry import gpu_of
from .config import Matrix, Platform, RunConfig

#: llama's load modes that read the model instead of memory-mapping it (common/arg.cpp, ``--load-mode``).
_MMAP_OFF_MODES = ("none", "dio")


def arg_value(args: Sequence[str], *names: str) -> str | None:
    """The value after the last of ``names`` in ``args`` (``--flag value`` or ``--flag=value``), or None."""
    value = None
    for i, a in enumerate(args):
        for n in names:
            if a == n and i + 1 < len(args):
                value = args[i + 1]
            elif a.startswith(n + "="):
                value = a[len(n) + 1:]
    return value


def uses_mmap(args: Sequence[str]) -> bool:
    """True when llama memory-maps the model with these arguments: load mode ``auto`` (default), ``mmap``,
    ``mlock`` or ``mmap+mlock``; False for ``--load-mode none`` or ``dio`` (``-lm``; common/arg.cpp at
    the pinned commit, which has no other mmap option)."""
    return arg_value(args, "--load-mode", "-lm") not in _MMAP_OFF_MODES


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
