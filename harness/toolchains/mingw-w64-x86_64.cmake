# Cross-compile for 64-bit Windows with MinGW-w64 on Linux (Debian: g++-mingw-w64-x86-64-posix).
#
# The posix thread model is required: llama.cpp uses std::thread and std::mutex,
# which the win32 thread model of GCC 12 lacks.  Executables are linked
# statically (libgcc, libstdc++, winpthread), so they run under Wine or on
# Windows without the MinGW runtime DLLs on the search path.
# The harness passes CMAKE_CROSSCOMPILING_EMULATOR (wine64) on the command line,
# so that ctest runs the test executables through it.
set(CMAKE_SYSTEM_NAME Windows)
set(CMAKE_SYSTEM_PROCESSOR x86_64)

set(_mingw_prefix x86_64-w64-mingw32)
find_program(CMAKE_C_COMPILER NAMES ${_mingw_prefix}-gcc-posix REQUIRED)
find_program(CMAKE_CXX_COMPILER NAMES ${_mingw_prefix}-g++-posix REQUIRED)
find_program(CMAKE_RC_COMPILER NAMES ${_mingw_prefix}-windres REQUIRED)

set(CMAKE_FIND_ROOT_PATH /usr/${_mingw_prefix})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

set(CMAKE_EXE_LINKER_FLAGS_INIT "-static")

# mingw-w64 10 (Debian 12) declares no THREAD_POWER_THROTTLING_STATE, which
# ggml-cpu.c uses when _WIN32_WINNT >= 0x0602 (Windows 8).  Only C sources are
# held at Windows 7: ggml-cpu.c's power throttling hint is the one use of
# _WIN32_WINNT in ggml's C code; C++ keeps the compiler's default (Windows 10).
set(CMAKE_C_FLAGS_INIT "-D_WIN32_WINNT=0x0601")
