# Passed to llama.cpp's configure as CMAKE_PROJECT_ggml_INCLUDE by the build step (harness/stages/building/builds.py)
# where the platform names `unoptimised_targets` in matrix.yaml: CMake includes it at the end of ggml's
# project() call. At the end of the top-level directory, when every target exists, each target named by
# HARNESS_UNOPTIMISED_TARGETS gets -O0 after the build type's flags (the last -O wins), so its units compile
# without optimisation; a name that is no target stops the configure.
function(harness_unoptimised)
    foreach(name IN LISTS HARNESS_UNOPTIMISED_TARGETS)
        if (NOT TARGET ${name})
            message(FATAL_ERROR "harness: unoptimised_targets names ${name}, which this tree does not define (matrix.yaml)")
        endif()
        target_compile_options(${name} PRIVATE -O0)
    endforeach()
endfunction()
if (HARNESS_UNOPTIMISED_TARGETS)
    cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL harness_unoptimised)
endif()
