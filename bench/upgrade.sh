#!/usr/bin/env bash
# Time from `upgrade` (and `reload`) to the new master (generation) serving alone, for the
# http_hello example with 4 workers. Prints one line per run.
#
#   bench/upgrade.sh [RUNS]      (default 5)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-5}
cargo build --release --quiet --example http_hello
dir=$(mktemp -d)
chmod 755 "$dir"
cp target/release/examples/http_hello "$dir/server"
"$dir/server" -l 127.0.0.1:0 -w 4 --control "$dir/ctl" --pid-file "$dir/pid" 2>"$dir/log" &
trap 'kill $(cat "$dir/pid") 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 200); do grep -q " ready" "$dir/log" && break; sleep 0.05; done
ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
for i in $(seq "$RUNS"); do
  t=$(date +%s%N); "$dir/server" reload --control "$dir/ctl" >/dev/null; r=$(ms "$t")
  cp target/release/examples/http_hello "$dir/server.new" && mv "$dir/server.new" "$dir/server"
  t=$(date +%s%N); "$dir/server" upgrade --control "$dir/ctl" >/dev/null; u=$(ms "$t")
  echo "run $i: reload ${r} ms, upgrade ${u} ms (new master pid $(cat "$dir/pid"))"
done
