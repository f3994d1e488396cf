# Reads a build directory's CTestTestfile.cmake tree, the file CMake generates for ctest, with add_test,
# set_tests_properties and subdirs defined here (script mode has none of its own):
#
#   cmake -DBUILD_DIR=<dir> -P ctest_file.cmake
#       prints one line per test to stderr: its name and its command, each argument after a tab.  ctest's
#       --show-only=json-v1 leaves out the command of a test whose executable is not built yet; this file
#       names it, so upstream's suite builds only the targets its tests start (upstream_suite.py).
#
#   cmake -DBUILD_DIR=<dir> -DEMULATOR=<argv as a CMake list> -DOUT=<file> -P ctest_file.cmake
#       writes OUT, a CTestTestfile.cmake declaring every test again with its command started through
#       EMULATOR, its properties as they were, and its working directory made absolute: what CMake writes for
#       a test whose COMMAND names a target of a cross build (CMAKE_CROSSCOMPILING_EMULATOR), for upstream's
#       tests, which name $<TARGET_FILE:...> and so start the Windows executables directly.
#
# Each argument is taken from ARGV<n>, so an argument holding a semicolon stays one argument, and written back
# as a bracket argument.
cmake_minimum_required(VERSION 3.20)

if(DEFINED OUT)
  file(WRITE "${OUT}" "# written by harness/stages/native_tests/ctest_file.cmake from ${BUILD_DIR}\n")
endif()

function(add_test)
  math(EXPR last "${ARGC} - 1")
  if(DEFINED OUT)
    set(line "add_test([==[${ARGV0}]==]")
    foreach(word IN LISTS EMULATOR)  # the emulator's argv, a CMake list
      string(APPEND line " [==[${word}]==]")
    endforeach()
    foreach(i RANGE 1 ${last})
      string(APPEND line " [==[${ARGV${i}}]==]")
    endforeach()
    file(APPEND "${OUT}" "${line})\nset_tests_properties([==[${ARGV0}]==] PROPERTIES WORKING_DIRECTORY "
                         "[==[${CMAKE_CURRENT_LIST_DIR}]==])\n")
  else()
    set(line "${ARGV0}")
    foreach(i RANGE 1 ${last})
      string(APPEND line "\t${ARGV${i}}")
    endforeach()
    message("${line}")
  endif()
endfunction()

function(set_tests_properties)
  if(NOT DEFINED OUT)
    return()
  endif()
  math(EXPR last "${ARGC} - 1")
  set(line "set_tests_properties(")
  set(previous "")
  foreach(i RANGE 0 ${last})
    set(value "${ARGV${i}}")
    if(previous STREQUAL "WORKING_DIRECTORY" AND NOT IS_ABSOLUTE "${value}")
      set(value "${CMAKE_CURRENT_LIST_DIR}/${value}")
    endif()
    string(APPEND line " [==[${value}]==]")
    set(previous "${ARGV${i}}")
  endforeach()
  file(APPEND "${OUT}" "${line})\n")
endfunction()

function(subdirs)
  set(here "${CMAKE_CURRENT_LIST_DIR}")
  foreach(d IN LISTS ARGN)
    include("${here}/${d}/CTestTestfile.cmake" OPTIONAL)
  endforeach()
endfunction()

include("${BUILD_DIR}/CTestTestfile.cmake")
