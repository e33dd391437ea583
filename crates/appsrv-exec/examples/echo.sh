#!/bin/sh
# Connection mode: sends back what the client sends, until it closes its side.
#
#   appsrv-exec -l 127.0.0.1:7010 -- ./echo.sh
#   printf 'hello\n' | nc -N 127.0.0.1 7010        # hello
exec cat
