"""A fake HIP kind (``gpu: rocm``), declared as a module of harness/kinds would declare it, and the harness's
command line run with it: ``python tests/hip_kind.py SCHEMA ARGS...`` registers :data:`ROCM` in
harness.kinds.registry, reads matrix.yaml against ``SCHEMA`` (the schema with ``rocm`` in ``$defs.gpuKind``, which
the caller writes) and runs ``python -m harness ARGS...``.

What the fake kind is told of this machine: one AMD GPU visible, and its build tool found where
``$HARNESS_TEST_HIPCXX`` names an existing file.  Its engine probe names tests/data/hip_probe.h, the HIP
runtime's page-locked query; the fake project (tests/test_kind_hip.py) reads the probe's CMake variables as
llama.cpp's build reads them through the engine's targets.cmake.
"""

from __future__ import annotations

import re
import runpy
import sys
from pathlib import Path

from harness.kinds import registry
from harness.kinds.shape import EngineProbe, EnvVar, GpuKind, HostTool
from harness.matrix import config

#: The HIP runtime's page-locked query, as a kind's header of harness/kinds would hold it.
PROBE = EngineProbe(header=str(Path(__file__).resolve().parent / "data" / "hip_probe.h"), driver="hip",
                    backend_option="GGML_HIP", package="hip", library="hip::host", static_library="hip::host")

ROCM = GpuKind(
    name="rocm", backend="HIP", described="a platform with AMD GPUs", device="an AMD GPU", devices="AMD GPUs",
    visible=lambda: 1, visible_probe="rocm-smi",
    expert_homes={"device": "ROCm[0-9]*", "host-mmap": "CPU_Mapped", "host": "ROCm_Host", "host-unpinned": "CPU"},
    lanes="one",
    build_tool=HostTool("the ROCm toolkit", ("hipcc-of-no-machine",), "hipcc", env=("HARNESS_TEST_HIPCXX",)),
    env=(EnvVar("HIP_VISIBLE_DEVICES", "visibility", meaning="which GPUs the HIP runtime enumerates"),),
    backend_env=re.compile(r"^(GGML_HIP_|HIP_VISIBLE_DEVICES$)"),
    engine_probe=PROBE,
    device_language="HIP",
)


def main() -> None:
    """Register :data:`ROCM`, point the matrix reader at ``sys.argv[1]`` and run the harness with the rest."""
    registry.GPUS[ROCM.name] = ROCM
    config.SCHEMA_PATH = Path(sys.argv[1])
    sys.argv = ["harness", *sys.argv[2:]]
    runpy.run_module("harness", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
