#!/usr/bin/env bash
# The cost of confining workers: http_hello plain, with --sandbox (Landlock + seccomp) and
# with --exec-workers (each worker re-executes the program), on loopback, loaded by ab at
# concurrency C:
#   keep-alive    requests/s on C kept-alive connections (ab -k);
#   new conn/req  requests/s with a new connection per request;
# each the median of RUNS runs of N requests; then the time `start` takes to bring up a
# pool of SPAWN workers and report ready (fork, privilege drop, confinement, factory), the
# median of RUNS starts, each followed by `stop`.
#
#   bench/sandbox.sh                (N=20000 RUNS=5 C=8 WORKERS=8 SPAWN=32)
#   N=2000 RUNS=1 bench/sandbox.sh  (a quick check that everything runs)
#
# Needs ab (apt-get install -y apache2-utils). The three servers are the same release
# build with the same options but the one measured; the client shares the 2 CPUs with the
# server, so compare the columns, not the absolute figures.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5} N=${N:-20000} C=${C:-8} WORKERS=${WORKERS:-8} SPAWN=${SPAWN:-32}
command -v ab >/dev/null || { echo "sandbox.sh: ab is missing: apt-get install -y apache2-utils" >&2; exit 1; }

cargo build --release --quiet --example http_hello
BIN=target/release/examples/http_hello
work=$(mktemp -d)
SERVER=""
cleanup() {
  [ -z "$SERVER" ] || kill "$SERVER" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

median() { sort -n | awk '{ v[NR] = $1 } END { printf "%.0f", v[int((NR + 1) / 2)] }'; }

# rps PORT [-k]: the median requests/s of RUNS ab runs.
rps() {
  for _ in $(seq "$RUNS"); do
    # shellcheck disable=SC2086 # $2 is empty or -k
    timeout 120 ab -q -r ${2:-} -n "$N" -c "$C" "http://127.0.0.1:$1/" 2>&1 \
      | sed -n 's/^Requests per second: *\([0-9.]*\).*/\1/p'
  done | median
}

declare -A result
for mode in plain sandbox exec; do
  flags=()
  [ "$mode" = sandbox ] && flags=(--sandbox)
  [ "$mode" = exec ] && flags=(--exec-workers)
  "$BIN" -l 127.0.0.1:0 -w "$WORKERS" "${flags[@]}" 2>"$work/$mode.log" &
  SERVER=$!
  for _ in $(seq 200); do grep -q " ready" "$work/$mode.log" 2>/dev/null && break; sleep 0.05; done
  port=$(grep -o 'listening on 127.0.0.1:[0-9]*' "$work/$mode.log" | head -1 | cut -d: -f2)
  [ -n "$port" ] || { echo "sandbox.sh: http_hello did not start:" >&2; cat "$work/$mode.log" >&2; exit 1; }
  ab -q -k -n "$N" -c "$C" "http://127.0.0.1:$port/" >/dev/null 2>&1 || true # warm-up
  result[$mode,ka]=$(rps "$port" -k)
  result[$mode,new]=$(rps "$port")
  kill "$SERVER"
  wait "$SERVER" 2>/dev/null || true
  SERVER=""
  # Spawn time: `start` returns once all SPAWN workers are ready.
  result[$mode,spawn]=$(for _ in $(seq "$RUNS"); do
    t0=$(date +%s%N)
    "$BIN" start -l 127.0.0.1:0 -w "$SPAWN" "${flags[@]}" --pid-file "$work/pid" --log-file "$work/start.log"
    t1=$(date +%s%N)
    "$BIN" stop --pid-file "$work/pid" >/dev/null
    echo $(((t1 - t0) / 1000000))
  done | median)
done

echo "http_hello, c=$C, N=$N, -w $WORKERS, median of $RUNS; start with -w $SPAWN; $(nproc) CPUs; Linux $(uname -r)"
echo "(in parentheses: the ratio to plain)"
printf '| %-34s | %10s | %14s | %14s |\n' "" "plain" "--sandbox" "--exec-workers"
printf '|%s|%s|%s|%s|\n' "------------------------------------" "------------" "----------------" "----------------"
for k in ka new spawn; do
  case $k in
    ka) label="keep-alive requests/s" ;;
    new) label="new connection per request, req/s" ;;
    spawn) label="start -w $SPAWN until ready, ms" ;;
  esac
  ratio() { awk -v a="${result[plain,$k]}" -v b="$1" 'BEGIN { printf "%.2f", b / a }'; }
  printf '| %-34s | %10s | %14s | %14s |\n' "$label" "${result[plain,$k]}" \
    "${result[sandbox,$k]} ($(ratio "${result[sandbox,$k]}"))" "${result[exec,$k]} ($(ratio "${result[exec,$k]}"))"
done
