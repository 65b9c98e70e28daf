#!/usr/bin/env bash
# Tests of the Python package as a user gets it: `pip install ./bindings/python` into a venv
# (.venv-test at the repository root, reused across runs), which builds libstoker with cargo and
# bundles it, then pytest on the installed package.
#
# webdataset writes the tar shards of test_tar.py (its TarWriter is the reference writer).
# torch is not installed here (its PyPI wheel pulls several GB of CUDA libraries), so the torch
# tests skip; set STOKER_TEST_TORCH=1 to install it and run them too.
set -euo pipefail
cd "$(dirname "$0")/../.."

venv=.venv-test
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q numpy pillow pytest webdataset
if [ "${STOKER_TEST_TORCH:-0}" = 1 ]; then
  "$venv/bin/python" -m pip install -q torch
fi
# STOKER_LIBRARY, when set, is bundled instead of building; unset it for the tests themselves so
# they exercise the copy inside the installed package.
"$venv/bin/python" -m pip install -q --force-reinstall --no-deps ./bindings/python
env -u STOKER_LIBRARY "$venv/bin/python" -m pytest -q -p no:cacheprovider bindings/python/tests
