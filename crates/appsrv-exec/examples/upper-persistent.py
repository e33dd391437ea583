#!/usr/bin/python3
# Persistent mode: one process per worker, answering each request in capitals with the
# frame protocol (LEN "\n" BYTES each way; see appsrv-exec's README).
#
#   appsrv-exec -l 127.0.0.1:7011 --mode persistent --codec lines -- ./upper-persistent.py
#   printf 'hello\nworld\n' | nc -N 127.0.0.1 7011  # HELLO / WORLD
import sys

inp = sys.stdin.buffer
out = sys.stdout.buffer
while True:
    header = inp.readline()
    if not header:
        break  # the worker closed our input: it is stopping
    request = inp.read(int(header))
    answer = request.upper()
    out.write(b"%d\n%s" % (len(answer), answer))
    out.flush()
