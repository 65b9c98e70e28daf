#!/usr/bin/env bash
# The C suite, end to end: the header as C11 and C++17, CMake build + install, CTest against the
# build tree, a find_package consumer (shared and static) and pkg-config against the install, then
# the tests again against the install under AddressSanitizer + UBSan and under valgrind.
#
#   bash ctests/run.sh            (from anywhere; idempotent: every run works in a fresh temp dir)
#
# Environment: CARGO_TARGET_DIR (default <repo>/target, shared with cargo), CARGO_BUILD_JOBS and
# STOKER_JOBS (default 2), STOKER_KEEP=1 keeps the temp dir, STOKER_CARGO_PROFILE the cargo profile
# that builds libstoker for this RelWithDebInfo configuration (default release; .ci/test.sh
# passes dev, the build `cargo test` just made).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
jobs="${STOKER_JOBS:-2}"
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-$jobs}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
export PATH="$HOME/.cargo/bin:$PATH"
start=$SECONDS

step() { printf '\n==> %s (%ds)\n' "$*" $((SECONDS - start)); }
die() { printf 'run.sh: %s\n' "$*" >&2; exit 1; }

# --- tools --------------------------------------------------------------------------------
need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v valgrind >/dev/null || need_apt+=(valgrind)
command -v cc >/dev/null || need_apt+=(gcc)
command -v pkg-config >/dev/null || need_apt+=(pkg-config)
if ((${#need_apt[@]})); then
  step "installing ${need_apt[*]}"
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo apt-get install -y "${need_apt[@]}" || { $sudo apt-get update && $sudo apt-get install -y "${need_apt[@]}"; }
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/stoker-ctests.XXXXXX")"
if [[ "${STOKER_KEEP:-0}" == 1 ]]; then
  echo "work dir: $work (kept)"
else
  trap 'rm -rf "$work"' EXIT
fi
prefix="$work/prefix"

# --- header -------------------------------------------------------------------------------
# That include/stoker.h is what cbindgen generates from crates/stoker-capi is a Rust test
# (`cargo test -p stoker-capi generated_`); here, that C and C++ compilers take it as it is.
step "include/stoker.h compiles alone as C11 and C++17"
cc -std=c11 -Wall -Wextra -Werror -pedantic -fsyntax-only -x c include/stoker.h
if command -v c++ >/dev/null; then
  c++ -std=c++17 -Wall -Wextra -Werror -pedantic -fsyntax-only -x c++ include/stoker.h
fi
echo "header: C11 (and C++17) clean"

passed=0
failed=0
failures=()
# ctest_run DIR LABEL [ENV...]: runs ctest in DIR, adds its counts to the totals.
ctest_run() {
  local dir=$1 label=$2
  shift 2
  local log="$work/ctest-$label.log" rc=0
  (cd "$dir" && env "$@" ctest --output-on-failure -j "$jobs") 2>&1 | tee "$log" || rc=$?
  local line total bad
  line="$(grep -E 'tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -1 || true)"
  if [[ -z "$line" ]]; then
    failed=$((failed + 1))
    failures+=("$label: ctest gave no summary")
    return
  fi
  bad="$(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\1/' <<<"$line")"
  total="$(sed -E 's/.* failed out of ([0-9]+).*/\1/' <<<"$line")"
  passed=$((passed + total - bad))
  failed=$((failed + bad))
  if ((bad)) || ((rc)); then failures+=("$label: $line"); fi
}
# run_prog LABEL CMD...: one program outside CTest.
run_prog() {
  local label=$1
  shift
  if "$@"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    failures+=("$label")
  fi
}

# --- build, install, test the build tree ----------------------------------------------------
profile="${STOKER_CARGO_PROFILE:-release}"
step "configure + build (libstoker in cargo's $profile profile, C tests)"
cmake -S . -B "$work/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX="$prefix" \
  "-DSTOKER_CARGO_PROFILE_RELEASE=$profile" >/dev/null
cmake --build "$work/build" -j "$jobs"
step "install to $prefix (and the debug component: the split debug info)"
cmake --install "$work/build" >/dev/null
# Tools that name Rust functions inside the stripped library (valgrind's suppressions, sanitizer
# reports) find them through the .gnu_debuglink in lib/.debug.
cmake --install "$work/build" --component debug >/dev/null
find "$prefix" \( -type f -o -type l \) | sed "s|^$prefix/|  |" | sort

step "lean artifacts: stripped libraries, debug info apart"
so_real="$(basename "$(readlink -f "$prefix/lib/libstoker.so")")"
build_id() { readelf -n "$1" 2>/dev/null | sed -n 's/.*Build ID: //p'; }
lean_check() {
  # Outputs are captured before grep reads them: `readelf | grep -q` fails under pipefail when
  # grep stops reading early.
  local so="$prefix/lib/$so_real" dbg="$prefix/lib/.debug/$so_real.debug" out
  # Stripped: no static symbol table (what `file` calls "stripped") and no debug info.
  out="$(readelf -S -W "$so")"
  ! grep -q ' \.symtab ' <<<"$out" || { echo "$so_real is not stripped (.symtab)"; return 1; }
  ! grep -Eq '\.debug_(info|line|abbrev|str)' <<<"$out" || { echo "$so_real keeps debug info"; return 1; }
  out="$(readelf --string-dump=.gnu_debuglink "$so")"
  [ "$(sed -n 's/^ *\[ *0\] *//p' <<<"$out")" = "$so_real.debug" ] ||
    { echo "$so_real has no .gnu_debuglink to $so_real.debug"; return 1; }
  out="$(readelf -S -W "$dbg")"
  grep -q '\.debug_line' <<<"$out" || { echo "$dbg has no line tables"; return 1; }
  [ -n "$(build_id "$so")" ] && [ "$(build_id "$so")" = "$(build_id "$dbg")" ] ||
    { echo "$so_real and its .debug file differ in build ID"; return 1; }
  out="$(readelf -S -W "$prefix/lib/libstoker.a")"
  ! grep -q '\.debug_info' <<<"$out" || { echo "libstoker.a keeps debug info"; return 1; }
  out="$(readelf -S -W "$prefix/lib/.debug/libstoker.a")"
  grep -q '\.debug_line' <<<"$out" || { echo "lib/.debug/libstoker.a has no line tables"; return 1; }
  # What a debugger sees: source lines inside the stripped library, through the debug link.
  if command -v gdb >/dev/null; then
    out="$(gdb -batch -ex 'info line stoker_version' "$so" 2>&1)"
    grep -q 'version.rs' <<<"$out" || { echo "gdb finds no line of stoker_version: $out"; return 1; }
  fi
}
run_prog "stripped libraries with split debug info" lean_check
for f in "$so_real" .debug/"$so_real.debug" libstoker.a .debug/libstoker.a libstoker_cxx.a; do
  if [ -e "$prefix/lib/$f" ]; then
    awk -v f="$f" -v b="$(stat -c %s "$prefix/lib/$f")" 'BEGIN { printf "  %-32s %6.1f MB\n", f, b / 1e6 }'
  fi
done

step "exported symbols"
bad_syms="$(nm -D --defined-only "$prefix/lib/libstoker.so" | awk '$2 ~ /[TDBRW]/ {print $3}' | grep -v '^stoker_' || true)"
if [[ -n "$bad_syms" ]]; then
  failed=$((failed + 1))
  failures+=("symbols outside stoker_*: $bad_syms")
else
  passed=$((passed + 1))
fi
nm -D --defined-only "$prefix/lib/libstoker.so" | awk '{print "  " $3}'
soname="$(readelf -d "$prefix/lib/libstoker.so" | sed -nE 's/.*SONAME.*\[(.*)\]/\1/p')"
echo "SONAME: $soname"
run_prog "SONAME is libstoker.so.0" test "$soname" = libstoker.so.0

step "CTest: the suite against the build tree"
ctest_run "$work/build" build

# A 2-rank Open MPI job (not under the sanitizers: one run under mpirun is what this checks).
if command -v mpirun >/dev/null; then
  step "mpirun -np 2: ctests/mpi_cover.c reads the Open MPI variables and covers exactly"
  run_prog "mpi_cover under mpirun" bash ctests/mpi_cover.sh "$work/build/ctests/mpi_cover"
else
  echo "mpirun not found: bindings/python/run_distributed_tests.sh installs openmpi-bin and runs it"
fi

# --- consumers of the install ----------------------------------------------------------------
step "consumer project: find_package(stoker) against the install, shared and static"
cmake -S ctests/consumer -B "$work/consumer" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$work/consumer" -j "$jobs"
run_prog consumer "$work/consumer/consumer"
run_prog consumer_static "$work/consumer/consumer_static"
"$work/build/ctests/make_npy" "$work/example.npy" 10
run_prog consumer_example "$work/consumer/consumer_example" "$work/example.npy"
if ldd "$work/consumer/consumer_static" | grep -q libstoker; then
  failed=$((failed + 1))
  failures+=("consumer_static links libstoker.so")
fi

step "C++ consumer: find_package(stoker) gives stoker::cxx from the same install"
cmake -S bindings/cpp/tests/consumer -B "$work/consumer_cxx" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$work/consumer_cxx" -j "$jobs"
run_prog consumer_cxx env -C "$work/consumer_cxx" ./consumer

step "pkg-config: the README example built with \$(pkg-config --cflags --libs stoker)"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
# shellcheck disable=SC2046
cc -std=c11 -Wall -Wextra -Werror -pedantic ctests/example.c -o "$work/example_pc" \
  $(pkg-config --cflags --libs stoker)
run_prog example_pkg_config env LD_LIBRARY_PATH="$prefix/lib" "$work/example_pc" "$work/example.npy"

# --- sanitizers -------------------------------------------------------------------------------
# The tests link the installed shared library; the Rust code in it is not instrumented, but ASan
# intercepts every malloc/free, so leaks and bad frees across the boundary are caught, and the C
# side is fully checked. LeakSanitizer needs no suppressions: Rust's thread-locals of the main
# thread stay reachable through its TLS block, which LSan scans.
step "AddressSanitizer + UndefinedBehaviorSanitizer (tests against the install)"
cmake -S ctests -B "$work/asan" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Debug \
  -DSTOKER_SANITIZE=ON >/dev/null
cmake --build "$work/asan" -j "$jobs" >/dev/null
ctest_run "$work/asan" asan ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

step "valgrind memcheck (tests against the install)"
# --read-inline-info=no: valgrind reads the library's debug info as each of the 23 tests starts.
# test_version, which does next to nothing, took 2.2 s, and 1.4 s without the records of inlined
# calls. A report still names the function and line; only calls inlined into it are not listed
# as frames of their own, and the dev profile inlines little of stoker's own code.
vg="valgrind;--error-exitcode=1;--leak-check=full;--errors-for-leak-kinds=definite,possible"
vg+=";--track-fds=no;--quiet;--read-inline-info=no;--suppressions=$root/ctests/valgrind.supp"
cmake -S ctests -B "$work/valgrind" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Debug \
  "-DSTOKER_TEST_WRAPPER=$vg" >/dev/null
cmake --build "$work/valgrind" -j "$jobs" >/dev/null
ctest_run "$work/valgrind" valgrind

# --- verdict ----------------------------------------------------------------------------------
echo
for f in "${failures[@]+"${failures[@]}"}"; do echo "FAILED: $f"; done
echo "C suite: $passed passed, $failed failed ($((SECONDS - start))s)"
((failed == 0))
