#!/usr/bin/env bash
# Tests of the Python package as users get it: the release wheel (build_wheel.sh) checked
# (manylinux tag, stripped binaries with their debug info split off, the console command),
# installed into a clean virtualenv with numpy, pillow, pytest and torch, and the suite run
# against the installed package under `python -X dev -X faulthandler`. The wheel is built from
# the sdist, which proves the sdist builds.
#
#   bash bindings/python/run_tests.sh     (from anywhere)
#
# Environment:
#   STOKER_FRESH_VENV=1   recreate the test virtualenv even when it verifies clean
#   STOKER_SKIP_SDIST=1   no sdist: the wheel is built from the tree
# The virtualenvs live at the repository root (.venv-test, .venv-build); pip's cache
# (~/.cache/pip) keeps torch's wheels, so a rerun downloads nothing.
# webdataset writes the tar shards of test_tar.py (its TarWriter is the reference writer), and
# megatron-core the Megatron datasets of test_tokens.py, pyarrow and tokenizers the Parquet files
# and tokenizer of test_parquet.py.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
TORCH_VERSION=2.15.0 # the LibTorch version of bindings/cpp/run_tests.sh
VENV="$ROOT/.venv-test"
TORCHVISION_VERSION=0.29.2 # torchvision v2, the reference of the augmentation tests (requires torch >= 2.14)
MEGATRON_CORE_VERSION=0.16.1 # its IndexedDatasetBuilder writes the Megatron datasets of test_tokens.py (0.17 on needs Python 3.12)
PARQUET_TEXT="pyarrow==26.0.1 tokenizers==0.23.3"
REQUIREMENTS="numpy pillow pytest mypy webdataset torch==$TORCH_VERSION torchvision==$TORCHVISION_VERSION megatron-core==$MEGATRON_CORE_VERSION $PARQUET_TEXT"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
START=$SECONDS
checks=0

step() { printf '\n==> %s (%ds)\n' "$*" $((SECONDS - START)); }
die() { printf 'run_tests.sh: FAILED: %s\n' "$*" >&2; exit 1; }
ok() { checks=$((checks + 1)); echo "ok: $*"; }

work="$(mktemp -d "${TMPDIR:-/tmp}/stoker-python.XXXXXX")"
trap 'kill "${venv_pid:-}" 2>/dev/null || true; rm -rf "$work"' EXIT

version="$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)"
[ -n "$version" ] || die "no version under [workspace.package] in Cargo.toml"

# ---- a clean virtualenv ---------------------------------------------------------------------------
# Reused only while it holds exactly what this script installed (pip freeze as recorded at
# creation) and no trace of a previous stoker; otherwise recreated. Made in the background while
# the wheel builds: installing torch mostly waits on the network, building mostly on the CPU.
test_venv() {
  local clean=0
  if [ "${STOKER_FRESH_VENV:-0}" != 1 ] && [ -x "$VENV/bin/python" ] &&
    [ "$(cat "$VENV/.requirements" 2>/dev/null)" = "$REQUIREMENTS" ]; then
    "$VENV/bin/python" -m pip uninstall -q -y stoker >/dev/null 2>&1 || true
    if [ "$("$VENV/bin/python" -m pip freeze)" = "$(cat "$VENV/.freeze")" ] &&
      [ ! -e "$VENV/bin/stoker" ] &&
      [ -z "$("$VENV/bin/python" -c 'import importlib.util as u; print(u.find_spec("stoker") or "")')" ]; then
      clean=1
    fi
  fi
  if [ "$clean" = 1 ]; then
    echo "reused: pip freeze matches the recorded set and no stoker is left"
  else
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    # --no-compile: Python compiles the modules a test imports when it first imports them; pip
    # would compile all of torch's and the others' (24 of the install's 69 CPU-s).
    # shellcheck disable=SC2086
    "$VENV/bin/python" -m pip install -q --no-compile $REQUIREMENTS
    "$VENV/bin/python" -m pip freeze >"$VENV/.freeze"
    echo "$REQUIREMENTS" >"$VENV/.requirements"
    echo "created"
  fi
  "$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)'
}
test_venv >"$work/venv.log" 2>&1 &
venv_pid=$!

# ---- build -------------------------------------------------------------------------------
step "build the sdist and the wheel from it (build_wheel.sh); the test virtualenv meanwhile"
STOKER_SKIP_SDIST="${STOKER_SKIP_SDIST:-0}" bash bindings/python/build_wheel.sh >"$work/artifacts.txt" ||
  die "build_wheel.sh failed"
wheel="$(tail -n 2 "$work/artifacts.txt" | head -n 1)"
sdist="$(tail -n 1 "$work/artifacts.txt")"
[ -f "$wheel" ] || die "build_wheel.sh named no wheel"
echo "wheel: $wheel ($(du -k "$wheel" | cut -f1) KiB)"

# ---- the wheel as a file -----------------------------------------------------------------------
step "the wheel: manylinux tag, stripped binaries, debug info apart"
tag="$("$ROOT/.venv-build/bin/auditwheel" show "$wheel" 2>/dev/null | grep -o 'manylinux_[0-9]*_[0-9]*_x86_64' | head -n 1 || true)"
[ -n "$tag" ] || die "auditwheel show reports no manylinux tag for $wheel"
case "$(basename "$wheel")" in *"$tag"*) ;; *) die "$(basename "$wheel") is not tagged $tag" ;; esac
ok "auditwheel: $tag"
mkdir "$work/unpacked"
(cd "$work/unpacked" && python3 -m zipfile -e "$wheel" .)
lib="$work/unpacked/stoker/_lib/libstoker.so"
cli="$work/unpacked/stoker-${version}.data/scripts/stoker"
[ -f "$work/unpacked/stoker/py.typed" ] || die "the wheel has no stoker/py.typed"
ok "py.typed"
debug_dir="$ROOT/bindings/python/dist/debug"
for f in "$lib" "$cli"; do
  name="$(basename "$f")"
  [ -f "$f" ] || die "the wheel has no $name"
  # Outputs are captured before grep reads them (`cmd | grep -q` can fail under pipefail).
  # Stripped: no static symbol table (what `file` calls "stripped") and no debug info
  # (.debug_gdb_scripts is none: a few loaded bytes naming Rust's gdb pretty-printers).
  out="$(readelf -S -W "$f")"
  if grep -q ' \.symtab ' <<<"$out"; then die "$name is not stripped (.symtab)"; fi
  if grep -Eq '\.debug_(info|line|abbrev|str|ranges|loc)' <<<"$out"; then
    die "$name still has debug info sections"
  fi
  link="$(readelf --string-dump=.gnu_debuglink "$f" | sed -n 's/^ *\[ *0\] *//p')"
  [ "$link" = "$name.debug" ] || die "$name: .gnu_debuglink is '$link', not $name.debug"
  [ -f "$debug_dir/$name.debug" ] || die "no $debug_dir/$name.debug"
  id() { readelf -n "$1" 2>/dev/null | sed -n 's/.*Build ID: //p'; }
  [ -n "$(id "$f")" ] && [ "$(id "$f")" = "$(id "$debug_dir/$name.debug")" ] ||
    die "$name and $name.debug have different build IDs"
  out="$(readelf -S -W "$debug_dir/$name.debug")"
  grep -q '\.debug_line' <<<"$out" || die "$name.debug has no line tables"
  ok "$name stripped ($(du -k "$f" | cut -f1) KiB), debug info in $name.debug ($(du -k "$debug_dir/$name.debug" | cut -f1) KiB, same build ID)"
done

step "test virtualenv $VENV (made while the wheel was built)"
wait "$venv_pid" || { cat "$work/venv.log"; die "making the test virtualenv failed"; }
cat "$work/venv.log"

step "install the wheel"
"$VENV/bin/python" -m pip install -q "$wheel"
got="$("$VENV/bin/stoker" --version)"
[ "$got" = "stoker $version" ] || die "stoker --version printed '$got', not 'stoker $version'"
ok "stoker --version: $got"
"$VENV/bin/stoker" demo --help >"$work/demo-help.txt" || die "stoker demo --help failed"
grep -q -- '--images' "$work/demo-help.txt" || die "stoker demo --help does not list --images"
ok "stoker demo --help"
"$VENV/bin/stoker" bench npy --help >/dev/null || die "stoker bench npy --help failed"
ok "stoker bench npy --help"

step "pytest on the installed package (python -X dev -X faulthandler)"
# Run from outside the source tree so that `import stoker` can only find the installed copy.
(cd "$work" && STOKER_TEST_INSTALLED=1 STOKER_REQUIRE_TORCH=1 \
  env -u STOKER_LIBRARY "$VENV/bin/python" -X dev -X faulthandler -m pytest -p no:cacheprovider \
  -q -rs "$ROOT/bindings/python/tests")

step "the cast and resize kernels: cast.cu and resize.cu run on the CPU, cast.ptx and resize.ptx assembled for sm_75 to sm_90 (nvJitLink of torch's CUDA wheels)"
"$VENV/bin/python" crates/stoker-core/kernels/check_kernels.py || die "the cast and resize kernels failed their check"
ok "cast and resize kernels"

step "type annotations: mypy --strict on the package, and on user code against the installed wheel"
(cd bindings/python && "$VENV/bin/python" -m mypy --no-incremental src/stoker)
# From outside the tree, mypy can only see the installed package: it needs the wheel's py.typed.
(cd "$work" && "$VENV/bin/python" -m mypy --no-incremental \
  --config-file "$ROOT/bindings/python/pyproject.toml" "$ROOT/bindings/python/tests/typecheck_user.py")
ok "mypy --strict"

# ---- the sdist ------------------------------------------------------------------------------------
# build_wheel.sh built the wheel tested above from the sdist (pip unpacked it and cargo built
# it), so the sdist builds; here, that it holds what a build from it needs and nothing more.
if [ -n "$sdist" ]; then
  step "sdist: $(basename "$sdist") holds the workspace a build needs (the wheel was built from it)"
  listing="$(tar -tzf "$sdist" | sed 's|^[^/]*/||')"
  for f in setup.py pyproject.toml src/stoker/__init__.py src/stoker/py.typed rust/Cargo.toml \
    rust/Cargo.lock rust/include/stoker.h rust/crates/stoker-core/src/lib.rs \
    rust/crates/stoker-core/kernels/cast.ptx \
    rust/crates/stoker-capi/src/lib.rs rust/crates/stoker-cli/src/main.rs; do
    grep -qx "$f" <<<"$listing" || die "the sdist has no $f"
  done
  if grep -Eq '^rust/crates/[^/]+/(tests|fuzz|benches)/' <<<"$listing"; then
    die "the sdist carries tests or fuzz targets: $(grep -E '^rust/crates/[^/]+/(tests|fuzz|benches)/' <<<"$listing" | head -3)"
  fi
  ok "sdist: $(wc -l <<<"$listing") entries, the workspace's crates and lock file, no tests"
fi

echo
echo "python packaging: $checks passed, 0 failed ($((SECONDS - START))s)"
