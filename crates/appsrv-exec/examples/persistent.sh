#!/bin/bash
# Persistent mode in the shell: answers each request with its length and its bytes
# reversed, with the frame protocol (LEN "\n" BYTES each way; see appsrv-exec's README).
#
#   appsrv-exec -l 127.0.0.1:7011 --mode persistent --codec lines -- ./persistent.sh
#   printf 'hello\n' | nc -N 127.0.0.1 7011        # 5 olleh
while IFS= read -r len; do
    body=$(head -c "$len"; echo .)  # the dot keeps trailing newlines
    body=${body%.}
    answer="$len $(printf '%s' "$body" | rev)"
    printf '%s\n%s' "${#answer}" "$answer"
done
