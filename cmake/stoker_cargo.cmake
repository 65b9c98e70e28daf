# The cargo profile that builds each CMake configuration, shared by the top-level project and
# bindings/cpp:
#   Debug                                      -> cargo's `dev` profile (target/debug); the
#                                                 libraries keep their debug info
#   Release, RelWithDebInfo, MinSizeRel, none  -> `release` (target/release: optimized, line
#                                                 tables); the staged and installed libraries are
#                                                 stripped and their debug info split into .debug
#                                                 files (STOKER_SPLIT_DEBUGINFO)
# Generator expressions, so that multi-config generators (Ninja Multi-Config, Xcode) pick per
# configuration too. Either profile can be replaced by a custom `[profile.NAME]` of the workspace
# Cargo.toml, which cargo builds into target/NAME.
include_guard(GLOBAL)

set(STOKER_CARGO_PROFILE_DEBUG "dev" CACHE STRING "cargo profile for the Debug configuration")
set(STOKER_CARGO_PROFILE_RELEASE "release" CACHE STRING
    "cargo profile for the Release, RelWithDebInfo and MinSizeRel configurations")
option(STOKER_SPLIT_DEBUGINFO
       "Strip the libraries of non-Debug builds and keep their debug info in separate .debug files (install component `debug`)"
       ON)
set(STOKER_CARGO_PROFILE_DESCRIPTION
    "cargo profile ${STOKER_CARGO_PROFILE_DEBUG} for Debug, ${STOKER_CARGO_PROFILE_RELEASE} otherwise")

# The directory under the target dir where cargo puts a profile's output.
function(_stoker_cargo_profile_dir profile out)
  if(profile STREQUAL "dev" OR profile STREQUAL "test")
    set(${out} debug PARENT_SCOPE)
  elseif(profile STREQUAL "bench")
    set(${out} release PARENT_SCOPE)
  else()
    set(${out} "${profile}" PARENT_SCOPE)
  endif()
endfunction()

# stoker_cargo_profile(<profile var> <output dir var> <split var>): generator expressions for
# `cargo build --profile <profile>`, the output directory name under the target dir, and whether
# to strip and split debug info (1/0).
function(stoker_cargo_profile out_profile out_dir out_split)
  _stoker_cargo_profile_dir("${STOKER_CARGO_PROFILE_DEBUG}" _debug_dir)
  _stoker_cargo_profile_dir("${STOKER_CARGO_PROFILE_RELEASE}" _release_dir)
  set(_is_debug "$<CONFIG:Debug>")
  set(${out_profile}
      "$<IF:${_is_debug},${STOKER_CARGO_PROFILE_DEBUG},${STOKER_CARGO_PROFILE_RELEASE}>" PARENT_SCOPE)
  set(${out_dir} "$<IF:${_is_debug},${_debug_dir},${_release_dir}>" PARENT_SCOPE)
  if(STOKER_SPLIT_DEBUGINFO)
    set(${out_split} "$<NOT:${_is_debug}>" PARENT_SCOPE)
  else()
    set(${out_split} 0 PARENT_SCOPE)
  endif()
endfunction()
