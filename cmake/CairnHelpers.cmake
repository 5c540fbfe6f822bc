# Internal helpers for cairn's own programs and tests (not installed).
include_guard(GLOBAL)

# Warnings for code that cairn itself compiles (examples, tools, bench, tests). Not part of
# cairn::cairn's usage requirements.
function(cairn_target_warnings target)
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    # Designated initializers that leave options at their defaults are the intended style.
    target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-missing-field-initializers)
    if(CAIRN_WERROR)
      target_compile_options(${target} PRIVATE -Werror)
    endif()
  endif()
endfunction()

# cairn_add_executable(<target> [OUTPUT_NAME <name>] SOURCES <src>...)
# An executable linking cairn::compiled (cairn's bodies compiled once) and Threads; it lands in
# ${CMAKE_BINARY_DIR}/bin when cairn is the top-level project.
function(cairn_add_executable target)
  cmake_parse_arguments(arg "" "OUTPUT_NAME" "SOURCES" ${ARGN})
  add_executable(${target} ${arg_SOURCES})
  target_link_libraries(${target} PRIVATE cairn::compiled Threads::Threads)
  cairn_target_warnings(${target})
  if(arg_OUTPUT_NAME)
    set_target_properties(${target} PROPERTIES OUTPUT_NAME ${arg_OUTPUT_NAME})
  endif()
endfunction()

# cairn_header_requires(<regex> <target>)
# Headers whose path below include/ matches <regex> need <target> (an optional part such as
# cairn::mpi) to compile. The header self-containment check compiles them against that target,
# and skips them when the target does not exist (its dependency was not found).
function(cairn_header_requires regex target)
  set_property(GLOBAL APPEND PROPERTY CAIRN_HEADER_RULE_REGEXES "${regex}")
  set_property(GLOBAL APPEND PROPERTY CAIRN_HEADER_RULE_TARGETS "${target}")
endfunction()

# cairn_header_target(<header path below include/> <out var>): the target a public header is
# compiled against (cairn::cairn unless a cairn_header_requires rule names another).
function(cairn_header_target rel out)
  get_property(regexes GLOBAL PROPERTY CAIRN_HEADER_RULE_REGEXES)
  get_property(targets GLOBAL PROPERTY CAIRN_HEADER_RULE_TARGETS)
  set(needs cairn::cairn)
  foreach(regex target IN ZIP_LISTS regexes targets)
    if(rel MATCHES "${regex}")
      set(needs ${target})
      break()
    endif()
  endforeach()
  set(${out} ${needs} PARENT_SCOPE)
endfunction()
