// The page-locked query of the NVIDIA kind (harness/kinds/nvidia.py, EngineProbe): included by the harness's
// engine (harness/stages/outputs/engine/engine.cpp) on a build with ggml's CUDA backend, which links the CUDA
// runtime for it (targets.cmake).
#pragma once

#include <algorithm>
#include <cstddef>

#include <cuda_runtime.h>

// bytes of [p, p + n) the CUDA driver reports page-locked (cudaPointerGetAttributes gives cudaMemoryTypeHost):
// the range is sampled every step bytes and each sample stands for the bytes up to the next one
static long long harness_probe_page_locked(const char * p, size_t n, size_t step) {
    long long locked = 0;
    for (size_t off = 0; off < n; off += step) {
        cudaPointerAttributes attr = {};
        if (cudaPointerGetAttributes(&attr, p + off) != cudaSuccess) {
            (void) cudaGetLastError();  // older runtimes fail on memory they do not know: not page-locked
            continue;
        }
        if (attr.type == cudaMemoryTypeHost) {
            locked += (long long) std::min(step, n - off);
        }
    }
    return locked;
}
