# Drives one consumer test: a separate CMake project that uses cairn the way users do. Run by
# ctest as `cmake -D <var>=<value>... -P run_consumer_test.cmake`:
#   MODE            find_package | build_tree | add_subdirectory
#   CAIRN_SOURCE    cairn's source tree         CAIRN_BINARY  cairn's (configured, built) tree
#   PROJECT_DIR     the consumer project        WORK_DIR      scratch dir (wiped first)
#   INSTALL_PREFIX  (find_package) where cairn is installed (wiped first)
#   GENERATOR, CXX_COMPILER, LAUNCHER, BUILD_TYPE   forwarded to the consumer's configure
#   EXPECT_MPI      1 when cairn::mpi was built: the consumer must find and build against it
# Every step must succeed, and the consumer programs (header-only and cairn::compiled) must exit
# 0. Never runs cairn's own tests.
cmake_minimum_required(VERSION 3.25)

function(step what)
  execute_process(
    COMMAND ${ARGN}
    RESULT_VARIABLE rc
    OUTPUT_VARIABLE out
    ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message("${out}")
    message(FATAL_ERROR "consumer/${MODE}: ${what} failed (${rc})")
  endif()
  message(STATUS "consumer/${MODE}: ${what}: ok")
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

set(configure_args
    -S "${PROJECT_DIR}" -B "${WORK_DIR}/build" -G "${GENERATOR}"
    "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}" "-DCMAKE_BUILD_TYPE=${BUILD_TYPE}"
    -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON)
if(EXPECT_MPI)
  list(APPEND configure_args -DCAIRN_EXPECT_MPI=ON)
endif()
if(LAUNCHER)
  list(APPEND configure_args "-DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER}")
endif()

if(MODE STREQUAL "find_package")
  set(prefix "${INSTALL_PREFIX}")
  file(REMOVE_RECURSE "${prefix}")
  step("install cairn into ${prefix}" "${CMAKE_COMMAND}" --install "${CAIRN_BINARY}" --prefix
       "${prefix}" --component cairn_development)
  list(APPEND configure_args "-DCMAKE_PREFIX_PATH=${prefix}" "-DCAIRN_EXPECTED_DIR=${prefix}")
elseif(MODE STREQUAL "build_tree")
  list(APPEND configure_args "-Dcairn_DIR=${CAIRN_BINARY}" "-DCAIRN_EXPECTED_DIR=${CAIRN_BINARY}")
elseif(MODE STREQUAL "add_subdirectory")
  list(APPEND configure_args "-DCAIRN_SOURCE_DIR=${CAIRN_SOURCE}")
else()
  message(FATAL_ERROR "unknown MODE '${MODE}'")
endif()

step("configure" "${CMAKE_COMMAND}" ${configure_args})
step("build" "${CMAKE_COMMAND}" --build "${WORK_DIR}/build")
step("run" "${WORK_DIR}/build/cairn_consumer")
step("run the compiled-mode program" "${WORK_DIR}/build/cairn_consumer_compiled")
