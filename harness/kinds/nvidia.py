"""``gpu: nvidia``: a platform whose programs run on NVIDIA GPUs through ggml's CUDA backend.

What the backend's environment variables mean (ggml/src/ggml-cuda and the fork's patches) is declared
here once, in :data:`ENV`: the run record lists those set (harness.record.gpu.pin_environment), the
preflight refuses them on a platform of another kind, and the expectation rules derive the placement
and pinning they cause (harness.stages.checks.expectation_rules).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Mapping

from ..common.proc import run_capture
from .shape import EngineProbe, EnvVar, GpuKind, HostTool

#: The variables of its pinning (GpuKind.pin_vars), which the expectation and reload rules read.
NO_PINNED = "GGML_CUDA_NO_PINNED"
PIN_LAYERS = "GGML_CUDA_MOE_PIN_LAYERS"
PIN_SIM_TOTAL_MAX_MB = "GGML_CUDA_PIN_SIM_TOTAL_MAX_MB"
PIN_SIM_STICKY = "GGML_CUDA_PIN_SIM_STICKY"
VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"

#: The variables of the CUDA backend and the fork that change placement, pinning or the devices seen.
ENV = (
    EnvVar(NO_PINNED, "pinning", presence=True,
           meaning="the host buffer type hands out plain (pageable) memory: nothing is pinned, and experts kept "
                   "in host memory land in CPU instead of CUDA_Host; any value, 0 and empty included"),
    EnvVar(PIN_LAYERS, "placement",
           meaning="the fork's layer-subset routing (patch 0003): a positive decimal N keeps the expert tensors of "
                   "layers 0..N-1 in the pinned host buffer and those of layers N and up in CPU (pageable); "
                   "another value is ignored with a pin-layers-invalid warning"),
    EnvVar("GGML_CUDA_PIN_SIM_", "simulation",
           meaning="the fork's simulated pin limits, for tests: _TOTAL_MAX_MB caps the bytes pinned in total "
                   "(MiB; a partial-pin warning past it), _STICKY refuses every call after the first refusal "
                   "(a no-pin warning)"),
    EnvVar("GGML_CUDA_PIN_", "pinning", meaning="the fork's pin ladder settings (chunk sizes, in MiB)"),
    EnvVar("GGML_CUDA_REGISTER_HOST", "pinning", meaning="cudaHostRegister of the model's host buffers"),
    EnvVar(VISIBLE_DEVICES, "visibility", meaning="which GPUs the CUDA runtime enumerates, and in which order"),
)

#: The CUDA compiler CMake finds: $CUDACXX, nvcc on PATH, or the toolkit's default place.
#: The engine's page-locked query on a CUDA build: cudaPointerGetAttributes, in nvidia_probe.h; ggml-cuda links the
#: CUDA runtime privately, so the engine finds the toolkit itself and links the same flavour of the runtime as
#: ggml-cuda (static with GGML_STATIC).
PROBE = EngineProbe(header="nvidia_probe.h", driver="cuda", backend_option="GGML_CUDA", package="CUDAToolkit",
                    library="CUDA::cudart", static_library="CUDA::cudart_static")

NVCC = HostTool("the CUDA toolkit", ("nvcc",), "nvidia-cuda-toolkit", ("/usr/local/cuda/bin/nvcc",), ("CUDACXX",))


def nvidia_gpus() -> list[dict[str, str]]:
    """GPUs reported by ``nvidia-smi`` as dicts (name, driver, memory, compute capability); [] if none."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    fields = ["name", "driver_version", "memory.total", "compute_cap", "pci.bus_id"]
    proc = subprocess.run([smi, f"--query-gpu={','.join(fields)}", "--format=csv,noheader"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return []
    gpus = []
    for line in proc.stdout.strip().splitlines():
        values = [v.strip() for v in line.split(",")]
        if len(values) == len(fields):
            gpus.append(dict(zip(["name", "driver", "memory", "compute_capability", "pci_bus_id"], values)))
    return gpus


def compute_capabilities() -> str | None:
    """CMake CUDA architectures of the GPUs present, from ``nvidia-smi``'s compute capability (``90``, several
    joined with ``;``); None when nvidia-smi is missing or reports no GPU."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    _, out, _ = run_capture([smi, "--query-gpu=compute_cap", "--format=csv,noheader"], timeout_s=60)
    caps = sorted({c.strip().replace(".", "") for c in out.decode(errors="replace").splitlines() if c.strip()})
    return ";".join(caps) or None


def cuda_driver_version() -> str | None:
    """The CUDA version the driver supports, as nvidia-smi prints it in its banner (e.g. "13.0"); None without
    nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    proc = subprocess.run([smi], capture_output=True, text=True)
    m = re.search(r"CUDA Version:\s*([\d.]+)", proc.stdout)
    return m.group(1) if m else None


def nvcc_version() -> str | None:
    """The CUDA toolkit release from ``nvcc --version`` (e.g. "13.0, V13.0.48"); None without nvcc."""
    nvcc = shutil.which("nvcc")
    if not nvcc:
        return None
    proc = subprocess.run([nvcc, "--version"], capture_output=True, text=True)
    m = re.search(r"release\s+([^\n]+)", proc.stdout)
    return m.group(1).strip() if m else None


def cuda_libraries(cmake_cache: Path | None) -> list[Path]:
    """The CUDA runtime and cuBLAS libraries (``libcu*.so*``) of the toolkit a build links: those in
    ``CUDAToolkit_LIBRARY_DIR`` of its ``cmake_cache``; [] without that entry, the file or the directory."""
    lib_dir = None
    try:
        for line in (cmake_cache.read_text().splitlines() if cmake_cache else []):
            if line.startswith("CUDAToolkit_LIBRARY_DIR:"):
                lib_dir = Path(line.split("=", 1)[1])
    except OSError:
        pass
    libs = sorted(lib_dir.glob("libcu*.so*")) if lib_dir and lib_dir.is_dir() else []
    return [p for p in libs if p.is_file()]


def visible_gpu_count(gpus: list[dict[str, str]] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """How many NVIDIA GPUs a CUDA program started from here sees.

    ``gpus`` defaults to :func:`nvidia_gpus` (nvidia-smi ignores
    CUDA_VISIBLE_DEVICES and lists every GPU).  When CUDA_VISIBLE_DEVICES is
    set, the CUDA runtime enumerates its comma-separated entries up to the
    first one that is not a valid device (CUDA documentation, "CUDA Environment
    Variables"); this counts the entries that are an index below the GPU count
    or a GPU/MIG UUID, and stops at the first other one, as the runtime does.
    """
    gpus = nvidia_gpus() if gpus is None else gpus
    env = os.environ if environ is None else environ
    value = env.get(VISIBLE_DEVICES)
    if value is None:
        return len(gpus)
    count = 0
    for entry in value.split(","):
        entry = entry.strip()
        if entry.isdigit() and int(entry) < len(gpus) or entry.startswith(("GPU-", "MIG-")):
            count += 1
        else:
            break
    return min(count, len(gpus))


NVIDIA = GpuKind(
    name="nvidia",
    backend="CUDA",
    described="a platform with NVIDIA GPUs",
    device="an NVIDIA GPU",
    devices="NVIDIA GPUs",
    visible=lambda: visible_gpu_count(),
    expert_homes={"device": "CUDA[0-9]*", "host-mmap": "CPU_Mapped", "host": "CUDA_Host", "host-unpinned": "CPU"},
    lanes="one",
    build_tool=NVCC,
    env=ENV,
    # ggml/src/ggml-cuda reads GGML_CUDA_*, the CUDA runtime CUDA_VISIBLE_DEVICES: a build without the backend
    # ignores them
    backend_env=re.compile(r"^(GGML_CUDA_|CUDA_VISIBLE_DEVICES$)"),
    arch_cmake="CMAKE_CUDA_ARCHITECTURES",
    visible_probe="nvidia-smi",
    sanitizer="compute-sanitizer",
    # a test's failure exit code; a test that starts no CUDA context is still run; a generation's reports keep
    # their host backtraces (the log file follows, harness.stages.outputs.sanitized_generation)
    sanitizer_args={"test": ("--error-exitcode", "1", "--require-cuda-init", "no"),
                    "generation": ("--error-exitcode", "1", "--show-backtrace", "yes")},
    architectures=lambda: compute_capabilities(),
    # through the module's names, so that a test that replaces one replaces what the kind asks
    inventory=lambda: nvidia_gpus(),
    driver_version=lambda: cuda_driver_version(),
    toolkit_version=lambda: nvcc_version(),
    runtime_libraries=lambda cmake_cache: cuda_libraries(cmake_cache),
    pin_vars={"no-pinned": NO_PINNED, "pin-layers": PIN_LAYERS, "sim-total-max-mb": PIN_SIM_TOTAL_MAX_MB,
              "sim-sticky": PIN_SIM_STICKY},
    engine_probe=PROBE,
    device_language="CUDA",
)
