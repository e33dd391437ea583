#!/usr/bin/python3
# Connection mode: answers each line in capitals, greeting the client by its address
# (from the UCSPI-TCP variables appsrv-exec sets), until the client closes its side.
#
#   appsrv-exec -l 127.0.0.1:7010 -- ./upper.py
#   printf 'hello\n' | nc -N 127.0.0.1 7010        # hi 127.0.0.1 / HELLO
import os
import sys

print("hi", os.environ.get("TCPREMOTEIP", "?"), flush=True)
for line in sys.stdin:
    sys.stdout.write(line.upper())
    sys.stdout.flush()
