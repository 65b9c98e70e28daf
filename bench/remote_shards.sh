#!/usr/bin/env bash
# Remote shards beside local ones in one run (see bench/remote_shards.py): nginx on 127.0.0.1
# serves the shards, a proxy adds LATENCY_MS (default 50) to every request. Needs nginx (apt)
# and a venv with numpy and Pillow (made here as .venv-remote-bench); builds libstoker.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || apt-get install -y -q nginx-light >/dev/null
nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)
venv=.venv-remote-bench
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -c 'import numpy, PIL' 2>/dev/null || "$venv/bin/pip" install -q numpy pillow
cargo build -q --release -p stoker-capi

work=$(mktemp -d /tmp/stoker-remote-bench.XXXXXX)
chmod 755 "$work"  # nginx workers (an unprivileged user under root) read the shards
data=${STOKER_BENCH_SHARDS:-$work/www}
mkdir -p "$data" "$work/nginx"
nginx_pid=""
trap '[ -n "$nginx_pid" ] && kill "$nginx_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
port=$("$venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat > "$work/nginx/nginx.conf" <<CONF
worker_processes 1;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log;
events { worker_connections 256; }
http {
  access_log off;
  client_body_temp_path $work/nginx/body;
  proxy_temp_path $work/nginx/proxy;
  fastcgi_temp_path $work/nginx/fastcgi;
  uwsgi_temp_path $work/nginx/uwsgi;
  scgi_temp_path $work/nginx/scgi;
  server { listen 127.0.0.1:$port; root $data; }
}
CONF
timeout 1200 "$nginx_bin" -c "$work/nginx/nginx.conf" -p "$work/nginx" -g 'daemon off;' &
nginx_pid=$!
sleep 0.5
STOKER_LIBRARY="$root/target/release/libstoker.so" PYTHONPATH="$root/bindings/python/src" \
  "$venv/bin/python" bench/remote_shards.py "$data" "$port" --latency-ms "${LATENCY_MS:-50}" "$@"
