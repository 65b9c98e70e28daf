#!/usr/bin/env bash
# stoker-core's concurrency core under AddressSanitizer, ThreadSanitizer and Miri (nightly Rust).
#
#   asan  the lib unit tests and the loader, cuda_prefetch (fake device) and faults tests with
#         -Zsanitizer=address (LeakSanitizer on): use-after-free, overflow, leaks in the pool,
#         arena, collate, prefetch ring. std is not instrumented (not needed: ASan intercepts
#         malloc/free, and Rust's allocations go through them).
#   tsan  the same tests with -Zsanitizer=thread and -Zbuild-std, so std and crossbeam are
#         instrumented too: without it TSan reports false races inside std's synchronisation
#         (and rustc refuses to mix instrumented and uninstrumented crates). Needs rust-src.
#   miri  the unsafe code of the arena, collate's buffer reuse, and the prefetch ring on the
#         fake device, through the tests that can run under Miri (no mlock, no file mmap, no
#         timing assertions). Needs the miri component.
#
# Every build is stoker-core without its default features: the CUDA driver binding, the remote
# fetcher (tokio, object_store) and libjpeg-turbo are not the concurrency core, and leaving them
# out halves each build. libjpeg-turbo's Rust wrapper is fuzzed under AddressSanitizer
# (.ci/fuzz.sh, image_pipeline); the remote fetcher's tests run in `cargo test` and the
# remote-shards step.
#
# Each prints "sanitizer NAME: ok, N tests" or the report, and any finding fails the script.
# SANITIZERS="asan tsan" runs a subset. Build directories: target/sanitizers/NAME.
# SANITIZERS_BUILD_ONLY=1 builds the chosen sanitizers' tests (Miri's sysroot and test build too),
# runs nothing: the test command builds ASan's and TSan's in the background while earlier steps
# leave a core idle, and runs Miri whole beside them.
set -euo pipefail
cd "$(dirname "$0")/.."

triple=x86_64-unknown-linux-gnu
target_root=${CARGO_TARGET_DIR:-target}/sanitizers
read -r -a which <<<"${SANITIZERS:-asan tsan miri}"
export CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-2}
# The tests that drive the pool, arena, collate and the prefetcher: the unit tests and the
# integration tests' modules loader, cuda_prefetch and faults (filters match anywhere in a
# test's name, hence the skips of tar_loader and image_loader). Not soak: its resident memory
# bounds do not hold under a sanitizer's shadow memory and quarantine. ASan and TSan intercept
# mlock and make it a no-op that succeeds, so the test of a refused mlock cannot refuse it
# under them.
skips=(--skip mlock_refused)
modules=(loader:: cuda_prefetch:: faults:: --skip tar_loader:: --skip image_loader:: "${skips[@]}")

start=$(date +%s)
command -v rustup >/dev/null || { echo "sanitizers: rustup is required (nightly toolchain)"; exit 1; }
rustup run nightly rustc --version >/dev/null 2>&1 || rustup toolchain install nightly --profile minimal
need=()
[[ " ${which[*]} " == *" tsan "* ]] && need+=(rust-src)
[[ " ${which[*]} " == *" miri "* ]] && need+=(rust-src miri)
for c in "${need[@]}"; do
  rustup component list --toolchain nightly --installed 2>/dev/null | grep -q "^$c" ||
    rustup component add "$c" --toolchain nightly
done

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
failed=()

# summarize NAME LOG STATUS: one line per sanitizer; on failure, the report.
summarize() {
  local name=$1 log=$2 rc=$3 passed
  passed=$(grep -Eo 'test result: ok\. [0-9]+ passed' "$log" | awk '{s+=$4} END {print s+0}' || true)
  if [ "$rc" -eq 0 ] && ! grep -qE '^(==[0-9]+==ERROR|WARNING: ThreadSanitizer)' "$log"; then
    echo "sanitizer $name: ok, $passed tests passed ($(( $(date +%s) - $4 )) s)"
  else
    failed+=("$name")
    echo "sanitizer $name: FAILED (exit $rc); the report:"
    grep -nE -A30 '==[0-9]+==ERROR|WARNING: ThreadSanitizer|Undefined Behavior|unsupported operation|panicked|FAILED' "$log" | head -120 || true
    tail -n 20 "$log"
    if grep -q 'Miri only supports calls to mmap' "$log"; then
      echo "hint: Miri maps only MAP_PRIVATE|MAP_ANONYMOUS; arena/mod.rs must leave out MAP_POPULATE under cfg(miri)"
    fi
  fi
}

# sanitized_tests CARGO_TEST...: the unit tests, then the integration tests' modules above.
sanitized_tests() {
  if [ "${SANITIZERS_BUILD_ONLY:-0}" = 1 ]; then
    "$@" --lib --test all --no-run
    return
  fi
  "$@" --lib -- "${skips[@]}" && "$@" --test all -- "${modules[@]}"
}

# run NAME: one sanitizer's build and tests, output to its log; the exit status is the tests'.
run() {
  local s=$1 log="$logs/$1.log"
  case "$s" in
    asan)
      RUSTFLAGS="-Zsanitizer=address" RUSTDOCFLAGS="-Zsanitizer=address" \
        ASAN_OPTIONS="detect_leaks=1:halt_on_error=1" \
        sanitized_tests cargo +nightly test -p stoker-core --no-default-features \
        --target "$triple" --target-dir "$target_root/asan" >"$log" 2>&1
      ;;
    tsan)
      RUSTFLAGS="-Zsanitizer=thread" RUSTDOCFLAGS="-Zsanitizer=thread" \
        TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1" \
        sanitized_tests cargo +nightly test -Zbuild-std -p stoker-core --no-default-features \
        --target "$triple" --target-dir "$target_root/tsan" >"$log" 2>&1
      ;;
    miri)
      # Permissive provenance: the fake device hands out device pointers as integers, as a
      # real driver does; Miri would otherwise warn on each cast back.
      export MIRIFLAGS="-Zmiri-permissive-provenance"
      miri=(cargo +nightly miri test -p stoker-core --no-default-features --target-dir "$target_root/miri")
      if [ "${SANITIZERS_BUILD_ONLY:-0}" = 1 ]; then
        "${miri[@]}" --lib --test all --no-run >"$log" 2>&1
        return
      fi
      {
        "${miri[@]}" --lib -- arena:: --skip pinning &&
          "${miri[@]}" --test all -- loader::stacks_fields_in_sampler_order \
            loader::skip_replaces_bad_samples_deterministically_and_counts_them \
            loader::ragged_fields_are_padded_with_lengths loader::a_panicking_sample_becomes_an_error \
            loader::dropping_mid_epoch_joins_workers_and_held_batches_stay_valid \
            cuda_prefetch::device_batches_match_host_batches_in_order_across_epochs \
            cuda_prefetch::host_slabs_are_recycled_once_copied_while_device_batches_are_held \
            cuda_prefetch::dropping_mid_epoch_joins_and_frees_every_buffer_after_held_batches_go
      } >"$log" 2>&1
      ;;
    *)
      echo "unknown sanitizer '$s' (asan, tsan, miri)" >"$log"
      false
      ;;
  esac
}

# finish NAME START STATUS: its summary; on CI's small disk its build (1-2 GB) goes at once.
finish() {
  if [ "${SANITIZERS_BUILD_ONLY:-0}" = 1 ]; then
    if [ "$3" -eq 0 ]; then
      echo "sanitizer $1: built ($(( $(date +%s) - $2 )) s)"
    else
      failed+=("$1")
      echo "sanitizer $1: build FAILED (exit $3)"
      tail -n 30 "$logs/$1.log"
    fi
    return
  fi
  summarize "$1" "$logs/$1.log" "$3" "$2"
  if [ "${CI:-}" = true ]; then rm -rf "${target_root:?}/$1"; fi
}

# Miri interprets its tests on one thread, so it runs beside ASan and TSan, in the time their
# builds and test runs leave a core idle: on 2 cores the three took 251 s so against 289 s one
# after another.
miri_pid=""
for s in "${which[@]}"; do
  [ "$s" = miri ] || continue
  echo "==> sanitizer miri (in the background)"
  miri_start=$(date +%s)
  run miri &
  miri_pid=$!
done
for s in "${which[@]}"; do
  [ "$s" != miri ] || continue
  echo "==> sanitizer $s"
  t0=$(date +%s)
  if run "$s"; then rc=0; else rc=$?; fi
  finish "$s" "$t0" "$rc"
done
if [ -n "$miri_pid" ]; then
  if wait "$miri_pid"; then rc=0; else rc=$?; fi
  finish miri "$miri_start" "$rc"
fi

echo "sanitizers: ${#which[@]} run, $(( ${#which[@]} - ${#failed[@]} )) ok, ${#failed[@]} failed${failed:+ (${failed[*]})}, $(( $(date +%s) - start )) s in all"
[ "${#failed[@]}" -eq 0 ]
