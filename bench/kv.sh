#!/usr/bin/env bash
# The kv example (RESP2, issue 34) beside Redis, with redis-benchmark, on loopback:
# `redis-benchmark -t TESTS -n N -c CLIENTS -q --csv`, one command at a time and pipelined
# (-P PIPELINE), against redis-server (one process, --save '' --appendonly no, on a free
# port) and `kv --io event -w WORKERS` (release build, port 0), taking turns in each round,
# ROUNDS rounds; the median requests/s of each cell and the ratio kv / Redis. Both servers
# are started by the script and stopped at the end (also on failure).
#
# Appends every run's figures to bench/results/kv.csv
# (date,round,server,clients,pipeline,requests,test,rps; server is redis or kv-wWORKERS)
# and writes the settings, versions and load average to bench/results/env-kv.txt; prints a
# markdown table.
#
#   bench/kv.sh                        about a minute on 2 CPUs, after the build
#   ROUNDS=1 N=10000 bench/kv.sh       a smoke run
#   EX=/tmp/t/release/examples bench/kv.sh        a prebuilt kv
#
#   setting    default             meaning
#   ROUNDS     5                   rounds (each: every server, every pipeline depth)
#   N          100000              redis-benchmark -n (its default)
#   CLIENTS    50                  redis-benchmark -c (its default)
#   PIPELINE   16                  the pipelined runs' -P (0: none)
#   PIPELINE_N N                   the pipelined runs' -n (at -P 16, 100000 requests take
#                                  about 0.1 s a test: 1000000 gives steadier figures)
#   TESTS      set,get,incr,ping   redis-benchmark -t (ping is PING_INLINE and PING_MBULK)
#   WORKERS    2                   kv -w
#   EX         (cargo build)       the directory of a release kv
#   RESULTS    bench/results       where kv.csv and env-kv.txt go
#
# Needs redis-server and redis-benchmark (apt-get install -y redis-server redis-tools).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
ROUNDS=${ROUNDS:-5} N=${N:-100000} CLIENTS=${CLIENTS:-50} PIPELINE=${PIPELINE:-16}
PIPELINE_N=${PIPELINE_N:-$N}
TESTS=${TESTS:-set,get,incr,ping} WORKERS=${WORKERS:-2} RESULTS=${RESULTS:-bench/results}
for tool in redis-server redis-benchmark redis-cli; do
  command -v "$tool" >/dev/null || {
    echo "kv.sh: no $tool; install with: apt-get install -y redis-server redis-tools" >&2
    exit 1
  }
done
if [ -z "${EX:-}" ]; then
  cargo build --release --quiet -p appsrv-examples --example kv
  EX=${CARGO_TARGET_DIR:-target}/release/examples
fi
[ -x "$EX/kv" ] || { echo "kv.sh: no kv in $EX" >&2; exit 1; }

work=$(mktemp -d)
started=()
cleanup() {
  local p
  for p in "${started[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${started[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# Redis cannot listen on port 0: a free port, taken at once.
redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --protected-mode no --save '' \
  --appendonly no --daemonize no --logfile "$work/redis.log" --dir "$work" &
redis_pid=$!
started+=($redis_pid)
for _ in $(seq 100); do
  [ "$(redis-cli -p "$redis_port" ping 2>/dev/null)" = PONG ] && break
  sleep 0.05
done
[ "$(redis-cli -p "$redis_port" ping 2>/dev/null)" = PONG ] \
  || { echo "kv.sh: redis-server did not start:" >&2; cat "$work/redis.log" >&2; exit 1; }

"$EX/kv" -l 127.0.0.1:0 -w "$WORKERS" --io event 2>"$work/kv.log" &
kv_pid=$!
started+=($kv_pid)
kv_port=$(ready_port "$work/kv.log")
[ -n "$kv_port" ] || { echo "kv.sh: kv did not start:" >&2; cat "$work/kv.log" >&2; exit 1; }

{
  echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "settings: ROUNDS=$ROUNDS N=$N CLIENTS=$CLIENTS PIPELINE=$PIPELINE PIPELINE_N=$PIPELINE_N TESTS=$TESTS WORKERS=$WORKERS"
  echo "kv: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- crates 2>/dev/null || echo ' (crates modified)'), $EX/kv -w $WORKERS --io event"
  echo "redis: $(redis-server --version | sed 's/.* v=\([^ ]*\).*/\1/'), redis-server --save '' --appendonly no"
  echo "redis-benchmark: $(redis-benchmark --version | cut -d' ' -f2)"
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg) (other work on the machine shares its CPUs)"
  echo "machine: $(nproc) CPUs, $(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo), $(awk '/^MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo), Linux $(uname -r)"
} >"$RESULTS/env-kv.txt"
cat "$RESULTS/env-kv.txt" >&2

csv=$RESULTS/kv.csv
[ -s "$csv" ] || echo "date,round,server,clients,pipeline,requests,test,rps,cpu_us" >"$csv"
date=$(date -u +%Y-%m-%dT%H:%MZ)
depths=1
[ "$PIPELINE" -gt 1 ] && depths="1 $PIPELINE"

# bench SERVER PORT PID ROUND DEPTH: one redis-benchmark run; appends its rows to the CSV
# and to $work/rows (server pipeline test rps cpu_us). cpu_us is the server's CPU time
# (all its processes and threads, bench/lib.sh proc_counters) per request of the run, its
# tests together: steadier than requests/s on a machine shared with other work.
bench() {
  local server=$1 port=$2 pid=$3 round=$4 depth=$5 out n=$N before after cpu
  [ "$depth" -gt 1 ] && n=$PIPELINE_N
  local cmd=(redis-benchmark -h 127.0.0.1 -p "$port" -t "$TESTS" -n "$n" -c "$CLIENTS" -P "$depth" -q --csv)
  echo "+ ${cmd[*]}   # $server, round $round" >&2
  before=$(proc_counters "$pid")
  if ! out=$(timeout 300 "${cmd[@]}" 2>"$work/stderr"); then
    echo "kv.sh: redis-benchmark against $server failed:" >&2
    cat "$work/stderr" >&2
    exit 1
  fi
  if grep -qiE 'error|warning' "$work/stderr"; then
    echo "kv.sh: redis-benchmark against $server printed:" >&2
    cat "$work/stderr" >&2
    exit 1
  fi
  after=$(proc_counters "$pid")
  # "test","rps","avg_latency_ms",...: every line but the header.
  out=$(tr -d '"' <<<"$out" | awk -F, '$1 != "test" && NF > 1 { print $1, $2 }')
  cpu=$(awk -v b="${before%% *}" -v a="${after%% *}" -v r="$(($(wc -l <<<"$out") * n))" \
    'BEGIN { printf "%.3f", (a - b) / 1e3 / r }')
  while read -r t r; do
    echo "$date,$round,$server,$CLIENTS,$depth,$n,$t,$r,$cpu" >>"$csv"
    echo "$server $depth $t $r $cpu" >>"$work/rows"
  done <<<"$out"
}

for round in $(seq "$ROUNDS"); do
  for depth in $depths; do
    # Alternate which server goes first, so that neither always runs on a warmer machine.
    if [ $((round % 2)) = 1 ]; then order="redis kv"; else order="kv redis"; fi
    for server in $order; do
      if [ "$server" = redis ]; then
        bench redis "$redis_port" "$redis_pid" "$round" "$depth"
      else
        bench "kv-w$WORKERS" "$kv_port" "$kv_pid" "$round" "$depth"
      fi
    done
  done
done

# The medians, and kv / Redis: requests/s, and the server's CPU per request (the run's).
echo
echo "| test | -P | Redis (req/s) | kv -w $WORKERS (req/s) | kv / Redis | CPU µs/request, Redis / kv |"
echo "|---|---|---|---|---|---|"
awk '
  { key = $3 " " $2; m = ++n[$1 " " key]; v[$1 " " key, m] = $4; c[$1 " " key, m] = $5; keys[key] = 1 }
  function median(arr, k,   m, i, j, t, a) {
    m = n[k]; for (i = 1; i <= m; i++) a[i] = arr[k, i]
    for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
  }
  END {
    for (key in keys) {
      split(key, f, " "); r = median(v, "redis " key); k = median(v, kv " " key)
      printf "| %s | %s | %.0f | %.0f | %.2f | %.2f / %.2f |\n", f[1], f[2], r, k, k / r,
        median(c, "redis " key), median(c, kv " " key)
    }
  }' kv="kv-w$WORKERS" "$work/rows" | sort -t'|' -k3,3n -k2,2
