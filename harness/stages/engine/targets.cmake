# llama-harness-engine: greedy generation and teacher-forced scoring for the harness's
# comparisons, linked like llama.cpp's own tools (llama-common + llama). Included into
# llama.cpp's top-level directory by inject.cmake; the source tree of llama.cpp is not changed.

if (NOT TARGET llama-common)
    message(FATAL_ERROR "llama-harness-engine needs llama.cpp's llama-common library (LLAMA_BUILD_COMMON=ON)")
endif()

add_executable(llama-harness-engine "${HARNESS_ENGINE_SOURCE_DIR}/engine.cpp")
target_link_libraries(llama-harness-engine PRIVATE llama-common llama ${CMAKE_THREAD_LIBS_INIT})
target_compile_features(llama-harness-engine PRIVATE cxx_std_17)
