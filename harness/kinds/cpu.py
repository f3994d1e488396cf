"""``gpu: none``: a platform whose programs run on the host's CPU only."""

from __future__ import annotations

from .shape import GpuKind

#: No device: the experts stay where the loader puts them in host memory, memory-mapped (``CPU_Mapped``)
#: or read into ``CPU``; the CPU backend may repack a quantized tensor for its kernels (``CPU_REPACK``,
#: which harness.stages.checks.expectation_rules allows beside either).  Nothing is pinned.
CPU = GpuKind(
    name="none",
    backend="CPU",
    described="a platform without a GPU",
    device=None,
    devices=None,
    visible=lambda: 0,
    expert_homes={"host-mmap": "CPU_Mapped", "host": "CPU"},
    lanes="per-core",
    # the fork's pin ladder host test compiles against the CUDA runtime's headers (a wheel of requirements.txt)
    stub_runtime_headers=True,
)
