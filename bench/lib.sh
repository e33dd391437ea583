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
