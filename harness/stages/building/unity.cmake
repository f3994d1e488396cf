# Passed to llama.cpp's configure as CMAKE_PROJECT_ggml_INCLUDE by the compile step (harness/stages/building/unity.py):
# CMake includes it at the end of ggml's project() call. At the end of the top-level directory, when
# every target exists (ggml's backends, libllama, common, the tools and tests), it includes the groups
# file named by HARNESS_UNITY_GROUPS (unity groups of the units the series does not touch); with that
# variable empty it does nothing.
if (HARNESS_UNITY_GROUPS)
    cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL include "${HARNESS_UNITY_GROUPS}")
endif()
