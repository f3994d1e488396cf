"""The CUDA headers a platform without a GPU compiles against: the host code of the pin ladder
(test-cuda-pin-ladder-host) and the Windows check (harness.tools.windows_check) need
``cuda_runtime_api.h`` and ``crt/host_defines.h``, nothing of the CUDA runtime's code.

Searched in this order, first found wins: an explicit directory (``--cuda-include``); the PyPI wheels
``nvidia-cuda-runtime`` and ``nvidia-cuda-crt`` (pinned in requirements.txt) installed in this Python
environment; ``$CUDA_PATH/include``; ``/usr/local/cuda/include``.
"""

from __future__ import annotations

import importlib.metadata
import os
from dataclasses import dataclass
from pathlib import Path

from ...common.errors import HarnessError

#: PyPI wheels that together hold the CUDA runtime headers (``nvidia/cu13/include``).
CUDA_WHEELS = ("nvidia-cuda-runtime", "nvidia-cuda-crt")


@dataclass(frozen=True)
class CudaHeaders:
    """A CUDA include directory and where it came from (for the log)."""

    include: Path
    source: str


class SetupError(HarnessError):
    """What a check needs is missing: a compiler, the CUDA headers or a checked file (harness.tools.windows_check
    raises it for each; :func:`find_cuda_headers` for the headers)."""


def _cuda_include_problem(include: Path) -> str | None:
    for rel in ("cuda_runtime_api.h", "crt/host_defines.h"):
        if not (include / rel).is_file():
            return f"{include / rel} not found"
    return None


def _wheel_include() -> tuple[Path | None, str]:
    """The include directory of the CUDA_WHEELS installed in this environment, and a description."""
    try:
        dist = importlib.metadata.distribution(CUDA_WHEELS[0])
    except importlib.metadata.PackageNotFoundError:
        return None, f"PyPI wheel {CUDA_WHEELS[0]} not installed (pip install -r requirements.txt)"
    for f in dist.files or ():
        if f.name == "cuda_runtime_api.h":
            include = Path(str(dist.locate_file(f))).parent
            versions = []
            for name in CUDA_WHEELS:
                try:
                    versions.append(f"{name} {importlib.metadata.version(name)}")
                except importlib.metadata.PackageNotFoundError:
                    versions.append(f"{name} not installed")
            return include, "PyPI wheels " + ", ".join(versions)
    return None, f"PyPI wheel {CUDA_WHEELS[0]} {dist.version} has no cuda_runtime_api.h"


def find_cuda_headers(explicit: Path | None = None) -> CudaHeaders:
    """The CUDA include directory, searched in the order of the module docstring.

    Returns the first directory that holds ``cuda_runtime_api.h`` and
    ``crt/host_defines.h``.  Raises SetupError listing why each place was
    passed over.  An ``explicit`` directory is the only one tried.
    """
    candidates: list[tuple[Path | None, str]] = []
    if explicit is not None:
        candidates.append((explicit, "--cuda-include"))
    else:
        candidates.append(_wheel_include())
        if os.environ.get("CUDA_PATH"):
            candidates.append((Path(os.environ["CUDA_PATH"]) / "include", "$CUDA_PATH"))
        candidates.append((Path("/usr/local/cuda/include"), "/usr/local/cuda"))
    reasons = []
    for include, source in candidates:
        if include is None:
            reasons.append(source)
            continue
        problem = _cuda_include_problem(include)
        if problem is None:
            return CudaHeaders(include.resolve(), source)
        reasons.append(f"{source}: {problem}")
    raise SetupError("CUDA headers not found:\n  " + "\n  ".join(reasons))

