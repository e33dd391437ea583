#!/usr/bin/env bash
# Requests per second of two builds of the http_hello example, interleaved (before, after,
# before, after, ...) so that the machine's drift hits both alike: a refactoring must not
# move them beyond the noise.
#
#   bench/revisions.sh BEFORE_EXAMPLES_DIR AFTER_EXAMPLES_DIR
#   ARGS="--io event" bench/revisions.sh ...     the servers' extra arguments (the I/O model)
#
# Each server runs with -w 2; the load is wrk -t1 -c1 (keep-alive) and ab -c 1 (a
# connection per request), DURATION seconds / N requests each, ROUNDS rounds. Needs wrk and
# ab (apache2-utils). Prints a markdown table.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
BEFORE=${1:?before examples dir}
AFTER=${2:?after examples dir}
ROUNDS=${ROUNDS:-3}
ARGS=${ARGS:-}
DURATION=${DURATION:-5}
N=${N:-20000}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

# rate DIR WORKLOAD → requests per second
rate() {
  local dir=$1 workload=$2
  # shellcheck disable=SC2086 # ARGS is a list of arguments
  "$dir/http_hello" -l 127.0.0.1:0 -w 2 $ARGS 2>"$work/log" &
  local pid=$!
  local port
  port=$(ready_port "$work/log")
  if [ "$workload" = keepalive ]; then
    wrk -t1 -c1 -d"${DURATION}s" "http://127.0.0.1:$port/" | awk '/Requests\/sec/ {print int($2)}'
  else
    ab -q -c 1 -n "$N" "http://127.0.0.1:$port/" | awk '/Requests per second/ {print int($4)}'
  fi
  kill -TERM "$pid"
  wait "$pid" 2>/dev/null || true
}

echo "| workload | build | requests/s (each round) |"
echo "|---|---|---|"
for workload in keepalive close; do
  before="" after=""
  for _ in $(seq "$ROUNDS"); do
    before+="$(rate "$BEFORE" $workload) "
    after+="$(rate "$AFTER" $workload) "
  done
  name=$([ $workload = keepalive ] && echo "keep-alive (wrk -t1 -c1)" || echo "connection per request (ab -c 1)")
  echo "| $name | before | $before|"
  echo "| $name | after | $after|"
done
