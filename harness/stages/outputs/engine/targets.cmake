# llama-harness-engine: greedy generation and teacher-forced scoring for the harness's
# comparisons, linked like llama.cpp's own tools (llama-common + llama). Included into
# llama.cpp's top-level directory by inject.cmake; the source tree of llama.cpp is not changed.

if (NOT TARGET llama-common)
    message(FATAL_ERROR "llama-harness-engine needs llama.cpp's llama-common library (LLAMA_BUILD_COMMON=ON)")
endif()

add_executable(llama-harness-engine "${HARNESS_ENGINE_SOURCE_DIR}/engine.cpp")
target_link_libraries(llama-harness-engine PRIVATE llama-common llama ${CMAKE_THREAD_LIBS_INIT})
target_compile_features(llama-harness-engine PRIVATE cxx_std_17)

# Upstream's programs decode through common_batch and llama_process where llama.h declares it; the
# older commits a forecast names have only llama_batch and llama_decode, which the engine uses there.
file(STRINGS "${CMAKE_SOURCE_DIR}/include/llama.h" _harness_llama_process REGEX "llama_process[ ]*\\(")
if (_harness_llama_process)
    target_compile_definitions(llama-harness-engine PRIVATE HARNESS_ENGINE_LLAMA_PROCESS)
endif()

# build-info.cpp holds the strings that name the build (the commit, the patch series). In a
# mergeable string section the linker lays out every string of the library by their contents,
# so another series name could move unrelated strings and change bytes the result cache hashes
# (harness.record.cache.normalized_image zeroes only the names). Compiled without constant merging,
# they sit in that object's own read-only data. Upstream names the library llama-common-base.
foreach(_harness_build_info llama-common-base build_info)
    if (TARGET ${_harness_build_info} AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
        target_compile_options(${_harness_build_info} PRIVATE -fno-merge-constants)
    endif()
endforeach()

# On a build of a GPU kind's backend the probe asks that kind's runtime which host bytes are page-locked
# (cudaPointerGetAttributes on CUDA). The kind declares how (harness/kinds/shape.py, EngineProbe) and the
# harness passes it as cache variables: the header that defines harness_probe_page_locked, the name the probe
# record gives the runtime, ggml's option of the backend, and the package and imported targets of its runtime.
# A backend links its runtime privately, so the engine finds it itself and links the same flavour as the
# backend (static with GGML_STATIC).
if (HARNESS_ENGINE_PROBE_HEADER AND HARNESS_ENGINE_PROBE_BACKEND_OPTION)
    if (${HARNESS_ENGINE_PROBE_BACKEND_OPTION})  # the backend's option, GGML_CUDA, is on
        find_package(${HARNESS_ENGINE_PROBE_PACKAGE} REQUIRED)
        set(_harness_runtime ${HARNESS_ENGINE_PROBE_LIBRARY})
        set(_harness_runtime_static ${HARNESS_ENGINE_PROBE_STATIC_LIBRARY})  # both read: neither is an unused -D
        if (GGML_STATIC)
            set(_harness_runtime ${_harness_runtime_static})
        endif()
        target_link_libraries(llama-harness-engine PRIVATE ${_harness_runtime})
        target_compile_definitions(llama-harness-engine PRIVATE
            "HARNESS_ENGINE_PROBE_HEADER=\"${HARNESS_ENGINE_PROBE_HEADER}\""
            "HARNESS_ENGINE_PROBE_DRIVER=\"${HARNESS_ENGINE_PROBE_DRIVER}\"")
    endif()
endif()
