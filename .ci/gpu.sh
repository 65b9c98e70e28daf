#!/usr/bin/env bash
# The checks the test command cannot run, for a machine with an NVIDIA GPU:
#   - stoker-core's real-device tests (tests/all/cuda_gpu.rs: the cast and resize kernels against
#     their host references, nvJPEG against the CPU decoder and on damaged files, the loader
#     decoding on the GPU) and nvJPEG's library test;
#   - the Python tests that skip without a GPU (`is_pinned()` on the porting path, `gpu_normalize`
#     bit for bit, GPU decoding against the CPU's), which must pass here, not skip;
#   - `stoker bench scaling` up to every core, with `device=cuda` and the pinned-copy bandwidth;
#   - the GPU trainer benchmark, bench/gpu_trainer.py, with every core and ResNet-50 with 8;
#   - `stoker doctor` naming the GPU decode share as a remedy when decoding bounds a pipeline.
#
#   bash .ci/gpu.sh build KIT         builds the release wheel, the test binaries and the
#                                     benchmark's photographs into one archive, KIT (needs Rust,
#                                     what the test command installs, and the network)
#   bash .ci/gpu.sh run KIT RESULTS   runs every check from KIT in a checkout of the commit KIT
#                                     was built from and writes summary.txt and one log per check
#                                     into RESULTS; needs neither Rust nor the network, only a
#                                     CUDA driver and python3 with torch, torchvision, Pillow,
#                                     numpy and pytest
#   bash .ci/gpu.sh                   both, on one machine (into .gpu/)
#
# Split in two because GPU machines often have neither a Rust toolchain nor the network. The
# wheel is the one users install (glibc 2.17, stripped), installed with pip into a folder of the
# run's own. Each check has a time limit and the run ends within STOKER_GPU_SECONDS (default
# 540); a check that fails or runs out of time does not stop the others. Exits 1 when any check
# failed, skipped or was not reached.
set -euo pipefail
CALLER=$PWD
cd "$(dirname "$0")/.."
ROOT=$PWD

# A path given on the command line, from the directory the script was started in.
absolute() {
  case $1 in
    /*) echo "$1" ;;
    *) echo "$CALLER/$1" ;;
  esac
}

build() {
  local kit work
  kit=$(absolute "$1")
  work=$(mktemp -d)
  trap "rm -rf '$work'" EXIT
  mkdir -p "$work/tests" "$work/photos"
  bash .ci/native-deps.sh # CMake and nasm, for libjpeg-turbo

  echo "==> the wheel (bindings/python/build_wheel.sh)" >&2
  STOKER_SKIP_SDIST=1 bash bindings/python/build_wheel.sh >/dev/null
  cp bindings/python/dist/stoker-*manylinux*.whl "$work/"

  echo "==> stoker-core's test binaries (dev profile, as the test command builds them)" >&2
  eval "$(bash .ci/libjpeg-turbo.sh)"
  # Cargo's JSON messages name each test binary it built: the library's (nvJPEG's library test)
  # and tests/all's.
  cargo test -p stoker-core --no-run --message-format=json | python3 -c '
import json, shutil, subprocess, sys
out = sys.argv[1]
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact" or not m.get("executable") or not m["profile"]["test"]:
        continue
    kind, name = m["target"]["kind"][0], m["target"]["name"]
    if (kind, name) in (("lib", "stoker_core"), ("test", "all")):
        dst = f"{out}/core-{kind}"
        shutil.copy(m["executable"], dst)
        subprocess.run(["strip", "--strip-debug", dst], check=True)
' "$work/tests"
  [ -x "$work/tests/core-lib" ] && [ -x "$work/tests/core-test" ] ||
    { echo "cargo built no stoker-core test binaries" >&2; return 1; }

  echo "==> the photographs of Debian's mate-backgrounds (bench/photos.sh)" >&2
  cp "$(bash bench/photos.sh)"/*.jpg "$work/photos/"

  git describe --always --dirty >"$work/COMMIT"
  mkdir -p "$(dirname "$kit")"
  tar -C "$work" -cf - . | xz -T0 -6 >"$kit"
  echo "$kit: $(du -h "$kit" | cut -f1), built from $(cat "$work/COMMIT")" >&2
  rm -rf "$work"
  trap - EXIT
}

# nvJPEG, when the dynamic linker does not find it by name (stoker-core's own search): the CUDA
# toolkit's folders and pip's nvidia wheels. Prints the path, or nothing.
find_nvjpeg() {
  ldconfig -p 2>/dev/null | grep -Eq 'libnvjpeg\.so\.1[23] ' && return 0
  local site
  site=$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null || true)
  # shellcheck disable=SC2086 # several folders
  find /usr/local/cuda*/ /usr/lib/x86_64-linux-gnu $site -name 'libnvjpeg.so.1[23]*' 2>/dev/null |
    sort -V | tail -n 1
}

# Each check is a function run by `check` in a bash of its own, under `timeout`.
rust_tests() {
  # The test images are read through CARGO_MANIFEST_DIR, which cargo would set.
  export CARGO_MANIFEST_DIR=$ROOT/crates/stoker-core
  local failed=0
  "$WORK/tests/core-test" --test-threads 1 --nocapture cuda_gpu:: || failed=1
  STOKER_TEST_NVJPEG=${STOKER_NVJPEG_LIBRARY:-1} "$WORK/tests/core-lib" --nocapture --exact \
    cuda::nvjpeg::tests::real_library_when_asked || failed=1
  return "$failed"
}

python_tests() {
  # -rs prints each skip's reason, which `check` looks for; a missing torch fails, not skips.
  cd bindings/python
  STOKER_REQUIRE_TORCH=1 python3 -m pytest -p no:cacheprovider -rs -v tests/test_torch.py \
    tests/test_images.py -k 'gpu_normalize or gpu_decode or pin_memory_is_what_torch'
}

scaling_bench() {
  # The folder of photographs it builds (about 9,600 images, ImageNet's sizes) is the trainer's.
  "$WORK/site/bin/stoker" bench scaling --per-class 800 --epochs 1
}

trainer_bench() {
  PYTHONUNBUFFERED=1 python3 bench/gpu_trainer.py "$XDG_CACHE_HOME/stoker/imagenet-like-800"
}

trainer_bench_8_workers() {
  # ResNet-50 should stay at its ceiling with at most 8 worker threads.
  PYTHONUNBUFFERED=1 python3 bench/gpu_trainer.py "$XDG_CACHE_HOME/stoker/imagenet-like-800" \
    --models resnet50 --workers 8
}

doctor_gpu() {
  # Decoding is what bounds this pipeline flat out: with a GPU, the remedies include its share.
  # The report goes to the log (stderr) and through grep, which reads it all.
  "$WORK/site/bin/stoker" doctor "image_folder:$XDG_CACHE_HOME/stoker/imagenet-like-800" \
    --set "transform=random_resized_crop(224) | hflip | normalize(imagenet)" |
    tee /dev/stderr | grep -c gpu_decode_share >/dev/null
}

check() {
  local name=$1 limit=$2 log=$3 fn=$4 left status start
  left=$((DEADLINE - SECONDS))
  ((left < limit)) && limit=$left
  if ((limit < 10)); then
    printf '%-12s %5s  %s\n' "NOT RUN" "-" "$name (the run's time was spent)" | tee -a "$SUMMARY"
    FAILED=1
    return
  fi
  printf '\n==> %s (at most %d s)\n' "$name" "$limit" | tee "$RESULTS/$log"
  start=$SECONDS
  if timeout -k 10 "$limit" bash -c "set -euo pipefail; $fn" >>"$RESULTS/$log" 2>&1; then
    status=ok
    # What skips without a GPU says so (tests, benchmarks' device rows): here that is a failure.
    if grep -Eq 'no CUDA|needs a GPU' "$RESULTS/$log"; then
      status=SKIPPED
      FAILED=1
    fi
  else
    case $? in
      124 | 137) status="TIMED OUT" ;;
      *) status=FAILED ;;
    esac
    FAILED=1
  fi
  printf '%-12s %4d s  %s (%s)\n' "$status" $((SECONDS - start)) "$name" "$log" | tee -a "$SUMMARY"
}

run() {
  local kit
  kit=$(absolute "$1")
  RESULTS=$(absolute "$2")
  mkdir -p "$RESULTS"
  SUMMARY=$RESULTS/summary.txt
  DEADLINE=$((SECONDS + ${STOKER_GPU_SECONDS:-540}))
  FAILED=0
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/stoker-gpu.XXXXXX")
  trap 'rm -rf "$WORK"' EXIT
  : >"$SUMMARY"

  # Python's tarfile reads xz where the xz command is not installed.
  python3 -c 'import sys, tarfile
with tarfile.open(sys.argv[1]) as kit:
    kit.extractall(sys.argv[2], **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))' \
    "$kit" "$WORK"
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" "$WORK"/stoker-*.whl
  export ROOT WORK PYTHONPATH=$WORK/site${PYTHONPATH:+:$PYTHONPATH}
  # The CLI looks for the photographs in its cache before fetching them.
  export XDG_CACHE_HOME=$WORK/cache
  local photos=$XDG_CACHE_HOME/stoker/mate-backgrounds/usr/share/backgrounds/mate/nature
  mkdir -p "$photos" && cp "$WORK"/photos/*.jpg "$photos/"
  local nvjpeg
  nvjpeg=$(find_nvjpeg || true)
  [ -z "$nvjpeg" ] || export STOKER_NVJPEG_LIBRARY=$nvjpeg

  {
    echo "kit built from $(cat "$WORK/COMMIT"); checkout: $(git describe --always --dirty 2>/dev/null || echo 'not a git checkout')"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 || true
    echo "cores: $(nproc), memory: $(free -g | awk '/^Mem/ {print $2}') GiB, kernel $(uname -r)"
    python3 -c 'import sys, torch, torchvision; print("python", sys.version.split()[0], "torch", torch.__version__, "torchvision", torchvision.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.is_available())' 2>&1 || true
    echo "nvJPEG: ${STOKER_NVJPEG_LIBRARY:-by name, through the dynamic linker}"
    "$WORK/site/bin/stoker" --version 2>&1 || true
  } | tee "$RESULTS/env.txt"
  export -f rust_tests python_tests scaling_bench trainer_bench trainer_bench_8_workers doctor_gpu
  export STOKER_NVJPEG_LIBRARY

  check "Rust: real-device tests, nvJPEG's library test" 150 rust.log rust_tests
  check "Python: the GPU tests" 150 python.log python_tests
  check "stoker bench scaling" 150 scaling.log scaling_bench
  check "bench/gpu_trainer.py" 300 trainer.log trainer_bench
  check "bench/gpu_trainer.py, ResNet-50 with 8 workers" 150 trainer8.log trainer_bench_8_workers
  check "stoker doctor names the GPU decode share" 60 doctor.log doctor_gpu
  printf '\n==> %s\n' "summary ($RESULTS)"
  cat "$SUMMARY"
  return "$FAILED"
}

case "${1:-}" in
  build) build "${2:?usage: .ci/gpu.sh build KIT}" ;;
  run) run "${2:?usage: .ci/gpu.sh run KIT RESULTS}" "${3:?usage: .ci/gpu.sh run KIT RESULTS}" ;;
  "") build .gpu/kit.tar.xz && run .gpu/kit.tar.xz .gpu/results ;;
  *) echo "usage: .ci/gpu.sh [build KIT | run KIT RESULTS]" >&2; exit 2 ;;
esac
