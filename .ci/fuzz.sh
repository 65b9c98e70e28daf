#!/usr/bin/env bash
# Bounded fuzzing of stoker-core (cargo-fuzz, libFuzzer, AddressSanitizer, nightly Rust).
#
# Targets (crates/stoker-core/fuzz/fuzz_targets): image_pipeline (encoded bytes -> decode ->
# transform), npy_header (the npy source's open), options (LoaderOptions::set), transform_spec
# (the pipeline spec parser), resume_state (ResumeState::parse), tar_members (the WebDataset
# shard scan of the indexed tar source), packed_reader (the packed format's open and per-field
# checks), wids_index (WebDataset's JSON shard index), megatron_index (Megatron-LM's `.idx`
# parse and checks), parquet_table (a `parquet:` table's open and every row's read),
# coco_raster (COCO's RLE strings and runs expanded and polygons filled into masks). Each runs
# FUZZ_SECONDS (default 12: within the test command's time it replays the seeds and mutates for
# a while; longer runs find more), FUZZ_JOBS at a time (default: 2, or 1 on a single core), from
# a corpus seeded with the committed parser seeds and the test images, tars and Parquet files;
# any crash, panic, leak, timeout or allocation over the limit fails the script
# and leaves the input under fuzz/artifacts/TARGET/.
#
#   FUZZ_SECONDS=600 FUZZ_KEEP_CORPUS=1 FUZZ_TARGETS="npy_header options" .ci/fuzz.sh
#
# Reproduce a crash: cd crates/stoker-core/fuzz && cargo +nightly fuzz run TARGET ARTIFACT
#
# FUZZ_BUILD_ONLY=1 installs what is needed and builds the targets, then stops (the test
# command builds them in the background while earlier steps leave a core idle).
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO_FUZZ_VERSION=0.13.2
FUZZ_SECONDS=${FUZZ_SECONDS:-12}
ALL_TARGETS="image_pipeline npy_header options transform_spec resume_state tar_members packed_reader wids_index megatron_index parquet_table coco_raster"
read -r -a targets <<<"${FUZZ_TARGETS:-$ALL_TARGETS}"
cores=$(nproc 2>/dev/null || echo 1)
FUZZ_JOBS=${FUZZ_JOBS:-$((cores >= 2 ? 2 : 1))}
fuzz_dir=crates/stoker-core/fuzz
triple=x86_64-unknown-linux-gnu

start=$(date +%s)
command -v rustup >/dev/null || { echo "fuzz: rustup is required (nightly toolchain)"; exit 1; }
rustup run nightly rustc --version >/dev/null 2>&1 || rustup toolchain install nightly --profile minimal
if ! cargo fuzz --version 2>/dev/null | grep -qx "cargo-fuzz $CARGO_FUZZ_VERSION"; then
  # --debug: the command only starts cargo, so nothing is gained by optimising it, and a fresh
  # machine installs it in 44 CPU-s instead of 81.
  cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked --debug
fi

echo "==> building fuzz targets (cargo +nightly fuzz build, AddressSanitizer)"
# One codegen unit per crate (cargo-fuzz's default): on 2 cores the build took 293 CPU-s against
# 347 with 16 units, and image_pipeline ran 1,783 inputs in 12 s against 1,101. 16 units end a
# build run alone sooner (179 s against 222 s), but the test command builds these targets in the
# background, where the CPU time is what it takes from the other steps; it builds them first, so
# that one unit's minutes on one core fall where the foreground steps leave a core idle.
(cd "$fuzz_dir" && CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-2} cargo +nightly fuzz build --target "$triple")
built=$(date +%s)
echo "fuzz: targets built in $((built - start)) s"
[ "${FUZZ_BUILD_ONLY:-0}" = 1 ] && exit 0

# Each run starts from the seeds (a fresh fuzz/corpus/TARGET, git-ignored), so a bounded run
# spends its time fuzzing rather than re-reading a corpus grown by earlier runs, and every run
# starts alike. FUZZ_KEEP_CORPUS=1 keeps and grows the corpus instead (long local runs).
seed() { [ -e "$2/$(basename "$1")" ] || cp "$1" "$2/"; }
for t in "${targets[@]}"; do
  [ "${FUZZ_KEEP_CORPUS:-0}" = 1 ] || rm -rf "${fuzz_dir:?}/corpus/$t"
  mkdir -p "$fuzz_dir/corpus/$t" "$fuzz_dir/artifacts/$t"
  for f in "$fuzz_dir/seeds/$t"/*; do [ -f "$f" ] && seed "$f" "$fuzz_dir/corpus/$t"; done
done
for f in crates/stoker-core/tests/data/images/*.{jpg,png,JPEG}; do
  [ -f "$f" ] && [ -d "$fuzz_dir/corpus/image_pipeline" ] && seed "$f" "$fuzz_dir/corpus/image_pipeline"
done
for f in crates/stoker-core/tests/data/tar/*.tar; do
  [ -f "$f" ] && [ -d "$fuzz_dir/corpus/tar_members" ] && seed "$f" "$fuzz_dir/corpus/tar_members"
done
for f in crates/stoker-core/tests/data/parquet/*.parquet; do
  [ -f "$f" ] && [ -d "$fuzz_dir/corpus/parquet_table" ] && seed "$f" "$fuzz_dir/corpus/parquet_table"
done

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

run_target() {
  local t=$1 dict=()
  [ -f "$fuzz_dir/dict/$t.dict" ] && dict=(-dict="$fuzz_dir/dict/$t.dict")
  # -rss_limit_mb / -malloc_limit_mb: one allocation or a process over 2 GB is a finding (every
  # size an input can reach must be bounded). -timeout: one input over 10 s is a hang.
  "$fuzz_dir/target/$triple/release/$t" "$fuzz_dir/corpus/$t" "${dict[@]}" \
    -max_total_time="$FUZZ_SECONDS" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048 \
    -artifact_prefix="$fuzz_dir/artifacts/$t/" -print_final_stats=1 \
    >"$logs/$t.log" 2>&1
}

pids=() names=()
status=0
for t in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$FUZZ_JOBS" ]; do sleep 1; done
  run_target "$t" &
  pids+=($!) names+=("$t")
done

failed=()
for i in "${!pids[@]}"; do
  t=${names[$i]}
  if wait "${pids[$i]}"; then rc=0; else rc=$?; fi
  log="$logs/$t.log"
  runs=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$' || echo "?")
  cov=$(grep -Eo 'cov: [0-9]+' "$log" | tail -1 | grep -Eo '[0-9]+' || echo "?")
  corpus=$(find "$fuzz_dir/corpus/$t" -type f | wc -l)
  if [ "$rc" -eq 0 ]; then
    echo "fuzz $t: ok, ${runs} runs in ${FUZZ_SECONDS} s, coverage ${cov}, corpus ${corpus}"
  else
    status=1
    failed+=("$t")
    echo "fuzz $t: FAILED (exit $rc) after ${runs} runs; last lines of its log:"
    grep -E 'ERROR|panicked|SUMMARY|Test unit written|out-of-memory|timeout' "$log" | head -20 || true
    tail -n 40 "$log"
  fi
done

echo "fuzz: ${#targets[@]} targets, $(( ${#targets[@]} - ${#failed[@]} )) ok, ${#failed[@]} failed${failed:+ (${failed[*]})}, $(( $(date +%s) - start )) s in all"
exit "$status"
