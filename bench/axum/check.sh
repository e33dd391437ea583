#!/usr/bin/env bash
# Compares two servers page by page: status, Content-Type and body (cmp) of each page must
# be the same, and the status 200. For axum-peer against appsrv's frontpage example on the
# same PostgreSQL database (the default pages), or against http_hello:
#
#   bench/axum/check.sh http://127.0.0.1:8090 http://127.0.0.1:8080
#   PAGES='/ /sleep?ms=1' bench/axum/check.sh http://127.0.0.1:8081 http://127.0.0.1:8080
#
# PAGES (default "/ /rows?n=5 /rows?n=36 /rows?n=134") are the paths fetched from both base
# URLs. Prints one line per page; exits 1 at the first page that differs, saying which and
# how (a diff of the bodies' first lines), 2 on a usage error.
set -euo pipefail

[ $# = 2 ] || { echo "usage: bench/axum/check.sh BASE_URL_A BASE_URL_B (PAGES in the environment)" >&2; exit 2; }
a=${1%/} b=${2%/}
PAGES=${PAGES:-/ /rows?n=5 /rows?n=36 /rows?n=134}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# fetch URL FILE: the body into FILE; prints "STATUS CONTENT-TYPE" (000: no answer).
fetch() { curl -s --noproxy '*' -m 30 -o "$2" -w '%{http_code} %{content_type}' "$1" || true; }

for page in $PAGES; do
  ha=$(fetch "$a$page" "$work/a") hb=$(fetch "$b$page" "$work/b")
  if [ "${ha%% *}" != 200 ] || [ "${hb%% *}" != 200 ]; then
    echo "check.sh: $page: status ${ha%% *} from $a, ${hb%% *} from $b (expected 200 from both)" >&2
    exit 1
  fi
  if [ "$ha" != "$hb" ]; then
    echo "check.sh: $page: Content-Type differs: '${ha#* }' from $a, '${hb#* }' from $b" >&2
    exit 1
  fi
  if ! cmp -s "$work/a" "$work/b"; then
    echo "check.sh: $page: the bodies differ ($(wc -c <"$work/a") bytes from $a, $(wc -c <"$work/b") from $b): $(cmp "$work/a" "$work/b" 2>&1 || true)" >&2
    diff <(head -c 100000 "$work/a") <(head -c 100000 "$work/b") | head -20 >&2 || true
    exit 1
  fi
  echo "check.sh: $page: identical (200, ${ha#* }, $(wc -c <"$work/a") bytes)"
done
