#!/usr/bin/env bash
# Every test of the project, in the order a failure is cheapest to find. Installs what it needs
# (idempotently) and prints each runner's own summary line.
set -euo pipefail
cd "$(dirname "$0")/.."

# step NAME: starts a step. Each step's wall time and the CPU time its processes used (user +
# system, as the shell's `times` counts its waited-for children) are tabled at the end: where the
# run's minutes go, and how many of the cores each step kept busy.
timings=$(mktemp)
step_name="" step_began=0 step_cpu=0 cpu_now=0
# Sets cpu_now to the CPU seconds this shell's waited-for children have used. `times` must run in
# this shell: inside $(...) it would count the subshell's children only.
count_cpu() {
  local t
  t=$(mktemp)
  times >"$t"
  cpu_now=$(children_cpu "$t")
  rm -f "$t"
}
# children_cpu FILE: the user + system seconds of the children in FILE, the output of `times`.
children_cpu() {
  awk 'function s(x) { split(x, a, "m"); sub("s", "", a[2]); return a[1] * 60 + a[2] }
       NR == 2 { printf "%d", s($1) + s($2) }' "$1"
}
# table_row WALL CPU NAME
table_row() {
  printf '%6s s %6d CPU-s  %5s cores  %s\n' "$1" "$2" \
    "$(awk -v c="$2" -v w="$1" 'BEGIN { if (w > 0) printf "%.1f", c / w; else print "-" }')" "$3" >>"$timings"
}
end_step() {
  [ -n "$step_name" ] || return 0
  count_cpu
  table_row $((SECONDS - step_began)) $((cpu_now - step_cpu)) "$step_name"
}
step() {
  end_step
  count_cpu
  step_name=$1 step_began=$SECONDS step_cpu=$cpu_now
  printf '\n==> %s (%ds; %s free on disk)\n' "$*" "$SECONDS" "$(df -h --output=avail . | tail -1 | tr -d ' ')"
}

# done_with PATH...: on CI, remove build outputs once the last step that reads them has run. The
# whole run needs about 20 GB at its peak otherwise, more than a clean CI machine has free; a
# developer's machine keeps them for the next run's incremental builds. Each path is renamed at
# once (a later step may make it anew) and deleted in the background: deleting a virtualenv with
# torch and a cargo target directory waits on the disk for minutes (160 s of the distributed
# step once) while the next step could use the cores.
target=${CARGO_TARGET_DIR:-target}
cache=${STOKER_CACHE:-$HOME/.cache/stoker}
removals=()
done_with() {
  [ "${CI:-}" = true ] || return 0
  echo "CI: removing $*, no later step reads them (in the background)"
  local p doomed=()
  for p in "$@"; do
    [ -e "$p" ] || continue
    mv "$p" "$p.removing.$$"
    doomed+=("$p.removing.$$")
  done
  rm -rf "${doomed[@]}" &
  removals+=($!)
}

step "toolchain"
command -v cargo >/dev/null || { echo "cargo is required (https://rustup.rs)"; exit 1; }
if command -v rustup >/dev/null; then
  rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
  rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
  # Nightly and the components of the background jobs below, before they start: Miri's and the
  # sanitizers' start together, and two rustup installs at once into one toolchain can collide.
  rustup run nightly rustc --version >/dev/null 2>&1 || rustup toolchain install nightly --profile minimal
  for c in rust-src miri; do
    rustup component list --toolchain nightly --installed 2>/dev/null | grep -q "^$c" ||
      rustup component add "$c" --toolchain nightly
  done
fi
cargo --version
bash .ci/native-deps.sh
# libjpeg-turbo built once for every host build that links it, the fuzz targets' included (see
# the script): 21 CPU-s, against a CMake build of the whole libjpeg-turbo tree in each of them.
eval "$(bash .ci/libjpeg-turbo.sh)"

# Every step until the sanitizers leaves a core idle at times (a crate that everything after it
# waits for, a link, pytest's one thread, downloads, waits on servers and launchers). The
# fuzz targets' build, then the sanitizers' test builds and Miri, use it from the start, at the
# lowest CPU priority, so those steps mostly run rather than build. Each of them waits for its
# job and runs again itself if the background one failed, so a failure shows there with its
# output.
background_log=$(mktemp -d)
# Each in a session of its own (setsid, run directly so that $! is the session's id), so that
# leaving early stops it and its cargo, at the lowest CPU priority. Linux schedules each session
# as one group (autogroup) and a nice value ranks a process only within its group, so the new
# session's group is lowered too: without that the background builds took half the CPU from the
# steps they were to fill in for. The fuzz targets' build goes first: it compiles stoker-core as
# one unit, minutes on one core, which the foreground steps leave idle at times anyway (built
# last, it ended the run with a core idle for three to four minutes; built beside Miri, it was
# slowed into the last steps). Then two jobs side by side: the sanitizer builds, and Miri's build
# and run, mostly one thread for two to four minutes (after the sanitizer builds, it ended the run
# alone on one core for a minute or two). The CPU is busy 94-98% of a run: its length follows the
# CPU time of all its work more than the order.
lowest='echo 19 >/proc/self/autogroup 2>/dev/null || true; exec nice -n 19 "$@"'
# start_job NAME SCRIPT [ARG...]: runs the bash SCRIPT as above and sets job_id to its session's
# id. The job is not this shell's child (the subshell that starts it exits at once): bash reaps a
# child the moment it ends and adds its CPU time to whichever step is running then, which once
# tabled a step at 6 cores of 2. So the job reports its own: when SCRIPT ends, `times` of the
# job's shell into NAME.times and SCRIPT's exit status into NAME.rc, beside its log NAME.log.
start_job() {
  local name=$1 script=$2
  shift 2
  job_id=$(
    setsid bash -c "$lowest" _ bash -c "$script"'
      rc=$?; times >"$0.times"; echo "$rc" >"$0.rc"' "$background_log/$name" "$@" \
      >"$background_log/$name.log" 2>&1 </dev/null &
    echo $!
  )
}
start_job fuzz 'FUZZ_BUILD_ONLY=1 bash .ci/fuzz.sh'
fuzz_build=$job_id
start_job sanitizers 'while kill -0 "$1" 2>/dev/null; do sleep 5; done
  SANITIZERS="asan tsan" SANITIZERS_BUILD_ONLY=1 bash .ci/sanitizers.sh' "$fuzz_build"
sanitizer_build=$job_id
start_job miri 'while kill -0 "$1" 2>/dev/null; do sleep 5; done
  SANITIZERS=miri bash .ci/sanitizers.sh' "$fuzz_build"
miri_run=$job_id
trap 'kill -- -"$fuzz_build" -"$sanitizer_build" -"$miri_run" 2>/dev/null || true' EXIT
background_began=$SECONDS
# background DESCRIPTION NAME ID: waits for job NAME (session ID) to end and prints its last
# lines; fails if it failed or vanished without a status. Its CPU time gets a row of its own.
background() {
  local rc cpu job=$background_log/$2
  while [ ! -f "$job.rc" ] && kill -0 "${3:?}" 2>/dev/null; do sleep 2; done
  rc=$(cat "$job.rc" 2>/dev/null || echo 1)
  if [ "$rc" -eq 0 ]; then echo "$1 (in the background): ok"; else echo "$1 (in the background): failed; again in the foreground"; fi
  tail -n 6 "$job.log"
  cpu=$(children_cpu "$job.times" 2>/dev/null || echo 0)
  table_row "-" "${cpu:-0}" "$1, in the background since ${background_began}s"
  return "$rc"
}

step "cargo fmt --check"
cargo fmt --all -- --check

step "layout: stoker-core's imports follow ARCHITECTURE.md's module map"
python3 .ci/layout.py

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo doc (warnings denied)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --lib

step "cargo test"
cargo test --workspace 2>&1 | tee /tmp/stoker-cargo-test.log
# The modules of tests/all that measure or fork the whole process, each in a process of its own.
for alone in soak autotune fork; do
  cargo test --workspace --test all -- --ignored "$alone::" 2>&1 | tee -a /tmp/stoker-cargo-test.log
done
passed=$(grep -Eo 'test result: ok\. [0-9]+ passed' /tmp/stoker-cargo-test.log | awk '{s+=$4} END {print s+0}')
echo "cargo test: ${passed} passed, 0 failed"

step "stoker-core without its default features, every JPEG through zune-jpeg"
# The crate as `default-features = false` users get it: no cudarc (the CUDA prefetcher's logic is
# tested against the fake device), no remote fetcher, no libjpeg-turbo, so every image test runs
# on the pure-Rust decoder.
cargo clippy -p stoker-core --all-targets --no-default-features -- -D warnings
STOKER_JPEG_DECODER=zune cargo test -p stoker-core --no-default-features 2>&1 | tee /tmp/stoker-cargo-test-nocuda.log
# Of the modules that need a process of their own, `fork` runs again: what a child inherits
# differs without the CUDA and remote layers. `soak` and `autotune` measure the engine's threads,
# memory and controller, which these features do not touch; they ran in the step above.
for alone in fork; do
  STOKER_JPEG_DECODER=zune cargo test -p stoker-core --no-default-features --test all -- --ignored "$alone::" 2>&1 |
    tee -a /tmp/stoker-cargo-test-nocuda.log
done
passed=$(grep -Eo 'test result: ok\. [0-9]+ passed' /tmp/stoker-cargo-test-nocuda.log | awk '{s+=$4} END {print s+0}')
echo "cargo test (no default features, jpeg_decoder=zune): ${passed} passed, 0 failed"

# The C, C++ and remote steps link libstoker as `cargo test` just built it (cargo's dev profile:
# debug assertions on, dependencies optimised) instead of building it again in the release
# profile, a tenth of the run's CPU time (420 of 4,140 CPU-s). The release build the test command
# checks is the wheel's, which the Python and distributed steps test.
export STOKER_CARGO_PROFILE=dev

step "C ABI: the header as C11 and C++17, CTest, find_package consumer, ASan/UBSan, valgrind"
bash ctests/run.sh

step "C++ API: GoogleTest suite, LibTorch adapter, install consumer, example trainer"
bash bindings/cpp/run_tests.sh
done_with "$cache/wheels" "$cache"/libtorch-*

# After the C++ suite: its C++ reader links the C++ API that suite installed.
step "remote shards: nginx (http://, https://) and an S3 server (s3://) on 127.0.0.1, from Rust, Python, C and C++"
bash ctests/remote/run.sh
done_with "$target/debug" build-cpp .venv-remote

step "python: sdist, the manylinux wheel built from it, installed into a clean venv with torch, pytest"
bash bindings/python/run_tests.sh

step "distributed: torchrun (gloo) 2 and 3 ranks with elastic resume, mpirun -np 2"
# The wheel the Python step just built and tested, from this tree; its pytest run took in the
# torch adapter's and the distributed Python tests, which the script would run again.
STOKER_WHEEL=$(ls bindings/python/dist/stoker-*manylinux*.whl) STOKER_SKIP_PYTEST=1 \
  bash bindings/python/run_distributed_tests.sh
done_with .venv-test .venv-build "$target/zig"

step "sanitizers: the concurrency core under AddressSanitizer and ThreadSanitizer"
background "sanitizer builds" sanitizers "$sanitizer_build" || true
SANITIZERS="asan tsan" bash .ci/sanitizers.sh

step "fuzzing: every cargo-fuzz target for a bounded time (FUZZ_SECONDS, default 12)"
background "fuzz targets build" fuzz "$fuzz_build" || true
bash .ci/fuzz.sh

# Miri's job has run beside the sanitizer builds; its verdict is read last, when it has most
# likely ended.
step "Miri: the unsafe code of the arena, collate and the prefetch ring"
background "Miri's run" miri "$miri_run" || SANITIZERS=miri bash .ci/sanitizers.sh

end_step
# Removals still running (nothing is left to start) end before the run does.
[ "${#removals[@]}" -eq 0 ] || wait "${removals[@]}" || true
printf '\n==> every step passed in %d s; wall time, CPU time and cores kept busy per step:\n' "$SECONDS"
cat "$timings"
