#!/usr/bin/env bash
# The README's first command: installs the native build tools once (.ci/native-deps.sh), then
# runs the demo. Arguments go to `stoker demo` (`--help` lists them).
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/native-deps.sh
exec cargo run --release -p stoker-cli -- demo "$@"
