"""The llama-quantize that derives the matrix's ``quantized`` models (harness.matrix.models.derive_quantized).

A GGUF file is the same on every platform, so every derived model is made by one program: upstream's
``llama-quantize`` from the **base** build of the host's CPU platform, the first platform of the matrix
with ``gpu: none`` of this machine's OS and architecture whose ``targets`` list ``llama-quantize``
(linux-x86_64-cpu on a Linux x86_64 machine).  A CUDA platform's derived model is made by it too: on a
machine without a GPU the CUDA build cannot run, and on a GPU machine the CPU build makes the same file.
Its content digest (the program and every shared library beside it, with the build's own name zeroed,
harness.record.cache.images_digest) is part of each derived model's key.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

from ...matrix.config import Matrix, Platform
from ...matrix.models import QUANTIZE_TARGET, ModelError, QuantizeTool
from ...kinds.registry import gpu_of, on_host_os
from ...matrix.platforms import host_arch, host_os
from ...record.cache import images_digest
from .binaries import build_labels, shared_libraries


def quantize_platform(platforms: Iterable[Platform]) -> Platform | None:
    """The platform whose base build makes the derived models on this machine, or None (see the module)."""
    for p in platforms:
        if not gpu_of(p).has_device and on_host_os(p, host_os()) and p.arch == host_arch() \
                and QUANTIZE_TARGET in p.targets:
            return p
    return None


def no_quantize_platform() -> ModelError:
    """The error for a matrix without a platform that builds llama-quantize on this machine."""
    return ModelError(f"no platform of the matrix builds {QUANTIZE_TARGET} on this machine: derived (quantized) "
                      f"models need a platform with gpu: none, os: {host_os()}, arch: {host_arch()} whose targets "
                      f"list {QUANTIZE_TARGET}")


def tool_from_build(platform: Platform, bin_dir: Path) -> QuantizeTool:
    """The llama-quantize in ``bin_dir`` (``platform``'s base build) with its content digest; ModelError
    when the program is not there."""
    program = bin_dir / QUANTIZE_TARGET
    if not program.is_file():
        raise ModelError(f"{QUANTIZE_TARGET}: {program} does not exist; the base build of {platform.name} "
                         f"does not build it (is {QUANTIZE_TARGET} in its targets?)")
    images = images_digest([program, *shared_libraries(bin_dir)], build_labels(bin_dir.parent))
    digest = hashlib.sha256(json.dumps(images, sort_keys=True).encode()).hexdigest()
    return QuantizeTool((str(program),), digest, f"{QUANTIZE_TARGET} of {platform.name}'s base build")


def built_tool(matrix: Matrix, work_dir: Path) -> QuantizeTool:
    """The llama-quantize of a finished base build under ``work_dir`` (``<work>/base/build-<platform>``, as
    the build stage leaves it), for commands that build nothing (``models``, ``bisect``); ModelError saying
    which build to make when there is none."""
    p = quantize_platform(matrix.platforms.values())
    if p is None:
        raise no_quantize_platform()
    build_dir = Path(work_dir).resolve() / "base" / f"build-{p.name}"
    try:
        stamp = json.loads((build_dir / "harness-build.json").read_text())
    except (OSError, ValueError):
        stamp = {}
    if QUANTIZE_TARGET not in stamp.get("targets", ()):
        raise ModelError(f"derived models need {QUANTIZE_TARGET} from the base build of {p.name}, and "
                         f"{build_dir} holds no finished build of it; build it first: "
                         f"python -m harness build --platform {p.name} --work-dir {work_dir}")
    return tool_from_build(p, build_dir / "bin")
