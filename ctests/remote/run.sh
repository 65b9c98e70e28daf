#!/usr/bin/env bash
# Remote shards against real servers on 127.0.0.1: nginx (Debian's package) serving WebDataset
# shards over HTTP and over HTTPS (a certificate from a test authority made here with openssl),
# and moto's S3-compatible server for s3://. Reads them from Rust (the ignored tests of
# crates/stoker-core/tests/all/remote_servers.rs), Python, C and C++. Installs nginx and openssl
# (apt) and moto (pip, into .venv-remote) when missing; the servers listen on free loopback
# ports, live at most 15 minutes, and are stopped on exit.
#
# The C++ reader links the installed C++ API: bindings/cpp/run_tests.sh installs it to
# build-cpp/install, which this script uses (STOKER_CPP_PREFIX to point elsewhere).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

cpp_prefix=${STOKER_CPP_PREFIX:-$root/build-cpp/install}
if [ ! -f "$cpp_prefix/lib/cmake/stoker/stokerConfig.cmake" ]; then
  echo "remote shards: no installed C++ API under $cpp_prefix; run bindings/cpp/run_tests.sh first" >&2
  exit 1
fi

step() { printf '\n--> %s\n' "$*"; }

missing=()
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing+=(nginx-light)
command -v openssl >/dev/null || missing+=(openssl)
if [ ${#missing[@]} -gt 0 ]; then
  step "installing ${missing[*]} (apt)"
  as_root=""
  [ "$(id -u)" = 0 ] || as_root="sudo"
  timeout 300 $as_root apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 \
    || { timeout 300 $as_root apt-get update -q >/dev/null && timeout 300 $as_root apt-get install -y -q "${missing[@]}" >/dev/null; }
fi
nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)

venv=${STOKER_REMOTE_VENV:-$root/.venv-remote}
if [ ! -x "$venv/bin/moto_server" ]; then
  step "installing moto[server], boto3, numpy into $venv"
  python3 -m venv "$venv"
  timeout 600 "$venv/bin/pip" install -q "moto[server]>=5,<6" "boto3>=1.34" "numpy>=1.22"
fi
py="$venv/bin/python"

work=$(mktemp -d /tmp/stoker-remote.XXXXXX)
# nginx workers run as an unprivileged user when started as root: they must read the shards.
chmod 755 "$work"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_port() {
  "$py" - "$1" <<'PY'
import socket, sys, time
deadline = time.time() + 30
while time.time() < deadline:
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1).close()
        sys.exit(0)
    except OSError:
        time.sleep(0.1)
sys.exit("server on 127.0.0.1:%s did not start in 30 s" % sys.argv[1])
PY
}

step "shards"
samples=40
mkdir -p "$work/www"
"$py" - "$work/www" "$samples" <<'PY'
import io, sys, tarfile
out, samples = sys.argv[1], int(sys.argv[2])
sizes = [13, 7, 12, samples - 32]
g = 0
for s, n in enumerate(sizes):
    with tarfile.open(f"{out}/shard-{s:03d}.tar", "w", format=tarfile.USTAR_FORMAT) as t:
        for _ in range(n):
            for ext, data in (("cls", str(g).encode()), ("txt", b"x" * (1 + g % 7))):
                info = tarfile.TarInfo(f"k{g:06d}.{ext}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
            g += 1
# A WebDataset shard index (wids), as `widsindex create` writes it (webdataset 0.2.x, whose
# wids package needs torch to run): shard URLs relative to the index, with their counts.
import json, os
shards = [f"shard-{s:03d}.tar" for s in range(len(sizes))]
index = {"__kind__": "wids-shard-index-v1", "wids_version": 1, "name": "shard",
         "shardlist": [{"url": name, "nsamples": n, "filesize": os.path.getsize(f"{out}/{name}")}
                       for name, n in zip(shards, sizes)]}
with open(f"{out}/train.json", "w") as f:
    json.dump(index, f, indent=2)
# Token streams: a Megatron dataset (uint16, one sequence per document, as Megatron-LM's
# _IndexWriter lays it out), a flat uint16 file, and one with its sidecar of document lengths,
# read remotely against the same files read locally from this directory.
import struct
import numpy as np
rng = np.random.default_rng(7)
docs = [(1000 + 100 * d + np.arange(rng.integers(1, 40))) % 65536 for d in range(300)]
lengths = np.array([len(d) for d in docs], dtype="<i4")
pointers = np.concatenate([[0], np.cumsum(lengths[:-1].astype(np.int64) * 2)]).astype("<i8")
with open(f"{out}/tok-web.idx", "wb") as f:
    f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, len(docs), len(docs) + 1))
    f.write(lengths.tobytes() + pointers.tobytes() + np.arange(len(docs) + 1, dtype="<i8").tobytes())
np.concatenate(docs).astype("<u2").tofile(f"{out}/tok-web.bin")
np.concatenate(docs[::-1]).astype("<u2").tofile(f"{out}/tok-flat.bin")
np.concatenate(docs[::2]).astype("<u2").tofile(f"{out}/tok-docs.bin")
np.save(f"{out}/tok-docs.lengths.npy", lengths[::2].astype("<i8"))
PY
ls "$work/www"

step "TLS: a test certificate authority and a certificate for 127.0.0.1 (openssl)"
# The readers trust the authority through SSL_CERT_FILE (object_store's rustls reads it in
# place of the system's roots), so https:// is verified exactly as against a real server.
tls=$work/tls
mkdir -p "$tls"
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=stoker test CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -keyout "$tls/ca.key" -out "$tls/ca.pem" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" \
  -keyout "$tls/server.key" -out "$tls/server.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n' >"$tls/server.ext"
openssl x509 -req -in "$tls/server.csr" -CA "$tls/ca.pem" -CAkey "$tls/ca.key" -CAcreateserial \
  -days 2 -extfile "$tls/server.ext" -out "$tls/server.pem" 2>/dev/null
chmod 644 "$tls"/*

step "nginx on 127.0.0.1 (http:// and https://)"
http_port=$(free_port)
https_port=$(free_port)
mkdir -p "$work/nginx"
cat > "$work/nginx/nginx.conf" <<CONF
worker_processes 1;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log;
events { worker_connections 64; }
http {
  access_log $work/nginx/access.log;
  client_body_temp_path $work/nginx/body;
  proxy_temp_path $work/nginx/proxy;
  fastcgi_temp_path $work/nginx/fastcgi;
  uwsgi_temp_path $work/nginx/uwsgi;
  scgi_temp_path $work/nginx/scgi;
  server {
    listen 127.0.0.1:$http_port;
    root $work/www;
  }
  server {
    listen 127.0.0.1:$https_port ssl;
    ssl_certificate $tls/server.pem;
    ssl_certificate_key $tls/server.key;
    root $work/www;
  }
}
CONF
timeout 900 "$nginx_bin" -c "$work/nginx/nginx.conf" -p "$work/nginx" -g 'daemon off;' &
pids+=($!)
wait_port "$http_port"
wait_port "$https_port"
# nginx answers range requests on static files (206 Partial Content).
"$py" - "$http_port" <<'PY'
import sys, urllib.request
req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/shard-000.tar", headers={"Range": "bytes=0-99"})
with urllib.request.urlopen(req, timeout=10) as r:
    assert r.status == 206 and len(r.read()) == 100, r.status
print("nginx: range request answered 206")
PY

step "moto S3 server on 127.0.0.1"
s3_port=$(free_port)
timeout 900 "$venv/bin/moto_server" -H 127.0.0.1 -p "$s3_port" >"$work/moto.log" 2>&1 &
pids+=($!)
wait_port "$s3_port"
export AWS_ACCESS_KEY_ID=stoker-test-key AWS_SECRET_ACCESS_KEY=stoker-test-secret-7f3a9
export AWS_REGION=us-east-1 AWS_DEFAULT_REGION=us-east-1 AWS_ENDPOINT_URL=http://127.0.0.1:$s3_port
"$py" - "$work/www" <<'PY'
import os, sys, boto3
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
s3.create_bucket(Bucket="stoker-test")
for name in sorted(os.listdir(sys.argv[1])):
    s3.upload_file(os.path.join(sys.argv[1], name), "stoker-test", f"shards/{name}")
print("s3: uploaded", len(os.listdir(sys.argv[1])), "shards")
PY

export STOKER_REMOTE_SAMPLES=$samples STOKER_REMOTE_WWW=$work/www
export STOKER_REMOTE_HTTP="http://127.0.0.1:$http_port/shard-{000..003}.tar"
export STOKER_REMOTE_S3="s3://stoker-test/shards/shard-{000..003}.tar"
export STOKER_REMOTE_HTTPS="https://127.0.0.1:$https_port/shard-{000..003}.tar"
export STOKER_REMOTE_HTTP_INDEX="http://127.0.0.1:$http_port/train.json"
export STOKER_REMOTE_S3_INDEX="s3://stoker-test/shards/train.json"

export SSL_CERT_FILE=$tls/ca.pem

step "Rust"
# --workspace: the features of `cargo test --workspace`, so that the test suite's build is reused
# (with -p alone, cargo resolves the features of stoker-core's dependencies apart from the other
# members' and builds them and the crate again).
cargo test -q --workspace --test all -- --ignored remote_servers:: 2>&1 | tail -3

step "library for Python and C"
# With stoker-cxx, as the C and C++ steps' CMake build makes it: cargo resolves features per
# build, and stoker-capi alone (without cxx-build's proc-macro2 features) would compile stoker-core
# and its dependencies again (140 s on 2 cores) instead of finding them built.
# The profile of the C++ step's build (STOKER_CARGO_PROFILE, default release), found built.
profile=${STOKER_CARGO_PROFILE:-release}
cargo build -q --profile "$profile" -p stoker-capi -p stoker-cxx
profile_dir=$profile
[ "$profile" = dev ] && profile_dir=debug
lib="${CARGO_TARGET_DIR:-$root/target}/$profile_dir/libstoker.so"

step "https:// with a certificate the reader does not trust fails, naming the URL"
STOKER_LIBRARY="$lib" PYTHONPATH="$root/bindings/python/src" "$py" - <<'PY'
import os, subprocess, sys
# A process without SSL_CERT_FILE trusts only the system's roots, not the test authority.
env = {k: v for k, v in os.environ.items() if k != "SSL_CERT_FILE"}
code = (
    "import os, stoker\n"
    "try:\n"
    "    stoker.Loader('tar:' + os.environ['STOKER_REMOTE_HTTPS'], fields='cls:label')\n"
    "except stoker.StokerIOError as e:\n"
    "    print(e)\n"
    "else:\n"
    "    raise SystemExit('an untrusted certificate must fail')\n"
)
out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
assert out.returncode == 0, out.stdout + out.stderr
text = out.stdout
assert "https://127.0.0.1:" in text and "certificate" in text.lower() and "not retried" in text, text
print("https: untrusted certificate:", text.strip()[:300])
PY

step "Python"
STOKER_LIBRARY="$lib" PYTHONPATH="$root/bindings/python/src" "$py" ctests/remote/read_shards.py

step "C"
# The library's SONAME is libstoker.so.0, as an installed copy is named.
mkdir -p "$work/lib"
ln -sf "$lib" "$work/lib/libstoker.so.0"
ln -sf "$lib" "$work/lib/libstoker.so"
cc -std=c11 -Wall -Werror -Iinclude ctests/remote/read_shards.c -L"$work/lib" -lstoker \
  -Wl,-rpath,"$work/lib" -o "$work/read_shards"
"$work/read_shards" "$work/c-cache" "$samples" "$STOKER_REMOTE_HTTP" "$STOKER_REMOTE_HTTPS" "$STOKER_REMOTE_S3"

step "C++ (find_package(stoker) from $cpp_prefix)"
cmake -S ctests/remote/cpp -B "$work/cpp" -DCMAKE_BUILD_TYPE=Release \
  "-DCMAKE_PREFIX_PATH=$cpp_prefix" >/dev/null
cmake --build "$work/cpp" -j "${JOBS:-2}" >/dev/null
"$work/cpp/read_shards" "$work/cpp-cache" "$samples" "$STOKER_REMOTE_HTTP" "$STOKER_REMOTE_HTTPS" "$STOKER_REMOTE_S3"

echo "remote shards: nginx http:// and https:// (TLS) and moto s3:// read from Rust, Python, C and C++"
