#!/usr/bin/env bash
# Distributed tests with the real launchers, on CPU:
#   - the torch adapter's and the distributed Python tests (pytest, torch installed; skipped with
#     STOKER_SKIP_PYTEST=1);
#   - torchrun --nproc_per_node=2 and =3 (gloo): a DDP training loop over stoker.torch.DataLoader
#     whose ranks all_gather the sample ids of every step; exact coverage per epoch, equal step
#     counts, the same loader state on every rank; killed mid-epoch (SIGKILL) and resumed from
#     2 ranks to 3 and from 3 to 2, coverage exact across the restart;
#   - torchrun with 4, then 3, then 4 ranks over a Megatron token stream: every global batch the
#     same as one process's, across both resumes, other micro-batch sizes and worker counts;
#   - a C program as a 2-rank Open MPI job (mpirun -np 2) reading the OMPI_* variables.
# Every launch runs under `timeout`, so a hang fails instead of blocking.
#
# Uses the venv of run_tests.sh (.venv-test at the repository root), adding torch 2.15.0 from
# PyPI (pip's cache is kept), and installs Debian's openmpi-bin when mpirun is missing. The
# package is built from the tree, or STOKER_WHEEL names a wheel of it to install instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
start=$SECONDS
step() { printf '\n==> %s (%ds)\n' "$*" $((SECONDS - start)); }

passed=0
failed=0
failures=()
ok() { passed=$((passed + 1)); echo "PASS: $1"; }
ko() { failed=$((failed + 1)); failures+=("$1"); echo "FAIL: $1"; }

step "venv with torch 2.15.0 and the stoker package"
venv=.venv-test
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install -q numpy pillow pytest "torch==2.15.0"
if [ -n "${STOKER_WHEEL:-}" ]; then
  # The wheel run_tests.sh built from this tree (the test command passes it): no second build.
  "$py" -m pip install -q --force-reinstall --no-deps "$STOKER_WHEEL"
else
  "$py" -m pip install -q --force-reinstall --no-deps ./bindings/python
fi
unset STOKER_LIBRARY

if ! command -v mpirun >/dev/null; then
  step "installing openmpi-bin"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get install -y -qq openmpi-bin || { $sudo apt-get update -qq && $sudo apt-get install -y -qq openmpi-bin; }
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/stoker-dist.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# STOKER_SKIP_PYTEST=1: the test command has just run these files in its Python step, in this venv
# against the same wheel, so it skips them here.
if [ "${STOKER_SKIP_PYTEST:-0}" != 1 ]; then
  step "pytest: the torch adapter and the distributed Python tests"
  rc=0
  "$py" -m pytest -q -p no:cacheprovider bindings/python/tests/test_torch.py \
    bindings/python/tests/test_distributed.py 2>&1 | tee "$work/pytest.log" || rc=$?
  summary="$(tail -1 "$work/pytest.log")"
  count() { grep -oE "[0-9]+ $1" <<<"$summary" | cut -d' ' -f1 || true; }
  p="$(count passed)"
  f="$(count failed)"
  e="$(count 'errors?')"
  passed=$((passed + ${p:-0}))
  failed=$((failed + ${f:-0} + ${e:-0}))
  if ((rc != 0)) && [ -z "$f$e" ]; then failed=$((failed + 1)); fi
  ((rc == 0)) || failures+=("pytest: $summary")
fi

step "data: 101 samples, ids as labels"
"$py" - "$work" <<'PY'
import sys
import numpy as np
n = 101
x = np.random.default_rng(0).standard_normal((n, 8)).astype(np.float32)
np.save(f"{sys.argv[1]}/x.npy", x)
np.save(f"{sys.argv[1]}/y.npy", np.arange(n, dtype=np.int64))
PY
train=bindings/python/distributed/ddp_train.py
check=bindings/python/distributed/check_coverage.py
# torchrun_job NPROC ARGS...: one torchrun run on this machine (rendezvous on localhost); its
# output goes to $work/torchrun.log, shown (less torchrun's warnings) by `show_log` on failure.
torchrun_job() {
  local nproc=$1
  shift
  timeout 180 "$venv/bin/torchrun" --standalone --nproc_per_node="$nproc" "$train" \
    --data "$work" "$@" >"$work/torchrun.log" 2>&1
}
show_log() { grep -v '^W[0-9]' "$work/torchrun.log" | tail -60; }
scenario() {
  local name=$1 w1=$2 kill=$3 w2=$4 epochs=$5
  local log="$work/$name.jsonl" ckpt="$work/$name.ckpt"
  rm -f "$log" "$ckpt"
  step "torchrun: $name"
  # The ranks SIGKILL themselves after step $kill: torchrun must report the failure.
  if torchrun_job "$w1" --sample-log "$log" --ckpt "$ckpt" --epochs "$epochs" --kill-at "$kill"; then
    ko "$name: the killed run exited 0"; return
  fi
  if [ "$(grep -c '"ids"' "$log")" != "$kill" ]; then
    ko "$name: the killed run did not reach step $kill"; show_log; return
  fi
  if ! torchrun_job "$w2" --sample-log "$log" --ckpt "$ckpt" --epochs "$epochs" --resume; then
    ko "$name: the resumed run failed or timed out"; show_log; return
  fi
  if "$py" "$check" "$log" 101 4 "$epochs"; then ok "$name"; else ko "$name: coverage"; fi
}
# 101 samples in batches of 4: 13 steps per epoch at 2 ranks, 9 at 3. Each scenario also runs
# whole epochs and an epoch boundary without a restart at both world sizes (2 -> 3: epoch 0 and
# the start of epoch 1 at 2 ranks, epoch 2 at 3; 3 -> 2: epoch 1 at 2), so runs that are never
# killed would check nothing more (they took 45 s of the step on 2 cores).
scenario "nproc=2 killed in epoch 1 (step 18), resumed at nproc=3" 2 18 3 3
scenario "nproc=3 killed in epoch 0 (step 4), resumed at nproc=2" 3 4 2 2

step "torchrun: a token stream's global batches resumed at world sizes 4, 3 and 4"
# Three Megatron datasets written by the Python tests' writer; 6 global steps of 24 windows cross
# the epoch's end. Each run has other micro-batch sizes and worker counts; the checker takes the
# same 6 steps in one process.
tokens="$work/tokens"
mkdir -p "$tokens"
PYTHONPATH=bindings/python/tests "$py" - "$tokens" <<'PY'
import sys
from test_tokens import documents, write_megatron
for k, name in enumerate(["web", "code", "books"]):
    write_megatron(f"{sys.argv[1]}/{name}", documents(60, 1000 * (k + 1)))
PY
token_job() {
  timeout 180 "$venv/bin/torchrun" --standalone --nproc_per_node="$1" \
    bindings/python/distributed/token_steps.py --data "$tokens/{web,code,books}" \
    --sample-log "$tokens/steps.jsonl" --state "$tokens/state" "${@:2}" >"$work/torchrun.log" 2>&1
}
if token_job 4 --steps 2 --micro 1 --workers 0 &&
  token_job 3 --steps 3 --micro 2 --workers 4 --resume &&
  token_job 4 --steps 1 --micro 3 --workers 1 --resume; then
  if "$py" bindings/python/distributed/token_steps.py --check --data "$tokens/{web,code,books}" \
    --sample-log "$tokens/steps.jsonl" --steps 6; then
    ok "token stream 4 -> 3 -> 4 ranks"
  else
    ko "token stream 4 -> 3 -> 4 ranks: global batches differ"
  fi
else
  ko "token stream 4 -> 3 -> 4 ranks: torchrun failed or timed out"
  show_log
fi

step "mpirun -np 2: a C program reading the Open MPI variables"
lib="$("$py" -c 'import stoker; print(stoker.LIBRARY_PATH)')"
mkdir -p "$work/lib"
cp "$lib" "$work/lib/libstoker.so.0"
ln -sf libstoker.so.0 "$work/lib/libstoker.so"
if cc -std=c11 -Wall -Wextra -Werror -pedantic -D_POSIX_C_SOURCE=200809L -Iinclude -Ictests \
    ctests/mpi_cover.c -o "$work/mpi_cover" -L"$work/lib" -lstoker -Wl,-rpath,"$work/lib" &&
  bash ctests/mpi_cover.sh "$work/mpi_cover"; then
  ok "mpirun -np 2 coverage"
else
  ko "mpirun -np 2 coverage"
fi

echo
for f in "${failures[@]+"${failures[@]}"}"; do echo "FAILED: $f"; done
echo "distributed tests took $((SECONDS - start)) s"
echo "distributed: $passed passed, $failed failed"
((failed == 0))
