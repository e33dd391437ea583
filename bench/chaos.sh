#!/usr/bin/env bash
# The fault suite of issue 14: each scenario puts the release build of an example under one
# fault and prints ONE line, `scenario: figure (details)`. Loopback only; every scenario is
# bounded in time (it runs under `timeout`) and stops every process it started, also when it
# fails or is interrupted. Clients never retry (wrk and ab do not), so a failure is counted.
#
#   bench/chaos.sh                  # every scenario, in order (about 7 minutes; at most 22)
#   bench/chaos.sh kill-storm ...   # only these
#   bench/chaos.sh --list           # the scenarios' names, with what each one does
#   IO=event bench/chaos.sh ...     # http_hello's scenarios with --io event (issue 16)
#   IO=hybrid bench/chaos.sh ...    # or --io hybrid (issue 21)
#
# Figures (see RELIABILITY.md for the goals and the recorded runs):
#   reload-keepalive, reload-close   failed requests (wrk's socket errors + non-2xx) of the total,
#                                    under `wrk -t1 -c16` keep-alive (or `Connection: close`)
#                                    load across 10 reloads (`reload`, which waits for the new
#                                    generation) 1 s apart. Goal 0.
#   upgrade-keepalive, upgrade-close the same across 10 binary upgrades (`upgrade`). Goal 0.
#   upgrade-signal                   the same (keep-alive) across 10 upgrades by SIGUSR2 to the
#                                    master the pid file names, each waited for by the old
#                                    master's "done" line (issue 31). Goal 0.
#   kill-storm                       static pool of 4 under wrk keep-alive; SIGKILL to a random
#                                    serving worker every 100 ms for 10 s. Failed requests against
#                                    workers killed (goal: at most one per kill), the longest time
#                                    no worker was serving (goal < 0.5 s), the time from the last
#                                    kill back to 4 serving workers (goal < 2 s), zombie children
#                                    of the master after that (goal 0). "Serving" is the master's
#                                    own view (`status json`: idle, reading, handling, writing or
#                                    closing, and the process alive; an event or async worker
#                                    also taking connections, `accepts_paused` false: its state
#                                    is `reading` from its start to its exit, with connections
#                                    or without, and an async one never shows `finishing`),
#                                    sampled every 20 ms.
#   proxy-trickle                    how long each of two connections trickling a PROXY v1 header
#                                    one byte every 2 s holds its worker (-w 2) before the server
#                                    closes it (goal: --header-timeout, 20 s), and how long a
#                                    normal client meanwhile waits for its answer. Gives up at 60 s.
#   tls-trickle                      how long a ClientHello trickled one byte per second is kept
#                                    before the server closes it (goal: --tls-handshake-timeout,
#                                    10 s). Gives up at 60 s.
#   slow-reader                      how long a client reading a 64 MiB file at 100 B/s (receive
#                                    buffer 4 KiB) holds its worker (until no worker process owns
#                                    the server's end of the connection, from `ss -p`; goal: cut by
#                                    --min-send-rate, 500 B/s). Gives up at 90 s. Meanwhile a 20 MiB
#                                    download at 1 MiB/s must complete, never be cut.
#   slowloris                        how long a normal client waits for `GET /` while 300
#                                    connections from 127.0.0.2 send half a request (-w 4, defaults;
#                                    gives up at 30 s); the same with --max-conns-per-ip 2; whether
#                                    the master warned about slow clients (--max-conns-per-ip).
#                                    The cap is 2, below the pool's 4: a worker serves one
#                                    connection at a time, so a cap of 4 or more (8) refuses
#                                    nothing with -w 4 and the client still waits > 30 s.
#   idle-flood                       the same with 300 idle connections to the echo example.
#   broken-upgrade                   an upgrade to a wrapper script whose child never becomes
#                                    ready (--start-timeout 10) under wrk load: the exit code of
#                                    `upgrade` (goal: non-zero), failed requests (goal 0) and the
#                                    wrapper's processes left afterwards (goal 0).
#   master-kill                      SIGKILL to the master under wrk load: the time until all its
#                                    workers are gone (parent-death signal), and the time from a
#                                    fresh start on the same port to its ready line.
#   log-disk-full                    logs (--log-file, --access-log) on a full 64 KiB tmpfs under
#                                    wrk load, two reloads: failed requests (goal 0), the master
#                                    alive, lines counted as dropped, and a "writable again" line
#                                    once space is freed (issue 31; needs root).
#   stderr-closed                    stderr a pipe whose reader leaves after the ready line, under
#                                    wrk load, two reloads: failed requests (goal 0), master alive.
#   body-flood                       3,000 connections each send 990 KB of a 1 MB body, then a
#                                    byte every 5 s, to 2 event workers: the largest worker RSS
#                                    (bounded by --max-buffered-bytes) and probes answered.
#   slow-bodies                      300 addresses send 70 KB of a 200 KB body, then a byte every
#                                    5 s, to hybrid -w 4: probes answered within 1 s.
#
# Issue 33, async handlers (async_hello: an event worker runs a tokio runtime, each connection
# one of its futures; `/sleep?ms=N` waits on a tokio timer). IO does not apply to them.
#   async-reload                     async_hello -w 2 under `wrk -t1 -c64 --timeout 5s`
#                                    keep-alive load of `GET /sleep?ms=200` (about 64 requests
#                                    always in flight, 32 per worker) across 10 reloads 1 s
#                                    apart: failed requests of the total. Goal 0.
#   async-upgrade                    the same across 10 binary upgrades (`upgrade`). Goal 0.
#   async-kill-storm                 kill-storm's storm on async_hello -w 4 under
#                                    `wrk -t1 -c64 --timeout 5s` keep-alive `GET /sleep?ms=20`:
#                                    failed requests against workers killed, and per kill beside
#                                    the requests a worker holds in flight on average
#                                    (c / workers = 16), the expected loss of a kill (an async
#                                    worker takes all its connections with it: the goal is not
#                                    one per kill); pool empty, back to 4 and zombies as in
#                                    kill-storm (same goals).
#
# wrk counts a request unanswered after 2 s (its default --timeout; 5 s in the async
# scenarios) as a timeout: a failure.
# The machine may be busy: counts (failed requests, processes left) are the figures that
# matter; times are bounds ("held > 60 s") or orders of magnitude. Flags that a build may not
# have yet are detected from --help (has_flag), never passed blindly: slow-reader pins
# --min-send-rate 500 when the build has it and says "flag missing" otherwise (it then
# measures today's behaviour). A scenario that fails or overruns its bound prints
# "SCENARIO: n/a (...)" and the suite goes on.
set -euo pipefail
cd "$(dirname "$0")/.."

# EXAMPLES=DIR runs another build's binaries (an older commit's, for a figure before a
# fix), without building.
EXAMPLES=${EXAMPLES:-$PWD/target/release/examples}
HELLO=$EXAMPLES/http_hello
ECHO=$EXAMPLES/echo
ASYNC=$EXAMPLES/async_hello

# Scenario names, their one-line descriptions and their time bounds (seconds, for `timeout`).
SCENARIOS=(reload-keepalive reload-close upgrade-keepalive upgrade-close upgrade-signal
  kill-storm proxy-trickle tls-trickle slow-reader slowloris idle-flood broken-upgrade master-kill
  log-disk-full stderr-closed body-flood slow-bodies async-reload async-upgrade async-kill-storm)
declare -A ABOUT=(
  [reload-keepalive]="10 reloads 1 s apart under wrk -c16 keep-alive: failed requests"
  [reload-close]="10 reloads 1 s apart under wrk -c16 Connection: close: failed requests"
  [upgrade-keepalive]="10 upgrades 1 s apart under wrk -c16 keep-alive: failed requests"
  [upgrade-close]="10 upgrades 1 s apart under wrk -c16 Connection: close: failed requests"
  [upgrade-signal]="10 upgrades by SIGUSR2 1 s apart under wrk -c16 keep-alive: failed requests"
  [kill-storm]="SIGKILL a serving worker every 100 ms for 10 s: failures, pool empty, recovery, zombies"
  [proxy-trickle]="2 PROXY headers trickled 1 byte/2 s against -w 2: time each holds a worker"
  [tls-trickle]="a ClientHello trickled 1 byte/s: time until the server closes it"
  [slow-reader]="a 64 MiB download read at 100 B/s: time its worker is held; a 1 MiB/s one completes"
  [slowloris]="300 half requests from 127.0.0.2: a normal client's wait; with --max-conns-per-ip 2"
  [idle-flood]="300 idle connections to echo: a normal client's wait; with --max-conns-per-ip 2"
  [broken-upgrade]="upgrade to a wrapper whose child never gets ready: exit code, failures, leftovers"
  [master-kill]="SIGKILL the master under load: workers gone, fresh start ready"
  [log-disk-full]="logs on a full 64 KiB tmpfs under wrk, two reloads: failures, master alive, lines dropped"
  [stderr-closed]="stderr a pipe whose reader left, under wrk, two reloads: failures, master alive"
  [body-flood]="3,000 connections each send 990 KB of a 1 MB body, then a byte per 5 s: worker RSS, probes"
  [slow-bodies]="300 addresses send 70 KB of a 200 KB body, then a byte per 5 s, -w 4: probes within 1 s"
  [async-reload]="async_hello -w 2, 10 reloads 1 s apart under wrk -c64 /sleep?ms=200: failed requests"
  [async-upgrade]="async_hello -w 2, 10 upgrades 1 s apart under wrk -c64 /sleep?ms=200: failed requests"
  [async-kill-storm]="kill-storm on async_hello -w 4, wrk -c64 /sleep?ms=20: failures per kill, pool empty, recovery, zombies"
)
declare -A BOUND=([reload-keepalive]=45 [reload-close]=45 [upgrade-keepalive]=60
  [upgrade-close]=60 [upgrade-signal]=60 [kill-storm]=60 [proxy-trickle]=75 [tls-trickle]=75
  [slow-reader]=110 [slowloris]=80 [idle-flood]=80 [broken-upgrade]=45 [master-kill]=30
  [log-disk-full]=40 [stderr-closed]=40 [body-flood]=120 [slow-bodies]=90 [async-reload]=60
  [async-upgrade]=75 [async-kill-storm]=60)

# The server and the load of the reload and upgrade helpers, and wrk's connections
# (start_wrk). Set here, not read from the environment; a scenario changes them for one call,
# `LOAD_SERVER=$ASYNC LOAD_WORKERS=2 reload_under_load ...` (issue 33's async scenarios).
LOAD_SERVER=$HELLO
LOAD_WORKERS=4
LOAD_PATH=/
LOAD_NOTE="" # added to the line, after wrk's details
WRK_CONNS=16

# ---------------------------------------------------------------------------------------
# Helpers. Every process a scenario starts is recorded in PIDS (masters after an upgrade are
# found through PIDFILES, a broken upgrade's leftovers through MARK) and ended at exit.

WORK=""
PIDS=()
PIDFILES=()
MARK="CHAOS_MARK=$$-$RANDOM"

cleanup() {
  set +e
  local pids=("${PIDS[@]}") f
  for f in "${PIDFILES[@]}"; do [[ -s $f ]] && pids+=("$(cat "$f")"); done
  pids+=($(marked))
  ((${#pids[@]})) && kill -TERM "${pids[@]}" 2>/dev/null
  for _ in $(seq 50); do
    local left=0 p
    for p in "${pids[@]}"; do alive "$p" && left=1; done
    ((left)) || break
    sleep 0.05
  done
  ((${#pids[@]})) && kill -KILL "${pids[@]}" 2>/dev/null
  wait 2>/dev/null
  [[ -n $WORK ]] && rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
trap 'exit 129' HUP

# The state letter of a process (R, S, Z...), nothing if it does not exist.
proc_state() {
  local st
  st=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  st=${st##*) }
  echo "${st%% *}"
}
# Whether a process exists and is not a zombie.
alive() { local s; s=$(proc_state "$1"); [[ -n $s && $s != Z ]]; }
# The children of a process (the master's workers, and a new master during an upgrade).
children() { cat "/proc/$1/task/$1/children" 2>/dev/null || true; }
# Processes carrying this run's MARK in their environment (a broken upgrade's leftovers).
marked() { grep -lsz "^$MARK\$" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3 || true; }

# wait_for SECS CMD...: runs CMD every 20 ms until it succeeds; fails after SECS.
wait_for() {
  local deadline=$(($(date +%s%N) + $1 * 1000000000))
  shift
  until "$@"; do
    (($(date +%s%N) < deadline)) || return 1
    sleep 0.02
  done
}
# (-s: the log may not exist yet, the server's shell creates it in the background.)
ready_in() { grep -qs 'master: ready' "$1"; }
none_alive() { local p; for p in "$@"; do alive "$p" && return 1; done; return 0; }

# A scratch directory readable by the workers (they run as nobody when started as root).
workdir() {
  WORK=$(mktemp -d /tmp/chaos.XXXXXX)
  chmod 755 "$WORK"
}

# start_server LOG BIN ARGS...: starts a master, waits for its ready line; sets MASTER and PORT.
start_server() {
  launch_server "$@" && await_ready "$1"
}

# io_args BIN: the arguments IO asks for, one a line. IO=event: http_hello's scenarios in
# event mode (the other binaries are blocking only), also where the scenario runs a copy of
# it (the upgrades: the copy is what is upgraded; issue 31 found that these ran in blocking
# mode whatever IO said).
io_args() {
  if [ -n "${IO:-}" ] && { [ "$1" = "$HELLO" ] || cmp -s "$1" "$HELLO"; }; then
    printf '%s\n' --io "$IO"
  fi
}

# launch_server LOG BIN ARGS...: starts BIN ARGS (and what IO asks for) in the background,
# its stderr to LOG; MASTER is its pid.
launch_server() {
  local log=$1 bin=$2
  shift 2
  local io=()
  mapfile -t io < <(io_args "$bin")
  "$bin" "$@" "${io[@]}" 2>"$log" &
  MASTER=$!
  PIDS+=("$MASTER")
}

# await_ready LOG: waits (30 s at most) for the ready line in LOG, where the server logs
# (its stderr, or its --log-file); PORT is then its first listener's port.
await_ready() {
  if ! wait_for 30 ready_in "$1"; then
    echo "the server did not become ready: $(tail -3 "$1" 2>/dev/null)" >&2
    return 1
  fi
  PORT=$(grep -o 'listening on 127.0.0.1:[0-9]*' "$1" | head -1 | cut -d: -f2)
}

# stop_server PID: TERM (connections in progress may finish), KILL after 5 s.
stop_server() {
  kill -TERM "$1" 2>/dev/null || true
  wait_for 5 none_alive "$1" || kill -KILL "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}

# start_wrk OUT ARGS...: wrk -t1 -c$WRK_CONNS (16; for at most 10 minutes; stop_wrk ends it)
# in WRK.
start_wrk() {
  local out=$1
  shift
  wrk -t1 -c"$WRK_CONNS" -d600s "$@" >"$out" 2>&1 &
  WRK=$!
  PIDS+=("$WRK")
}
# Ends wrk with SIGINT, on which it prints its summary.
stop_wrk() {
  kill -INT "$WRK" 2>/dev/null || true
  wait "$WRK" 2>/dev/null || true
}
# wrk_counts OUT: "FAILED TOTAL DETAILS..." from wrk's summary; FAILED is the socket errors
# (connect, read, write, timeout) plus the non-2xx/3xx responses.
wrk_counts() {
  if ! grep -q ' requests in ' "$1"; then
    echo "wrk gave no summary: $(tr '\n' ' ' <"$1" | tail -c 200)" >&2
    return 1
  fi
  awk '
    / requests in / { total = $1 }
    /Socket errors:/ { gsub(",", ""); c = $4; r = $6; w = $8; t = $10 }
    /Non-2xx or 3xx responses:/ { n = $5 }
    END { printf "%d %d socket errors: connect %d, read %d, write %d, timeout %d; non-2xx %d\n",
          c + r + w + t + n, total, c, r, w, t, n }' "$1"
}

# Whether this build's http_hello has a flag (features of issue 14 land one by one).
has_flag() { "$HELLO" --help 2>/dev/null | grep -q -- "$1"; }

# ---------------------------------------------------------------------------------------
# Scenarios: reloads and upgrades under load.

# reload_under_load NAME [WRK ARGS...]: LOAD_SERVER -w LOAD_WORKERS, wrk on LOAD_PATH.
reload_under_load() {
  local name=$1 ok=0
  shift
  workdir
  start_server "$WORK/log" "$LOAD_SERVER" -l 127.0.0.1:0 -w "$LOAD_WORKERS" --control "$WORK/ctl"
  start_wrk "$WORK/wrk" "$@" "http://127.0.0.1:$PORT$LOAD_PATH"
  sleep 1
  for _ in $(seq 10); do
    "$LOAD_SERVER" reload --control "$WORK/ctl" >/dev/null 2>>"$WORK/reload.err" && ok=$((ok + 1))
    sleep 1
  done
  stop_wrk
  stop_server "$MASTER"
  local failed total details
  read -r failed total details < <(wrk_counts "$WORK/wrk")
  echo "$name: $failed failed of $total requests ($ok/10 reloads ok; $details${LOAD_NOTE:+; $LOAD_NOTE})"
}
scenario_reload_keepalive() { reload_under_load reload-keepalive; }
scenario_reload_close() { reload_under_load reload-close -H 'Connection: close'; }

# upgrade_under_load NAME HOW [WRK ARGS...]: the master changes at each upgrade, asked by
# HOW: `command` (`upgrade`, which waits for the new master) or `signal` (USR2, then a wait
# for the old master's "done" line); the pid file follows it. The load stays on until every
# old master has drained and left. The server: a copy of LOAD_SERVER, -w LOAD_WORKERS; wrk
# on LOAD_PATH.
upgrade_under_load() {
  local name=$1 how=$2 ok=0 old=() i
  shift 2
  workdir
  cp "$LOAD_SERVER" "$WORK/server"
  PIDFILES+=("$WORK/pid")
  start_server "$WORK/log" "$WORK/server" -l 127.0.0.1:0 -w "$LOAD_WORKERS" --control "$WORK/ctl" \
    --pid-file "$WORK/pid"
  start_wrk "$WORK/wrk" "$@" "http://127.0.0.1:$PORT$LOAD_PATH"
  sleep 1
  for i in $(seq 10); do
    old+=("$(cat "$WORK/pid")")
    if [[ $how == signal ]]; then
      kill -USR2 "${old[-1]}" && wait_for 30 upgrades_done "$i" && ok=$((ok + 1))
    else
      "$WORK/server" upgrade --control "$WORK/ctl" >/dev/null 2>>"$WORK/upgrade.err" && ok=$((ok + 1))
    fi
    sleep 1
  done
  local drained=yes
  wait_for 40 none_alive "${old[@]}" || drained="NO (old masters left after 40 s)"
  sleep 0.5
  stop_wrk
  stop_server "$(cat "$WORK/pid")"
  local failed total details
  read -r failed total details < <(wrk_counts "$WORK/wrk")
  echo "$name: $failed failed of $total requests ($ok/10 upgrades ok; old masters drained:" \
    "$drained; $details${LOAD_NOTE:+; $LOAD_NOTE})"
}
# upgrades_done N: the old masters have logged N upgrades by signal done.
upgrades_done() { (($(grep -c 'upgrade asked by SIGUSR2 done' "$WORK/log") >= $1)); }
scenario_upgrade_keepalive() { upgrade_under_load upgrade-keepalive command; }
scenario_upgrade_close() { upgrade_under_load upgrade-close command -H 'Connection: close'; }
scenario_upgrade_signal() { upgrade_under_load upgrade-signal signal; }

# ---------------------------------------------------------------------------------------
# The kill storm.

scenario_kill_storm() {
  workdir
  start_server "$WORK/log" "$HELLO" -l 127.0.0.1:0 -w 4 --control "$WORK/ctl"
  start_wrk "$WORK/wrk" "http://127.0.0.1:$PORT/"
  sleep 1
  local kills empty samples longest back zombies backoff
  read -r kills empty samples longest back zombies backoff < <(storm "$MASTER" "$WORK/ctl" 4)
  sleep 0.5
  stop_wrk
  stop_server "$MASTER"
  local failed total details
  read -r failed total details < <(wrk_counts "$WORK/wrk")
  echo "kill-storm: $failed failed requests for $kills workers killed, pool empty for at most" \
    "$longest s, back to 4 in $back s, $zombies zombies ($total requests;" \
    "empty in $empty of $samples samples during the storm; restarts counted as back-off:" \
    "$backoff; $details)"
}

# storm MASTER CONTROL TARGET: prints "KILLS EMPTY SAMPLES LONGEST_EMPTY BACK_TO_FULL ZOMBIES
# BACKOFF" (BACKOFF: the master's count of restarts under back-off, from `status json`).
storm() {
  python3 - "$@" <<'PY'
import json, os, random, signal, socket, sys, time

master, ctl, target = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
STORM, EVERY, SAMPLE, RECOVERY = 10.0, 0.1, 0.02, 20.0
SERVING = {"idle", "reading", "handling", "writing", "closing"}

def state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None

def children():
    try:
        with open(f"/proc/{master}/task/{master}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []

def status():
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(2)
    s.connect(ctl)
    s.sendall(b"status json\n")
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    s.close()
    if not data.startswith(b"OK\n"):
        raise SystemExit(f"status json: {data[:200]!r}")
    return json.loads(data[3:])

def serving():
    """The workers the master sees serving, whose process is alive. An event or async
    worker (its "event" is not null) is "reading" from its start to its exit, with
    connections or without (an async one does not show "finishing" when it stops either):
    it serves when it also takes connections (not "accepts_paused": at
    --worker-connections, or backing off after an accept error)."""
    workers = status()["workers"]
    return [w["pid"] for w in workers
            if w["state"] in SERVING and not (w.get("event") or {}).get("accepts_paused")
            and state(w["pid"]) not in (None, "Z")]

samples, kills = [], 0
start = time.monotonic()
next_kill, last_kill, full_at = start, start, None
while True:
    now = time.monotonic()
    pids = serving()
    samples.append((now, len(pids)))
    if now - start < STORM:
        if now >= next_kill:
            next_kill += EVERY
            if pids:  # a kill is skipped when nothing serves: the storm hits serving workers
                os.kill(random.choice(pids), signal.SIGKILL)
                kills += 1
                last_kill = time.monotonic()
    elif len(pids) >= target:
        full_at = now
        break
    elif now - last_kill > RECOVERY:
        break
    time.sleep(SAMPLE)

# The longest run of samples with no serving worker, from its first sample to the next
# sample with one (or to the last sample).
longest, empty_since = 0.0, None
for t, n in samples:
    if n == 0 and empty_since is None:
        empty_since = t
    elif n > 0 and empty_since is not None:
        longest = max(longest, t - empty_since)
        empty_since = None
if empty_since is not None:
    longest = max(longest, samples[-1][0] - empty_since)
time.sleep(1)  # let the master reap what it will
zombies = sum(1 for p in children() if state(p) == "Z")
during = [n for t, n in samples if t - start < STORM]
back = f"{full_at - last_kill:.2f}" if full_at else f">{RECOVERY:.0f}"
print(kills, sum(1 for n in during if n == 0), len(during), f"{longest:.2f}", back, zombies,
      status()["restarts"].get("backoff", "?"))
PY
}

# ---------------------------------------------------------------------------------------
# Trickles: PROXY header and TLS handshake.

scenario_proxy_trickle() {
  workdir
  start_server "$WORK/log" "$HELLO" -l 127.0.0.1:0 -w 2 --proxy-protocol
  local out
  out=$(python3 - "$PORT" <<'PY'
import select, socket, sys, time

port, STEP, BOUND = int(sys.argv[1]), 2.0, 60.0
header = b"PROXY TCP4 192.0.2.10 127.0.0.1 40000 80\r\n"
t0 = time.monotonic()
trickles = []
for _ in range(2):
    s = socket.create_connection(("127.0.0.1", port))
    trickles.append({"sock": s, "sent": 0, "closed": None})

def close_seen(t, now):
    """Whether the server ended this connection (end of file, reset)."""
    try:
        if t["sock"].recv(4096):
            return False  # an answer before the end: keep reading
    except (ConnectionError, OSError):
        pass
    t["closed"] = now - t0
    return True

normal, asked, answered = None, None, None
while True:
    now = time.monotonic()
    if now - t0 > BOUND or (all(t["closed"] is not None for t in trickles) and answered is not None):
        break
    for t in trickles:
        if t["closed"] is None and t["sent"] < len(header) and now - t0 >= t["sent"] * STEP:
            try:
                t["sock"].send(header[t["sent"] : t["sent"] + 1])
                t["sent"] += 1
            except (ConnectionError, OSError):
                t["closed"] = now - t0
    # The normal client comes once both trickles hold a worker, with a whole header.
    if normal is None and now - t0 >= 1.0:
        normal = socket.create_connection(("127.0.0.1", port))
        normal.sendall(b"PROXY TCP4 192.0.2.20 127.0.0.1 40001 80\r\n"
                       b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        asked = time.monotonic()
    watch = [t["sock"] for t in trickles if t["closed"] is None]
    if normal is not None and answered is None:
        watch.append(normal)
    readable, _, _ = select.select(watch, [], [], 0.1)
    now = time.monotonic()
    for t in trickles:
        if t["sock"] in readable and t["closed"] is None:
            close_seen(t, now)
    if normal in readable and answered is None:
        try:
            got = normal.recv(64)
        except (ConnectionError, OSError):
            got = b""
        answered = (now - asked, got[:12].decode(errors="replace") or "closed, no answer")
held = ", ".join(f"{t['closed']:.1f} s" if t["closed"] is not None else f"> {BOUND:.0f} s"
                 for t in trickles)
if answered:
    who = f"answered {answered[1]!r} after {answered[0]:.1f} s"
else:
    who = f"no answer within {BOUND - (asked - t0):.0f} s"
worst = max((t["closed"] for t in trickles if t["closed"] is not None), default=None)
if any(t["closed"] is None for t in trickles):
    figure = f"held > {BOUND:.0f} s"
else:
    figure = f"held {worst:.1f} s"
print(f"{figure} (the two trickled connections: {held}; a normal client: {who})")
PY
  )
  stop_server "$MASTER"
  echo "proxy-trickle: $out"
}

scenario_tls_trickle() {
  workdir
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj /CN=localhost -keyout "$WORK/key.pem" -out "$WORK/cert.pem" 2>/dev/null
  start_server "$WORK/log" "$HELLO" -l '127.0.0.1:0?tls' -w 2 \
    --tls-cert "$WORK/cert.pem" --tls-key "$WORK/key.pem"
  local out
  out=$(python3 - "$PORT" <<'PY'
import select, socket, ssl, sys, time

port, STEP, BOUND = int(sys.argv[1]), 1.0, 60.0
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
tls = ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
try:
    tls.do_handshake()
except ssl.SSLWantReadError:
    pass
hello = outgoing.read()
s = socket.create_connection(("127.0.0.1", port))
t0, sent, closed, alert = time.monotonic(), 0, None, False
while closed is None and time.monotonic() - t0 < BOUND:
    if sent < len(hello) and time.monotonic() - t0 >= sent * STEP:
        try:
            s.send(hello[sent : sent + 1])
            sent += 1
        except (ConnectionError, OSError):
            closed = time.monotonic() - t0
            break
    if select.select([s], [], [], 0.1)[0]:
        try:
            if s.recv(4096):
                alert = True
                continue
        except (ConnectionError, OSError):
            pass
        closed = time.monotonic() - t0
if closed is None:
    print(f"held > {BOUND:.0f} s ({sent} of {len(hello)} ClientHello bytes sent)")
else:
    print(f"closed after {closed:.1f} s ({sent} of {len(hello)} ClientHello bytes sent"
          f"{', an alert first' if alert else ''})")
PY
  )
  stop_server "$MASTER"
  echo "tls-trickle: $out"
}

# ---------------------------------------------------------------------------------------
# Slow readers.

scenario_slow_reader() {
  workdir
  mkdir "$WORK/static"
  head -c $((64 << 20)) /dev/urandom >"$WORK/static/big.bin"
  head -c $((20 << 20)) /dev/urandom >"$WORK/static/medium.bin"
  chmod -R a+rX "$WORK/static"
  local rate=() note="--min-send-rate 500"
  if has_flag --min-send-rate; then
    rate=(--min-send-rate 500) # pinned: the reader below must stay below it
  else
    note="--min-send-rate: flag missing, default behaviour"
  fi
  start_server "$WORK/log" "$HELLO" -l 127.0.0.1:0 -w 2 --static-dir "$WORK/static" "${rate[@]}"
  local out
  out=$(python3 - "$PORT" <<'PY'
import socket, subprocess, sys, threading, time

port = int(sys.argv[1])
SLOW_RATE, SLOW_BOUND = 100, 90.0
HEALTHY_RATE, HEALTHY_BOUND = 1 << 20, 60.0

def request(path, rcvbuf=None):
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # before connect: the window
        # A network's segment size, not loopback's 64 KiB: the reader's window then opens
        # in small steps as it reads, as it would across a network (on loopback's MSS the
        # send watch waits up to 60 s to see progress).
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 1448)
    s.connect(("127.0.0.1", port))
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode())
    return s

def held_by_worker(cport):
    """Whether a process still owns the server's end of the connection from cport."""
    out = subprocess.run(["ss", "-tnpH", "state", "all", f"( sport = :{port} and dport = :{cport} )"],
                         capture_output=True, text=True).stdout
    return "users:" in out

healthy = {}
def healthy_download():
    s = request("/static/medium.bin")
    s.settimeout(10)
    t0, data, length = time.monotonic(), b"", None
    try:
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        got = len(body)
        while length is not None and got < length and time.monotonic() - t0 < HEALTHY_BOUND:
            ahead = got - HEALTHY_RATE * (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead / HEALTHY_RATE)
            chunk = s.recv(65536)
            if not chunk:
                break
            got += len(chunk)
    except (ConnectionError, OSError) as e:
        healthy["error"] = type(e).__name__
    took = time.monotonic() - t0
    if length is not None and got >= length:
        healthy["text"] = f"completed in {took:.1f} s"
    elif took >= HEALTHY_BOUND:
        healthy["text"] = f"not done after {HEALTHY_BOUND:.0f} s"
    else:
        healthy["text"] = f"cut after {took:.1f} s at {got >> 20} MiB ({healthy.get('error', 'end of file')})"

h = threading.Thread(target=healthy_download)
h.start()
s = request("/static/big.bin", rcvbuf=4096)
cport = s.getsockname()[1]
s.settimeout(0.5)
t0, got, seen, cut = time.monotonic(), 0, "nothing", None
time.sleep(0.5)  # the worker takes the connection
while time.monotonic() - t0 < SLOW_BOUND:
    try:
        chunk = s.recv(SLOW_RATE)
        if not chunk:
            seen = "end of file"
        got += len(chunk)
    except socket.timeout:
        pass
    except (ConnectionError, OSError) as e:
        seen = type(e).__name__
    if not held_by_worker(cport):
        cut = time.monotonic() - t0
        break
    time.sleep(1)
s.close()
h.join()
if cut is None:
    print(f"held > {SLOW_BOUND:.0f} s (reader at {SLOW_RATE} B/s read {got} bytes;"
          f" healthy 1 MiB/s download: {healthy['text']}")
else:
    print(f"held {cut:.1f} s (reader at {SLOW_RATE} B/s read {got} bytes, then saw {seen};"
          f" healthy 1 MiB/s download: {healthy['text']}")
PY
  )
  stop_server "$MASTER"
  echo "slow-reader: $out; $note)"
}

# ---------------------------------------------------------------------------------------
# Floods: slowloris against http_hello, idle connections against echo.

# flood PORT KIND ATTACKERS FROM BOUND: holds ATTACKERS connections from FROM (KIND http: half
# a request each; echo: nothing), then prints how long a normal client from 127.0.0.1 waits.
flood() {
  python3 - "$@" <<'PY'
import socket, sys, time

port, kind, n, source, bound = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4], float(sys.argv[5])
held = []
for _ in range(n):
    s = socket.socket()
    s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    if kind == "http":
        s.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nX-Slow: ")
    held.append(s)
t = time.monotonic()
c = socket.create_connection(("127.0.0.1", port), timeout=bound)
c.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n" if kind == "http" else b"ping\n")
expected = b"HTTP/1.1 200" if kind == "http" else b"ping\n"
try:
    answer = c.recv(64)
    took = time.monotonic() - t
    if answer.startswith(expected):
        print(f"{took:.2f} s")
    elif answer:
        print(f"{took:.2f} s for a wrong answer {answer[:20]!r}")
    else:
        print(f"{took:.2f} s, then a close without an answer")
except socket.timeout:
    print(f"> {bound:.0f} s")
PY
}

# flood_scenario NAME BIN KIND: the flood with the defaults, then with a per-address cap.
flood_scenario() {
  local name=$1 bin=$2 kind=$3 bound=30 cap=2 what="half requests"
  [[ $kind == echo ]] && what="idle connections"
  workdir
  start_server "$WORK/log" "$bin" -l 127.0.0.1:0 -w 4
  local plain capped warned=no
  plain=$(flood "$PORT" "$kind" 300 127.0.0.2 "$bound")
  # The master's slow-client warning names --max-conns-per-ip (the cap's own refusal lines,
  # "refusing connections", cannot appear here: there is no cap).
  grep 'WARN' "$WORK/log" | grep -v 'refusing connections' | grep -q -- '--max-conns-per-ip' && warned=yes
  stop_server "$MASTER"
  # A cap below the pool size: one worker serves one connection, so a cap of 4 or more
  # (--max-conns-per-ip 8) cannot refuse anything with -w 4 and changes nothing.
  start_server "$WORK/log.capped" "$bin" -l 127.0.0.1:0 -w 4 --max-conns-per-ip "$cap"
  capped=$(flood "$PORT" "$kind" 300 127.0.0.2 "$bound")
  stop_server "$MASTER"
  echo "$name: a normal client waited $plain (300 $what from 127.0.0.2, -w 4," \
    "defaults; with --max-conns-per-ip $cap: $capped; slow-client warning in the log: $warned)"
}
scenario_slowloris() { flood_scenario slowloris "$HELLO" http; }
scenario_idle_flood() { flood_scenario idle-flood "$ECHO" echo; }

# ---------------------------------------------------------------------------------------
# A broken upgrade and a master killed.

scenario_broken_upgrade() {
  workdir
  cp "$HELLO" "$WORK/real" # the client commands: the server's path is about to be a script
  cp "$HELLO" "$WORK/server"
  PIDFILES+=("$WORK/pid")
  start_server "$WORK/log" "$WORK/server" -l 127.0.0.1:0 -w 4 --control "$WORK/ctl" \
    --pid-file "$WORK/pid" --start-timeout 10
  local before
  before=$(cat "$WORK/pid")
  start_wrk "$WORK/wrk" "http://127.0.0.1:$PORT/"
  sleep 1
  # The "new binary": a shell whose child never becomes ready (and never will exit). Both
  # carry MARK in their environment, which is how the leftovers are counted (and cleaned up).
  cat >"$WORK/wrapper" <<EOF
#!/bin/sh
exec env $MARK /bin/sh -c 'sleep 3600 & wait'
EOF
  chmod 755 "$WORK/wrapper"
  cp "$WORK/wrapper" "$WORK/server.new"
  mv "$WORK/server.new" "$WORK/server"
  local rc=0
  "$WORK/real" upgrade --control "$WORK/ctl" --timeout 30 >/dev/null 2>"$WORK/upgrade.err" || rc=$?
  sleep 1
  stop_wrk
  sleep 1 # what the old master kills has had the time to die
  local left
  left=$(marked | wc -w)
  local failed total details
  read -r failed total details < <(wrk_counts "$WORK/wrk")
  local same=yes
  [[ $(cat "$WORK/pid") == "$before" ]] && alive "$before" || same=no
  stop_server "$before"
  echo "broken-upgrade: upgrade exit $rc, $failed failed of $total requests, $left wrapper" \
    "processes left (old master still serving: $same; upgrade said:" \
    "$(head -c 160 "$WORK/upgrade.err" | tr '\n' ' ' | sed 's/ *$//'); $details)"
}

scenario_master_kill() {
  workdir
  start_server "$WORK/log" "$HELLO" -l 127.0.0.1:0 -w 4
  local port=$PORT workers
  workers=$(children "$MASTER")
  start_wrk "$WORK/wrk" "http://127.0.0.1:$port/"
  sleep 1
  local t0 gone ms_gone
  t0=$(date +%s%N)
  # (stderr away from bash's "Killed" notice about its job)
  { kill -KILL "$MASTER"; wait "$MASTER"; } 2>/dev/null || true
  # shellcheck disable=SC2086 # the worker pids, one word each
  if wait_for 10 none_alive $workers; then
    gone=$(date +%s%N)
    ms_gone="$(((gone - t0) / 1000000)) ms"
  else
    ms_gone="> 10 s ($(for w in $workers; do alive "$w" && echo -n "$w "; done)left)"
  fi
  # A fresh start on the same port: from the launch to the ready line's own time stamp.
  local launch ready
  launch=$(date +%s%N)
  start_server "$WORK/log2" "$HELLO" -l "127.0.0.1:$port" -w 4
  ready=$(date -d "$(grep 'master: ready' "$WORK/log2" | head -1 | cut -d' ' -f1)" +%s%N)
  stop_wrk
  stop_server "$MASTER"
  echo "master-kill: workers gone $ms_gone after the master's SIGKILL, a fresh start ready in" \
    "$(((ready - launch) / 1000000)) ms (4 workers, under wrk -c16 keep-alive)"
}

# ---------------------------------------------------------------------------------------
# Issue 31: faults that took a whole server down.

# metric_sum ADDR NAME: the sum of a metric's samples (all labels) from /metrics.
metric_sum() {
  curl -s "http://$1/metrics" | awk -v n="$2" '$1 ~ "^"n"({|$)" { s += $2 } END { print s + 0 }'
}

# A reload and load while the log cannot be written; whether the master lives, the
# failures, what was counted as dropped. Before issue 31 the master died at its first
# line (exit 101) and every worker at its own (exit 70).
log_fault() {
  local name=$1 dropped="n/a" alive_after=no
  start_wrk "$WORK/wrk" "http://127.0.0.1:$PORT/"
  sleep 2
  kill -HUP "$MASTER" 2>/dev/null || true
  sleep 2
  kill -HUP "$MASTER" 2>/dev/null || true
  sleep 2
  stop_wrk
  alive "$MASTER" && alive_after=yes
  if [[ -n ${METRICS:-} ]] && alive "$MASTER"; then
    dropped=$(metric_sum "$METRICS" appsrv_log_lines_dropped_total)
  fi
  local failed total details
  read -r failed total details < <(wrk_counts "$WORK/wrk")
  echo "$name: $failed failed of $total requests over 2 reloads, master alive: $alive_after," \
    "log lines counted as dropped: $dropped ($details)"
}

scenario_log_disk_full() {
  if ((EUID != 0)); then echo "log-disk-full: n/a (needs root to mount a tmpfs)"; return; fi
  workdir
  mkdir "$WORK/disk"
  mount -t tmpfs -o size=64k,mode=0755 tmpfs "$WORK/disk"
  trap 'umount -l "$WORK/disk" 2>/dev/null; cleanup' EXIT
  launch_server "$WORK/log" "$HELLO" -l 127.0.0.1:0 -w 4 --log-file "$WORK/disk/error.log" \
    --access-log "$WORK/disk/access.log" --metrics-listen 127.0.0.1:0
  # The lines go to the file (stderr only has what comes before it is opened): the ready
  # line and the addresses are read there.
  await_ready "$WORK/disk/error.log" || { stop_server "$MASTER"; return; }
  METRICS=$(grep -o 'http://127.0.0.1:[0-9]*' "$WORK/disk/error.log" | head -1 | cut -c8-)
  head -c 1M /dev/zero >"$WORK/disk/filler" 2>/dev/null || true
  while printf 'filler\n' >>"$WORK/disk/error.log" 2>/dev/null; do :; done
  while printf 'filler\n' >>"$WORK/disk/access.log" 2>/dev/null; do :; done
  log_fault log-disk-full
  local again=no
  if alive "$MASTER"; then
    rm -f "$WORK/disk/filler"
    curl -s -o /dev/null "http://127.0.0.1:$PORT/" || true
    kill -HUP "$MASTER"
    wait_for 5 grep -q 'writable again' "$WORK/disk/error.log" && again=yes
  fi
  echo "log-disk-full: after space was freed, a 'writable again' line: $again"
  stop_server "$MASTER"
}

scenario_stderr_closed() {
  workdir
  # stderr is a pipe to `sed`, which leaves after the ready line, as a journald that
  # restarts or a terminal that closes.
  local io=()
  mapfile -t io < <(io_args "$HELLO")
  "$HELLO" -l 127.0.0.1:0 -w 4 --metrics-listen 127.0.0.1:0 "${io[@]}" \
    2> >(sed '/master: ready/q' >"$WORK/log") &
  MASTER=$!
  PIDS+=("$MASTER")
  await_ready "$WORK/log" || { stop_server "$MASTER"; return; }
  METRICS=$(grep -o 'http://127.0.0.1:[0-9]*' "$WORK/log" | head -1 | cut -c8-)
  log_fault stderr-closed
  stop_server "$MASTER"
}

# flood_bodies PORT N CL SENT SECS [SOURCES]: N connections (from SOURCES addresses in
# 127.1.0.0/16, round robin; 0: 127.0.0.1) each send a POST head with Content-Length CL and
# SENT bytes of its body, then one byte every 5 s, for SECS seconds; meanwhile a probe
# (GET /) every 250 ms from 127.0.0.1. Prints "probes OK SLOW FAILED (max MS)": OK answered
# within 1 s, SLOW later, FAILED not at all.
flood_bodies() {
  python3 - "$@" <<'PY'
import asyncio, socket, sys, time
port, n, cl, sent, secs = (int(a) for a in sys.argv[1:6])
sources = int(sys.argv[6]) if len(sys.argv) > 6 else 0
async def flooder(i, end):
    src = None
    if sources:
        k = i % sources
        src = (f"127.1.{k // 250}.{k % 250 + 1}", 0)
    try:
        r, w = await asyncio.open_connection("127.0.0.1", port, local_addr=src)
    except OSError:
        return
    try:
        w.write(b"POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % cl)
        left = sent
        while left > 0 and time.time() < end:
            k = min(left, 65536)
            w.write(b"a" * k)
            left -= k
            await asyncio.wait_for(w.drain(), timeout=max(0.1, end - time.time()))
        while time.time() < end:
            await asyncio.sleep(5)
            w.write(b"a")
    except (OSError, asyncio.TimeoutError):
        pass
    finally:
        w.close()
async def probe(end, stats):
    while time.time() < end - 1:
        t0 = time.time()
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            data = await asyncio.wait_for(r.read(), timeout=10)
            w.close()
            took = time.time() - t0
            ok = data.startswith(b"HTTP/1.1 200")
        except (OSError, asyncio.TimeoutError):
            ok, took = False, time.time() - t0
        if not ok:
            stats[2] += 1
        elif took <= 1:
            stats[0] += 1
        else:
            stats[1] += 1
        stats[3] = max(stats[3], took)
        await asyncio.sleep(0.25)
async def main():
    end = time.time() + secs
    stats = [0, 0, 0, 0.0]
    await asyncio.gather(probe(end, stats), *(flooder(i, end) for i in range(n)))
    print(f"probes {stats[0]} {stats[1]} {stats[2]} (max {stats[3] * 1000:.0f} ms)")
asyncio.run(main())
PY
}

# The largest RSS among a master's children, in MiB, sampled every second for SECS seconds
# (in the background: MAXRSS_FILE gets it).
watch_rss() {
  local master=$1 secs=$2 out=$3 max=0 kb p
  for _ in $(seq "$secs"); do
    for p in $(children "$master"); do
      kb=$(awk '/^VmRSS:/ { print $2 }' "/proc/$p/status" 2>/dev/null || echo 0)
      ((kb > max)) && max=$kb
    done
    echo $((max / 1024)) >"$out"
    sleep 1
  done
}

scenario_body_flood() {
  workdir
  ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
  IO=event start_server "$WORK/log" "$HELLO" -l 127.0.0.1:0 -w 2
  watch_rss "$MASTER" 50 "$WORK/rss" &
  PIDS+=("$!")
  local probes
  probes=$(flood_bodies "$PORT" 3000 1000000 990000 45)
  local rss
  rss=$(cat "$WORK/rss")
  local left="n/a"
  alive "$MASTER" && left=$(curl -s "http://127.0.0.1:$PORT/" >/dev/null && echo serving)
  stop_server "$MASTER"
  echo "body-flood: largest worker RSS ${rss} MiB (2 event workers, 3,000 unfinished 1 MB" \
    "uploads); $probes; afterwards: $left"
}

scenario_slow_bodies() {
  workdir
  ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
  IO=hybrid start_server "$WORK/log" "$HELLO" -l 127.0.0.1:0 -w 4
  local probes
  probes=$(flood_bodies "$PORT" 300 200000 70000 60 300)
  stop_server "$MASTER"
  echo "slow-bodies: $probes (hybrid -w 4; 300 bodies of 200 KB from 300 addresses, 70 KB" \
    "then a byte per 5 s; probes answered within 1 s, later, not at all)"
}

# ---------------------------------------------------------------------------------------
# Issue 33: async handlers (async_hello: event workers, each connection a future of the
# worker's tokio runtime; /sleep?ms=N a tokio timer). Many requests are in flight in each
# worker at once: wrk -c64, and --timeout 5s.

# has_async NAME: async_hello is there (an older build's EXAMPLES may not have it); else
# prints NAME's "n/a" line.
has_async() {
  [[ -x $ASYNC ]] && return 0
  echo "$1: n/a (no async_hello in $EXAMPLES)"
  return 1
}

scenario_async_reload() {
  has_async async-reload || return 0
  LOAD_SERVER=$ASYNC LOAD_WORKERS=2 LOAD_PATH='/sleep?ms=200' WRK_CONNS=64 \
    LOAD_NOTE="async_hello -w 2, wrk -c64 --timeout 5s GET /sleep?ms=200" \
    reload_under_load async-reload --timeout 5s
}

scenario_async_upgrade() {
  has_async async-upgrade || return 0
  LOAD_SERVER=$ASYNC LOAD_WORKERS=2 LOAD_PATH='/sleep?ms=200' WRK_CONNS=64 \
    LOAD_NOTE="async_hello -w 2, wrk -c64 --timeout 5s GET /sleep?ms=200" \
    upgrade_under_load async-upgrade command --timeout 5s
}

# The storm of kill-storm; the loss of a kill is the requests in flight on the killed
# worker's connections: about c / workers = 16.
scenario_async_kill_storm() {
  has_async async-kill-storm || return 0
  local workers=4 conns=64
  workdir
  start_server "$WORK/log" "$ASYNC" -l 127.0.0.1:0 -w "$workers" --control "$WORK/ctl"
  WRK_CONNS=$conns start_wrk "$WORK/wrk" --timeout 5s "http://127.0.0.1:$PORT/sleep?ms=20"
  sleep 1
  local kills empty samples longest back zombies backoff
  read -r kills empty samples longest back zombies backoff < <(storm "$MASTER" "$WORK/ctl" "$workers")
  sleep 0.5
  stop_wrk
  stop_server "$MASTER"
  local failed total details per_kill
  read -r failed total details < <(wrk_counts "$WORK/wrk")
  per_kill=$(awk -v f="$failed" -v k="$kills" 'BEGIN { if (k > 0) printf "%.1f", f / k; else print "n/a" }')
  echo "async-kill-storm: $failed failed requests for $kills workers killed ($per_kill per kill;" \
    "expected loss bound: c / workers = $((conns / workers)) in flight per worker), pool empty" \
    "for at most $longest s, back to $workers in $back s, $zombies zombies ($total requests;" \
    "empty in $empty of $samples samples during the storm; restarts counted as back-off:" \
    "$backoff; async_hello -w $workers, wrk -c$conns --timeout 5s GET /sleep?ms=20; $details)"
}

# ---------------------------------------------------------------------------------------

usage() { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; }

known() { [[ -v ABOUT[$1] ]]; }

main() {
  if [[ ${1-} == --list ]]; then
    for s in "${SCENARIOS[@]}"; do printf '%-18s %s\n' "$s" "${ABOUT[$s]}"; done
    return 0
  fi
  if [[ ${1-} == -h || ${1-} == --help ]]; then
    usage
    return 0
  fi
  # One scenario, in a process of its own (run by the loop below under `timeout`).
  if [[ ${1-} == --one ]]; then
    local fn=scenario_${2//-/_}
    "$fn"
    return 0
  fi
  local chosen=("$@") s
  ((${#chosen[@]})) || chosen=("${SCENARIOS[@]}")
  for s in "${chosen[@]}"; do
    known "$s" || { echo "unknown scenario $s (bench/chaos.sh --list)" >&2; return 2; }
  done
  if [[ $EXAMPLES == "$PWD/target/release/examples" ]]; then
    local examples=(--example http_hello --example echo)
    [[ " ${chosen[*]} " == *" async-"* ]] && examples+=(--example async_hello)
    cargo build --release --quiet "${examples[@]}"
  fi
  local started=$SECONDS rc
  for s in "${chosen[@]}"; do
    rc=0
    timeout -k 5 "${BOUND[$s]}" "$0" --one "$s" || rc=$?
    case $rc in
      0) ;;
      124 | 137) echo "$s: n/a (exceeded its ${BOUND[$s]} s bound)" ;;
      *) echo "$s: n/a (the scenario failed with status $rc; see above)" ;;
    esac
  done
  echo "(${#chosen[@]} scenarios in $((SECONDS - started)) s)" >&2
}

main "$@"
