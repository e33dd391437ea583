#!/usr/bin/env bash
# The cost of one runas call end to end (issue 18): N calls (default 200) of `id -u` as
# nobody, one after the other on one keep-alive connection of Python's xmlrpc.client, to
# the runas example on loopback with one worker; prints the mean, p50 and p90 in ms.
# Each call is an HTTP POST, the XML-RPC parse and policy check in the worker, and the
# command's start as nobody, its output and its reap (with a helper: one round trip on the
# channel, and the helper's own re-check).
#
#   sudo bench/runas-call.sh                        (builds the release example)
#   sudo BIN=/path/to/runas N=500 bench/runas-call.sh [--sandbox]
#
# Needs root and python3. The server is stopped at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
[ "$(id -u)" = 0 ] || { echo "runas-call.sh: run as root" >&2; exit 1; }
if [ -z "${BIN:-}" ]; then
  cargo build --release --quiet --example runas
  BIN=target/release/examples/runas
fi
N=${N:-200}
work=$(mktemp -d)
chmod 755 "$work"
SERVER=""
cleanup() {
  [ -z "$SERVER" ] || kill "$SERVER" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
head -c 24 /dev/urandom | base64 >"$work/token"
chmod 600 "$work/token"
cat >"$work/policy.toml" <<POLICY
token_file = "$work/token"
[commands.id]
program = "/usr/bin/id"
users = ["nobody"]
args = ["-u"]
max_processes = 100000
POLICY
chmod 644 "$work/policy.toml"
"$BIN" --policy "$work/policy.toml" -l 127.0.0.1:0 -w 1 --control "$work/ctl" "$@" >"$work/log" 2>&1 &
SERVER=$!
port=$(ready_port "$work/log" 30)
[ -n "$port" ] || { echo "runas did not start:" >&2; cat "$work/log" >&2; exit 1; }
addr=127.0.0.1:$port
python3 - "$addr" "$(cat "$work/token")" "$N" <<'PY'
import statistics, sys, time, xmlrpc.client
addr, token, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
proxy = xmlrpc.client.ServerProxy("http://%s/RPC2" % addr)
for _ in range(10):  # warm-up
    proxy.run(token, "nobody", "id", ["-u"])
times = []
for _ in range(n):
    t = time.perf_counter()
    r = proxy.run(token, "nobody", "id", ["-u"])
    times.append((time.perf_counter() - t) * 1000)
    assert r["status"] == 0, r
times.sort()
print("calls %d  mean %.3f ms  p50 %.3f ms  p90 %.3f ms  max %.3f ms" % (
    n, statistics.mean(times), times[n // 2], times[n * 9 // 10], times[-1]))
PY
