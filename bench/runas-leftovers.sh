#!/usr/bin/env bash
# What a runas command leaves running after its call (issue 14): the runas example with a
# policy that allows /bin/sh with a few fixed scripts, each of which starts `sleep 3735` in
# the background and exits; for each, the call's time and timed_out, then the number of
# `sleep 3735` processes still alive once the call has answered (polled for up to 5 s, so
# a process already killed but not yet gone is not counted). Goal: 0 for every script:
# since issue 18 the command runs from the worker's privileged helper, a child subreaper,
# which kills what left the session (the last two scripts, with setsid) once the command is
# reaped (before issue 18 these two left 1: the documented limit of issue 14). The last
# one also holds stdout open, so its call answers 2 s (DRAIN_AFTER_KILL in
# crates/appsrv-runas/examples/runas/exec.rs) after the shell exited, and the log warns.
#
#   sudo bench/runas-leftovers.sh                 (builds the release example)
#   sudo BIN=/path/to/runas bench/runas-leftovers.sh
#
# Needs root (runas's helpers switch to nobody for each command) and python3 (xmlrpc.client).
# Whatever is left is killed by pid at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
[ "$(id -u)" = 0 ] || { echo "runas-leftovers.sh: run as root" >&2; exit 1; }
if [ -z "${BIN:-}" ]; then
  cargo build --release --quiet --example runas
  BIN=target/release/examples/runas
fi
work=$(mktemp -d)
chmod 755 "$work"
SERVER=""
# The live `sleep 3735` processes (a zombie's command line is empty).
survivors() { pgrep -x -f 'sleep 3735' || true; }
cleanup() {
  [ -z "$SERVER" ] || kill "$SERVER" 2>/dev/null || true
  wait 2>/dev/null || true
  for p in $(survivors); do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

scripts=(
  'sleep 3735 >/dev/null 2>&1 &'
  "trap '' HUP TERM; sleep 3735 >/dev/null 2>&1 &"
  'sleep 3735 & echo started'
  # Waits until the child has its own session (field 6 of /proc/PID/stat), so that the
  # kill cannot come first.
  'setsid sleep 3735 >/dev/null 2>&1 & p=$!; until [ "$(cut -d" " -f6 /proc/$p/stat)" = $p ]; do :; done'
  'setsid sleep 3735 & p=$!; until [ "$(cut -d" " -f6 /proc/$p/stat)" = $p ]; do :; done'
)
head -c 24 /dev/urandom | base64 >"$work/token"
chmod 600 "$work/token"
{
  echo "token_file = \"$work/token\""
  echo '[commands.sh]'
  echo 'program = "/bin/sh"'
  echo 'users = ["nobody"]'
  echo 'max_processes = 100000'
  echo 'timeout = 10'
  printf 'args = ["-c"'
  for s in "${scripts[@]}"; do printf ', %s' "$(python3 -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$s")"; done
  echo ']'
} >"$work/policy.toml"
chmod 644 "$work/policy.toml"

"$BIN" --policy "$work/policy.toml" -l 127.0.0.1:0 -w 1 --control "$work/ctl" >"$work/log" 2>&1 &
SERVER=$!
port=$(ready_port "$work/log" 30)
[ -n "$port" ] || { echo "runas did not start:" >&2; cat "$work/log" >&2; exit 1; }
addr=127.0.0.1:$port

printf '%-60s %8s %10s %5s\n' script seconds timed_out left
for s in "${scripts[@]}"; do
  out=$(python3 - "$addr" "$(cat "$work/token")" "$s" <<'EOF'
import sys, time, xmlrpc.client
addr, token, script = sys.argv[1:]
t = time.monotonic()
r = xmlrpc.client.ServerProxy("http://%s/RPC2" % addr).run(token, "nobody", "sh", ["-c", script])
print("%.2f %s" % (time.monotonic() - t, r["timed_out"]))
EOF
)
  left=0
  for _ in $(seq 50); do
    left=$(survivors | wc -l)
    [ "$left" = 0 ] && break
    sleep 0.1
  done
  # shellcheck disable=SC2086 # $out is two fields
  printf '%-60s %8s %10s %5s\n' "$s" ${out} "$left"
  for p in $(survivors); do kill -9 "$p" 2>/dev/null || true; done
done
