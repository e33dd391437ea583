#!/usr/bin/env bash
# Log rotation under load (issue 17): no request is lost and no access-log line is lost
# while the log files are rotated as logrotate does (rename, then USR1), many times.
#
# http_hello (release) runs with --log-file and --access-log in a fresh directory, -w 2 in
# each I/O model of IO (default "blocking event"); as root its workers run as nobody, so
# they cannot open the files (mode 0640, the master's): every reopened descriptor reaches
# them over their log channel. wrk (no retries) loads it for SECS seconds (default 10)
# with CONNS connections (default 50) while the files are renamed and USR1 sent every
# EVERY seconds (default 0.2). After a graceful stop (workers flush their access logs),
# the access-log lines of all the rotated files are counted: at least the requests wrk
# saw completed (the server may have answered some that wrk's end cut), and wrk must
# report no socket error and no non-2xx answer. The files' modes and owners are printed.
#
#   bench/rotate.sh
#   IO=event SECS=20 bench/rotate.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

IO=${IO:-blocking event}
SECS=${SECS:-10}
CONNS=${CONNS:-50}
EVERY=${EVERY:-0.2}
command -v wrk >/dev/null || { echo "needs wrk"; exit 1; }
cargo build --release -q --example http_hello
bin=target/release/examples/http_hello

echo "| I/O model | rotations | wrk requests | socket errors | non-2xx | access-log lines | lines - requests | modes |"
echo "|---|---|---|---|---|---|---|---|"
for io in $IO; do
  dir=$(mktemp -d /tmp/appsrv-rotate.XXXXXX)
  chmod 755 "$dir"
  "$bin" -l 127.0.0.1:0 -w 2 --io "$io" --log-file "$dir/log" --access-log "$dir/access.log" &
  pid=$!
  port=$(ready_port "$dir/log")
  [ -n "$port" ] || { echo "the server did not start"; cat "$dir/log"; kill "$pid"; exit 1; }
  wrk -t 2 -c "$CONNS" -d "${SECS}s" "http://127.0.0.1:$port/" > "$dir/wrk.out" 2>&1 &
  wrk_pid=$!
  n=0
  while kill -0 "$wrk_pid" 2>/dev/null; do
    sleep "$EVERY"
    n=$((n + 1))
    mv "$dir/access.log" "$dir/access.log.$n"
    mv "$dir/log" "$dir/log.$n"
    kill -USR1 "$pid"
  done
  wait "$wrk_pid" || true
  kill -TERM "$pid"
  wait "$pid" || true
  requests=$(awk '/requests in/ { print $1 }' "$dir/wrk.out")
  errors=$(awk -F'[ ,]+' '/Socket errors/ { print $4 + $6 + $8 + $10 }' "$dir/wrk.out")
  non2xx=$(awk '/Non-2xx/ { print $NF }' "$dir/wrk.out")
  lines=$(cat "$dir"/access.log* | wc -l)
  modes=$(stat -c '%a %U' "$dir/access.log" "$dir/log" | sort -u | tr '\n' ' ')
  reopened=$(cat "$dir"/log* | grep -c "reopened the log file" || true)
  echo "| $io | $n | $requests | ${errors:-0} | ${non2xx:-0} | $lines | $((lines - requests)) | $modes|"
  echo "   (log lines 'reopened the log file', master and workers: $reopened)" >&2
  rm -rf "$dir"
done
