#!/usr/bin/env bash
# Worker memory after a flood of unfinished bodies (issue 41): kv --io event -w 1 with its
# default budget (--max-buffered-bytes 64 MiB); N connections each start a RESP `SET` of a
# 1 MB value and send SENT bytes of it (some are paused at the budget, some refused), the
# script waits HOLD seconds, then closes them all (WAVES groups, 0.3 s apart) and prints the
# worker's VmRSS (/proc/PID/status) before the flood, at its end, and each second for 10 s
# after the clients left. Issue 41's goal: back within 16 MiB of "before" within 10 s.
#
#   bench/rss-after-flood.sh                   1000 connections, 300 KB each, one wave
#   N=3000 SENT=990000 WAVES=4 bench/rss-after-flood.sh
#
# Loopback only, bounded: N connections, HOLD + 11 s of measurement. Needs python3.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-1000}
SENT=${SENT:-300000}
HOLD=${HOLD:-2}
WAVES=${WAVES:-1}
ulimit -n $((N + 256)) 2>/dev/null || ulimit -n "$(ulimit -Hn)"
[ -n "${NOBUILD:-}" ] || cargo build --release --quiet --example kv
log=$(mktemp)
target/release/examples/kv -l 127.0.0.1:0 --io event -w 1 2>"$log" &
master=$!
trap 'kill $master 2>/dev/null || true; wait $master 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 200); do grep -q " ready" "$log" && break; sleep 0.05; done
port=$(grep -o 'listening on 127.0.0.1:[0-9]*' "$log" | head -1 | cut -d: -f2)
worker=$(pgrep -P "$master" | head -1)
python3 - "$port" "$worker" "$N" "$SENT" "$HOLD" "$WAVES" <<'PY'
import socket, sys, time
port, pid, n, sent, hold, waves = (int(a) for a in sys.argv[1:7])
def rss():
    with open(f"/proc/{pid}/status") as f:
        return next(int(l.split()[1]) // 1024 for l in f if l.startswith("VmRSS:"))
before = rss()
socks, body = [], b"a" * sent
for _ in range(n):
    s = socket.create_connection(("127.0.0.1", port))
    s.setblocking(False)
    data = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1000000\r\n" + body
    try:
        while data:
            data = data[s.send(data):]
    except OSError:
        pass
    socks.append(s)
time.sleep(hold)
peak = rss()
k = -(-n // waves)
for w in range(waves):
    for s in socks[w * k:(w + 1) * k]:
        s.close()
    if w < waves - 1:
        time.sleep(0.3)
after = []
for _ in range(10):
    time.sleep(1)
    after.append(rss())
back = next((i + 1 for i, r in enumerate(after) if r <= before + 16), None)
print(f"kv --io event -w 1, {n} connections x {sent} bytes, {waves} wave(s): worker VmRSS "
      f"before {before} MiB, flood {peak} MiB, 1..10 s after the close {after} MiB; "
      f"within 16 MiB of before after: {f'{back} s' if back else 'not within 10 s'}")
PY
