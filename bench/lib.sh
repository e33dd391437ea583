# Shared by the bench scripts (source it: `. "$(dirname "$0")/lib.sh"`).

# ready_port LOG [SECONDS]: waits (up to SECONDS, default 10) until the server logging to
# LOG says it is ready, then prints the port of its first listener on 127.0.0.1 (nothing
# if it never became ready).
ready_port() {
  local log=$1 seconds=${2:-10}
  local tries=$((seconds * 20))
  for _ in $(seq "$tries"); do
    grep -qa " ready" "$log" 2>/dev/null && break
    sleep 0.05
  done
  grep -ao 'listening on 127.0.0.1:[0-9]*' "$log" | head -1 | cut -d: -f2
}

# server_pids PID...: the given pids (masters) and their children, one a line.
server_pids() {
  local p
  for p in "$@"; do
    echo "$p"
    pgrep -P "$p" || true
  done
}

# pss_kb PID...: "KB COUNT": the summed PSS (/proc/PID/smaps_rollup) of the masters PID...
# and their children, and how many processes that is.
pss_kb() {
  local p kb=0 n=0 v
  for p in $(server_pids "$@"); do
    v=$(awk '/^Pss:/ { print $2 }' "/proc/$p/smaps_rollup" 2>/dev/null) || continue
    [ -n "$v" ] || continue
    kb=$((kb + v)) n=$((n + 1))
  done
  echo "$kb $n"
}

# proc_counters PID...: "CPU_NS SWITCHES PIDS" summed over the masters PID... and their
# children: CPU time in nanoseconds (the first field of /proc/PID/task/*/schedstat, the
# time each thread ran, exact; plus cutime + cstime of /proc/PID/stat, the children a
# master has reaped, such as a recycled worker, in clock ticks: 10 ms), context switches
# (voluntary + nonvoluntary, /proc/PID/task/*/status), and the pids sampled (comma-
# separated). The difference of two samples is the cost of what ran in between; a process
# that exited in between takes its switches with it (the kernel keeps no per-child sum of
# them in /proc), not its CPU time: per_request counts those processes.
LIB_HZ=$(getconf CLK_TCK)
proc_counters() {
  local p files=() pids
  pids=$(server_pids "$@")
  for p in $pids; do
    files+=("/proc/$p/stat" "/proc/$p"/task/*/schedstat "/proc/$p"/task/*/status)
  done
  # One awk over all of them (a server may have hundreds of processes). cat skips (and
  # the || true forgives) a process that is gone. A stat line is "PID (COMM) STATE ...":
  # after the last ") ", cutime is the 14th field and cstime the 15th; a schedstat line is
  # three numbers, the first the nanoseconds on a CPU.
  { cat "${files[@]}" 2>/dev/null || true; } | awk -v hz="$LIB_HZ" -v pids="$(echo $pids | tr ' ' ',')" '
    /^[0-9]+ \(/ { sub(/.*\) /, ""); split($0, f, " "); ticks += f[14] + f[15]; next }
    /^[0-9]+ [0-9]+ [0-9]+$/ { ns += $1; next }
    /^(non)?voluntary_ctxt_switches:/ { c += $2 }
    END { printf "%.0f %d %s\n", ns + ticks * 1e9 / hz, c, pids }'
}

# per_request BEFORE AFTER REQUESTS: "CPU_US CSW EXITED" per request from two
# proc_counters samples ("- - 0" when REQUESTS is 0); EXITED is how many processes of
# BEFORE are not in AFTER: when it is not 0, CSW misses their switches.
per_request() {
  awk -v b="$1" -v a="$2" -v n="$3" 'BEGIN {
    split(b, x, " "); split(a, y, " ")
    split(x[3], bp, ","); split(y[3], ap, ",")
    for (i in ap) alive[ap[i]] = 1
    gone = 0
    for (i in bp) if (!(bp[i] in alive)) gone++
    if (n > 0) printf "%.1f %.2f %d\n", (y[1] - x[1]) / 1e3 / n, (y[2] - x[2]) / n, gone
    else print "- - 0"
  }'
}

# nginx_conf DIR PORT STATIC_DIR KEEPALIVE_TIMEOUT WORKER_CONNECTIONS [RLIMIT_NOFILE]:
# writes DIR/nginx.conf: worker_processes 2, daemon off, access_log off, error_log in DIR,
# sendfile on, tcp_nopush on, keepalive_requests 1000, no open_file_cache; `GET /` answers
# the 13 bytes `Hello, World!` (`return 200`, from memory), /static/ is STATIC_DIR. Workers run
# as nobody when started as root.
nginx_conf() {
  local d=$1 port=$2 static=$3 ka=$4 wc=$5 nofile=${6:-}
  mkdir -p "$d"
  cat >"$d/nginx.conf" <<NGINX
daemon off;
master_process on;
worker_processes 2;
$([ "$(id -u)" = 0 ] && echo "user nobody nogroup;")
${nofile:+worker_rlimit_nofile $nofile;}
pid $d/nginx.pid;
error_log $d/error.log warn;
events { worker_connections $wc; }
http {
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_timeout ${ka}s;
    keepalive_requests 1000;
    types { text/plain txt; }
    default_type application/octet-stream;
    client_body_temp_path $d/body;
    proxy_temp_path $d/proxy;
    fastcgi_temp_path $d/fastcgi;
    uwsgi_temp_path $d/uwsgi;
    scgi_temp_path $d/scgi;
    server {
        listen 127.0.0.1:$port;
        location = / { default_type text/plain; return 200 'Hello, World!'; }
        location /static/ { alias $static/; }
    }
}
NGINX
}

# free_port: a free port on 127.0.0.1 (bound to port 0 and released).
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
