# Passed to llama.cpp's configure as CMAKE_PROJECT_ggml_INCLUDE by the compile step (harness/stages/cuda_unity.py):
# CMake includes it at the end of ggml's project() call. At the end of ggml's directory, when its
# backend targets exist, it includes the groups file named by HARNESS_CUDA_UNITY_GROUPS (unity groups
# of the CUDA units the series does not touch); with that variable empty it does nothing.
if (HARNESS_CUDA_UNITY_GROUPS)
    cmake_language(DEFER DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}" CALL include "${HARNESS_CUDA_UNITY_GROUPS}")
endif()
