# Passed to llama.cpp's configure as CMAKE_PROJECT_llama.cpp_INCLUDE: CMake includes it at the
# end of the top-level project() call. It defers including targets.cmake until the top-level
# CMakeLists.txt has been processed, when llama-common and llama exist as targets (a deferred
# call may not add a subdirectory, so the target is defined in the top-level directory).
set(HARNESS_ENGINE_SOURCE_DIR "${CMAKE_CURRENT_LIST_DIR}")
cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL include "${HARNESS_ENGINE_SOURCE_DIR}/targets.cmake")
