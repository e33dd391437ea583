#!/usr/bin/env bash
# Instructions per request of the http_hello example, counted by callgrind in the worker
# (a VM often has no hardware counters for `perf stat`), for two builds side by side,
# interleaved: a refactoring must not make the request path heavier.
#
#   bench/instructions.sh BEFORE_EXAMPLES_DIR AFTER_EXAMPLES_DIR
#
# Each directory holds release examples (target/release/examples of a checkout). For each
# workload (keep-alive, and a connection per request) and each build, the server runs
# under callgrind with two workers (so that one is idle, as in syscalls.sh: a pool that is
# not saturated), serves N1 then, in another run, N2 requests from ab (one client), and
# the workers' instruction count (summed: either may take a connection) difference divided
# by N2 - N1 is the cost of one request, start-up and shutdown cancelled out. Needs valgrind and ab
# (apache2-utils). Prints a markdown table.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
BEFORE=${1:?before examples dir}
AFTER=${2:?after examples dir}
N1=${N1:-1000}
N2=${N2:-4000}
REPS=${REPS:-2}
work=$(mktemp -d)
chmod 755 "$work" # the worker (user nobody) writes its profile in a folder below
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

# worker_ir EXAMPLES_DIR N AB_FLAGS → the workers' instruction count (Ir)
worker_ir() {
  local dir=$1 n=$2 flags=$3 out="$work/run.$RANDOM"
  mkdir -p "$out"
  chmod 1777 "$out" # the worker runs as nobody and writes its own file
  valgrind --tool=callgrind --callgrind-out-file="$out/cg.%p" \
    "$dir/http_hello" -l 127.0.0.1:0 -w 2 2>"$out/log" &
  local master=$!
  local port
  port=$(ready_port "$out/log" 60) # valgrind starts slowly
  # shellcheck disable=SC2086
  ab -q $flags -n "$n" -c 1 "http://127.0.0.1:$port/" >"$out/ab" 2>&1
  grep -q "Failed requests: *0" "$out/ab" || { echo "ab failed:" >&2; cat "$out/ab" >&2; exit 1; }
  # Under valgrind a signal that comes while the master sleeps in poll(2) is sometimes not
  # delivered until the next one: ask again until the master says it stops (not after: a
  # TERM repeated later means "stop now", which would kill the worker before its dump).
  for _ in $(seq 60); do
    grep -q "SIGTERM received" "$out/log" && break
    kill -TERM "$master" 2>/dev/null || break
    sleep 0.5
  done
  wait "$master" 2>/dev/null || true
  # The workers' files: all but the master's.
  for f in "$out"/cg.*; do
    [ "$f" = "$out/cg.$master" ] && continue
    grep '^summary:' "$f" | awk '{print $2}'
  done | awk '{s += $1} END {print s}' 
}

per_request() {
  local dir=$1 flags=$2
  local a b
  a=$(worker_ir "$dir" "$N1" "$flags")
  b=$(worker_ir "$dir" "$N2" "$flags")
  echo $(( (b - a) / (N2 - N1) ))
}

echo "| workload | build | instructions per request (each run) |"
echo "|---|---|---|"
for workload in "keep-alive:-k" "connection per request:"; do
  name=${workload%%:*}
  flags=${workload#*:}
  declare -A runs=([before]="" [after]="")
  for _ in $(seq "$REPS"); do
    runs[before]+="$(per_request "$BEFORE" "$flags") "
    runs[after]+="$(per_request "$AFTER" "$flags") "
  done
  echo "| $name | before | ${runs[before]}|"
  echo "| $name | after | ${runs[after]}|"
done
