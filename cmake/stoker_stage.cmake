# Stages one artifact built by cargo into the CMake build tree under its installed name, and
# makes it lean the way distributions do (dh_strip): with SPLIT on, the staged file is stripped
# and its debug info kept beside it as DEST.debug, which the stripped file names in its
# .gnu_debuglink (and shares its GNU build ID with), so debuggers and crash symbolizers find it.
#
#   cmake -DSRC=<cargo output> -DDEST=<staged file> -DKIND=shared|static|executable
#         -DSPLIT=ON|OFF -DOBJCOPY=<objcopy> -P stoker_stage.cmake
#
# Runs at build time, after every cargo build; it does nothing while SRC is unchanged (a content
# hash in DEST.stamp), so targets linking DEST are not relinked for nothing.
#   shared, executable: DEST stripped of debug info and of the static symbol table (dynamic
#                       symbols stay); DEST.debug holds the debug info (compressed).
#   static:             DEST stripped of debug info (its symbols stay, for linking); DEST.debug
#                       is the unstripped archive, for programs that want line tables of stoker
#                       in their own debug info.
cmake_minimum_required(VERSION 3.16)

foreach(_var SRC DEST KIND)
  if(NOT DEFINED ${_var} OR "${${_var}}" STREQUAL "")
    message(FATAL_ERROR "stoker_stage.cmake: -D${_var}=... is required")
  endif()
endforeach()
if(NOT EXISTS "${SRC}")
  message(FATAL_ERROR "stoker_stage.cmake: ${SRC} does not exist (did cargo build it?)")
endif()
if(SPLIT AND NOT OBJCOPY)
  message(WARNING "stoker_stage.cmake: no objcopy, ${DEST} keeps its debug info")
  set(SPLIT OFF)
endif()

file(SHA256 "${SRC}" _hash)
set(_stamp "${DEST}.stamp")
set(_want "${_hash} ${KIND} split=${SPLIT}")
if(EXISTS "${DEST}" AND EXISTS "${_stamp}")
  file(READ "${_stamp}" _have)
  if(_have STREQUAL _want)
    return()
  endif()
endif()

function(_run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    string(REPLACE ";" " " _cmd "${ARGN}")
    message(FATAL_ERROR "stoker_stage.cmake: `${_cmd}` failed (${_rc})")
  endif()
endfunction()

get_filename_component(_dir "${DEST}" DIRECTORY)
file(MAKE_DIRECTORY "${_dir}")
file(REMOVE "${_stamp}" "${DEST}.debug")
_run("${CMAKE_COMMAND}" -E copy "${SRC}" "${DEST}")
if(SPLIT)
  get_filename_component(_debug_name "${DEST}.debug" NAME)
  if(KIND STREQUAL "static")
    _run("${CMAKE_COMMAND}" -E copy "${SRC}" "${DEST}.debug")
    _run("${OBJCOPY}" --strip-debug "${DEST}")
  else()
    _run("${OBJCOPY}" --only-keep-debug --compress-debug-sections=zlib "${DEST}" "${DEST}.debug")
    if(KIND STREQUAL "shared")
      _run("${OBJCOPY}" --strip-unneeded "${DEST}")
    else()
      _run("${OBJCOPY}" --strip-all "${DEST}")
    endif()
    # Run in DEST's directory so the link records the bare file name, which debuggers look up
    # next to the file, in its .debug/ subdirectory, and under their debug-file directory.
    execute_process(COMMAND "${OBJCOPY}" "--add-gnu-debuglink=${_debug_name}" "${DEST}"
                    WORKING_DIRECTORY "${_dir}" RESULT_VARIABLE _rc)
    if(NOT _rc EQUAL 0)
      message(FATAL_ERROR "stoker_stage.cmake: adding the debug link to ${DEST} failed")
    endif()
  endif()
endif()
file(WRITE "${_stamp}" "${_want}")
