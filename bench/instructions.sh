#!/usr/bin/env bash
# Instructions per request of the hello examples in every I/O model, counted by callgrind
# in the server's processes (a VM often has no hardware counters for `perf stat`), for two
# builds side by side, interleaved: a refactoring must not make the request path heavier.
#
#   bench/instructions.sh BEFORE_EXAMPLES_DIR AFTER_EXAMPLES_DIR
#   MODELS="event async" REPS=1 bench/instructions.sh BEFORE AFTER
#
# Each directory holds release examples (target/release/examples of a checkout; only
# http_hello and async_hello are run). Models (MODELS, default "blocking event hybrid
# async"): blocking, event and hybrid run `http_hello --io MODEL -w 2` (hybrid with its
# default --fronts); async runs `async_hello -w 2` with no --io (older builds take none,
# newer ones default to async). For each model, each workload (keep-alive, and a
# connection per request) and each build, the server runs under callgrind with two
# workers (so that one is idle, as in syscalls.sh: a pool that is not saturated), serves
# N1 then, in another run, N2 requests from ab (one client), and the difference of the
# instruction counts divided by N2 - N1 is the cost of one request, start-up and shutdown
# cancelled out. The count is summed over every process but the master: both workers
# (either may take a connection) and, in hybrid mode, the front processes too (they
# accept, read and hand over each connection: part of the request's cost). Needs valgrind
# and ab (apache2-utils). Prints a markdown table: a row per model, workload and build,
# each run's figure, their mean, and on the after row the after/before change of the means.
set -euo pipefail
shopt -s inherit_errexit # a failed run inside $(...) stops the script, not a figure of 0
. "$(dirname "$0")/lib.sh"
BEFORE=${1:?before examples dir}
AFTER=${2:?after examples dir}
MODELS=${MODELS:-blocking event hybrid async}
N1=${N1:-1000}
N2=${N2:-4000}
REPS=${REPS:-2}
for m in $MODELS; do
  case $m in
    blocking | event | hybrid | async) ;;
    *) echo "instructions.sh: unknown model $m (blocking, event, hybrid or async)" >&2; exit 2 ;;
  esac
done
for d in "$BEFORE" "$AFTER"; do
  for ex in http_hello async_hello; do
    [ -x "$d/$ex" ] || { echo "instructions.sh: $d/$ex is missing" >&2; exit 2; }
  done
done
work=$(mktemp -d)
chmod 755 "$work" # the worker (user nobody) writes its profile in a folder below
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

# server_cmd EXAMPLES_DIR MODEL → the server's command line (words), before -l
server_cmd() {
  local dir=$1 model=$2
  case $model in
    async) echo "$dir/async_hello -w 2" ;;
    *) echo "$dir/http_hello --io $model -w 2" ;;
  esac
}

# server_ir EXAMPLES_DIR MODEL N AB_FLAGS → the instruction count (Ir) of every process of
# the server but the master
server_ir() {
  local dir=$1 model=$2 n=$3 flags=$4 out="$work/run.$RANDOM"
  local -a cmd
  read -r -a cmd <<<"$(server_cmd "$dir" "$model")"
  local master port try
  # A start that is not ready in 120 s (valgrind starts slowly, more so on a busy machine)
  # is stopped and made again, up to 3 times: it has served nothing, so nothing is lost.
  for try in 1 2 3; do
    rm -rf "$out"
    mkdir -p "$out"
    chmod 1777 "$out" # the worker runs as nobody and writes its own file
    valgrind --tool=callgrind --vgdb=no --callgrind-out-file="$out/cg.%p" \
      "${cmd[@]}" -l 127.0.0.1:0 2>"$out/log" &
    master=$!
    port=$(ready_port "$out/log" 120)
    [ -n "$port" ] && break
    echo "instructions.sh: ${cmd[*]} did not start (try $try):" >&2
    cat "$out/log" >&2
    # shellcheck disable=SC2046
    kill -KILL $(server_pids "$master") 2>/dev/null || true
    wait "$master" 2>/dev/null || true
  done
  [ -n "$port" ] || exit 1
  # shellcheck disable=SC2086
  ab -q $flags -n "$n" -c 1 "http://127.0.0.1:$port/" >"$out/ab" 2>&1
  grep -q "Failed requests: *0" "$out/ab" || { echo "ab failed (${cmd[*]}):" >&2; cat "$out/ab" >&2; exit 1; }
  # Under valgrind a signal that comes while the master sleeps in poll(2) is sometimes not
  # delivered until the next one: ask again until the master says it stops (not after: a
  # TERM repeated later means "stop now", which would kill the worker before its dump).
  for _ in $(seq 60); do
    grep -q "SIGTERM received" "$out/log" && break
    kill -TERM "$master" 2>/dev/null || break
    sleep 0.5
  done
  wait "$master" 2>/dev/null || true
  # Every process's file but the master's: the workers and (hybrid) the fronts.
  local files=0 f
  for f in "$out"/cg.*; do
    [ "$f" = "$out/cg.$master" ] && continue
    files=$((files + 1))
  done
  [ "$files" -gt 0 ] || { echo "instructions.sh: no worker profile (${cmd[*]}):" >&2; cat "$out/log" >&2; exit 1; }
  for f in "$out"/cg.*; do
    [ "$f" = "$out/cg.$master" ] && continue
    grep '^summary:' "$f" | awk '{print $2}'
  done | awk '{s += $1} END {printf "%.0f\n", s}'
}

per_request() {
  local dir=$1 model=$2 flags=$3
  local a b
  a=$(server_ir "$dir" "$model" "$N1" "$flags") || exit 1
  b=$(server_ir "$dir" "$model" "$N2" "$flags") || exit 1
  echo $(((b - a) / (N2 - N1)))
}

# mean FIGURES... → their mean, rounded
mean() { echo "$@" | awk '{for (i = 1; i <= NF; i++) s += $i; printf "%.0f\n", s / NF}'; }

echo "| model | workload | build | instructions per request (each run) | mean | after/before |"
echo "|---|---|---|---|---|---|"
for model in $MODELS; do
  for workload in "keep-alive:-k" "connection per request:"; do
    name=${workload%%:*}
    flags=${workload#*:}
    declare -A runs=([before]="" [after]="")
    for _ in $(seq "$REPS"); do
      runs[before]+="$(per_request "$BEFORE" "$model" "$flags") "
      runs[after]+="$(per_request "$AFTER" "$model" "$flags") "
    done
    # shellcheck disable=SC2086
    mb=$(mean ${runs[before]})
    # shellcheck disable=SC2086
    ma=$(mean ${runs[after]})
    change=$(awk -v a="$ma" -v b="$mb" 'BEGIN {printf "%+.2f %%", (a - b) * 100 / b}')
    echo "| $model | $name | before | ${runs[before]}| $mb | |"
    echo "| $model | $name | after | ${runs[after]}| $ma | $change |"
  done
done
