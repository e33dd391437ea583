#!/usr/bin/env bash
# TLS side by side: appsrv's http_hello on a TLS listener (`-l 127.0.0.1:PORT?tls`) and
# nginx with the same certificate, on loopback, loaded by ab over HTTPS at concurrency C:
#   handshakes/s   a new TLS connection per request (ab without -k): one full handshake,
#                  one GET, one close each; ab does not resume sessions;
#   keep-alive     requests/s on C kept-alive TLS connections (ab -k).
# Each cell is the median of RUNS runs of N requests; beside it, the server's CPU time
# (user + system of the master and its children, from /proc) per request over those runs.
#
#   bench/tls.sh                  (N=5000 RUNS=3 C=8 WORKERS=8)
#   N=1000 RUNS=1 bench/tls.sh    (a quick check that everything runs)
#
# Needs nginx and ab (apt-get install -y nginx apache2-utils openssl); installs nothing.
# The certificate: a fresh ECDSA P-256 key and a self-signed certificate for 127.0.0.1
# (openssl req), used by both servers. Both serve a 13-byte `Hello, World!` at `/`:
# appsrv from its handler, nginx from `return 200`.
# appsrv: a static pool of WORKERS (default 8, one per client connection, as a prefork
#   server is sized) workers; its defaults otherwise.
# nginx: worker_processes 2 (one per CPU), access_log off, ssl_protocols TLSv1.2 TLSv1.3,
#   its default ciphers, keepalive_requests 100000, no session cache (ab does not resume).
# ab, the client, shares the 2 CPUs with the server and does its own half of every
# handshake: the figures are lower bounds, comparable with each other within one run.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3} N=${N:-5000} C=${C:-8} WORKERS=${WORKERS:-8}
NGINX=${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}
missing=()
[ -x "$NGINX" ] || missing+=(nginx)
command -v ab >/dev/null || missing+=(apache2-utils)
command -v openssl >/dev/null || missing+=(openssl)
if [ ${#missing[@]} -gt 0 ]; then
  echo "tls.sh: missing ${missing[*]}; install with: apt-get install -y ${missing[*]}" >&2
  exit 1
fi

cargo build --release --quiet --example http_hello
work=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
chmod 755 "$work"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
  -subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 \
  -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null
if [ "$(id -u)" = 0 ]; then RUN_USER=nobody RUN_GROUP=nogroup; else RUN_USER="" RUN_GROUP=""; fi

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# wait_https PORT: until `GET /` answers 200 over TLS (10 s at most).
wait_https() {
  for _ in $(seq 100); do
    if ab -q -n 1 "https://127.0.0.1:$1/" 2>/dev/null | grep -q '^Complete requests: *1$'; then
      return 0
    fi
    sleep 0.1
  done
  echo "tls.sh: nothing answers on https://127.0.0.1:$1/" >&2
  exit 1
}

start_appsrv() {
  target/release/examples/http_hello -l "127.0.0.1:0?tls" --tls-cert "$work/cert.pem" \
    --tls-key "$work/key.pem" -w "$WORKERS" 2>"$work/appsrv.log" &
  PIDS+=($!)
  for _ in $(seq 200); do grep -q " ready" "$work/appsrv.log" 2>/dev/null && break; sleep 0.05; done
  PORT=$(grep -o 'listening on 127.0.0.1:[0-9]*' "$work/appsrv.log" | head -1 | cut -d: -f2)
  [ -n "$PORT" ] || { echo "tls.sh: appsrv did not start:" >&2; cat "$work/appsrv.log" >&2; exit 1; }
}

start_nginx() {
  PORT=$(free_port)
  local d=$work/nginx
  mkdir -p "$d"
  cat >"$d/nginx.conf" <<EOF
daemon off;
worker_processes 2;
${RUN_USER:+user $RUN_USER $RUN_GROUP;}
pid $d/nginx.pid;
error_log $work/nginx.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    keepalive_requests 100000;
    client_body_temp_path $d/body;
    proxy_temp_path $d/proxy;
    fastcgi_temp_path $d/fastcgi;
    uwsgi_temp_path $d/uwsgi;
    scgi_temp_path $d/scgi;
    server {
        listen 127.0.0.1:$PORT ssl;
        ssl_certificate $work/cert.pem;
        ssl_certificate_key $work/key.pem;
        ssl_protocols TLSv1.2 TLSv1.3;
        location = / { default_type text/plain; return 200 "Hello, World!"; }
    }
}
EOF
  "$NGINX" -p "$d" -e "$work/nginx.log" -c "$d/nginx.conf" &
  PIDS+=($!)
}

# cpu_us PID: CPU time (user + system, µs) of PID and its children, from /proc.
cpu_us() {
  local tick total=0 p
  tick=$(getconf CLK_TCK)
  for p in "$1" $(pgrep -P "$1"); do
    # Fields 14 and 15 of /proc/PID/stat (after the command name in parentheses).
    total=$((total + $(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | awk '{ print $12 + $13 }' || echo 0)))
  done
  echo $((total * 1000000 / tick))
}

# median_rps PORT [-k]: the median requests/s of RUNS runs.
median_rps() {
  local port=$1 keep=${2:-} all=()
  for _ in $(seq "$RUNS"); do
    # shellcheck disable=SC2086 # $keep is empty or -k
    out=$(timeout 120 ab -q -r -s 10 $keep -n "$N" -c "$C" "https://127.0.0.1:$port/" 2>&1) || true
    rps=$(sed -n 's/^Requests per second: *\([0-9.]*\).*/\1/p' <<<"$out")
    failed=$(sed -n 's/^Failed requests: *\([0-9]*\).*/\1/p' <<<"$out")
    [ -n "$rps" ] || { echo "tls.sh: ab did not finish on port $port: $out" >&2; exit 1; }
    [ "${failed:-0}" = 0 ] || echo "tls.sh: $failed failed requests on port $port" >&2
    all+=("$rps")
  done
  printf '%s\n' "${all[@]}" | sort -n | awk '{ v[NR] = $1 } END { printf "%.0f", v[int((NR + 1) / 2)] }'
}

declare -A result
for server in appsrv nginx; do
  "start_$server"
  wait_https "$PORT"
  ab -q -k -n "$N" -c "$C" "https://127.0.0.1:$PORT/" >/dev/null 2>&1 || true # warm-up
  master=${PIDS[-1]}
  c0=$(cpu_us "$master")
  result[$server,hs]=$(median_rps "$PORT")
  c1=$(cpu_us "$master")
  result[$server,ka]=$(median_rps "$PORT" -k)
  c2=$(cpu_us "$master")
  # The server's CPU per request, over all RUNS runs of each kind.
  result[$server,hs_cpu]=$(((c1 - c0) / (RUNS * N)))
  result[$server,ka_cpu]=$(((c2 - c1) / (RUNS * N)))
  kill "${PIDS[-1]}"
  wait "${PIDS[-1]}" 2>/dev/null || true
  unset 'PIDS[-1]'
done

echo "TLS, c=$C, N=$N, median of $RUNS; $(nproc) CPUs; $(openssl version | cut -d' ' -f1-2); $("$NGINX" -v 2>&1 | cut -d' ' -f3)"
printf '| %-28s | %8s | %8s | %14s | %16s | %15s |\n' "workload" appsrv nginx "appsrv / nginx" "appsrv CPU µs/req" "nginx CPU µs/req"
printf '|%s|%s|%s|%s|%s|%s|\n' "------------------------------" "----------" "----------" "----------------" "------------------" "-----------------"
for w in hs ka; do
  label=$([ $w = hs ] && echo "handshakes/s (new conn/req)" || echo "keep-alive requests/s")
  a=${result[appsrv,$w]} n=${result[nginx,$w]}
  printf '| %-28s | %8s | %8s | %14s | %16s | %15s |\n' "$label" "$a" "$n" "$(awk -v a="$a" -v n="$n" 'BEGIN { printf "%.2f", a / n }')" \
    "${result[appsrv,${w}_cpu]}" "${result[nginx,${w}_cpu]}"
done
