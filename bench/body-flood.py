#!/usr/bin/env python3
"""A flood of unfinished request bodies against a running server, and its workers' memory.

Usage: bench/body-flood.py MASTER_PID PORT [CLIENTS] [BODY_BYTES] [--chunked]

Opens CLIENTS connections (default 2,500) to 127.0.0.1:PORT; each sends the head of a
1,000,000-byte POST (or a chunked one) and BODY_BYTES of its body (default 990,000, as much
as the sockets take without waiting), then nothing. Prints the workers' summed RSS before,
at the peak while the connections are held (10 s), and 10 s after they close, and how many
connections were answered 503. Loopback only; bounded in count and time (about 25 s).
Issue 42: the async model held every byte (2,381 MiB for 2,500 connections with two
workers), whatever --max-buffered-bytes said.
"""

import os
import socket
import sys
import time


def workers(master):
    kids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) == master:
                kids.append(int(pid))
        except OSError:
            pass
    return kids


def rss_mib(pids):
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    chunked = "--chunked" in sys.argv
    master, port = int(args[0]), int(args[1])
    clients = int(args[2]) if len(args) > 2 else 2500
    body = int(args[3]) if len(args) > 3 else 990_000
    pids = workers(master)
    before = rss_mib(pids)
    if chunked:
        head = b"POST /upload HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
        data = b"".join(b"%x\r\n%s\r\n" % (4096, b"a" * 4096) for _ in range(body // 4096))
    else:
        head = b"POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: 1000000\r\n\r\n"
        data = b"a" * body
    socks = []
    deadline = time.monotonic() + 60
    for _ in range(clients):
        if time.monotonic() > deadline:
            break
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(head)
        s.setblocking(False)
        view = memoryview(data)
        try:
            while view:
                n = s.send(view)
                view = view[n:]
        except (BlockingIOError, ConnectionError):
            pass
        socks.append(s)
    peak = 0.0
    end = time.monotonic() + 10
    while time.monotonic() < end:
        peak = max(peak, rss_mib(pids))
        time.sleep(0.5)
    refused = 0
    for s in socks:
        try:
            if s.recv(12).startswith(b"HTTP/1.1 503"):
                refused += 1
        except (BlockingIOError, ConnectionError):
            pass
        s.close()
    time.sleep(10)
    after = rss_mib(pids)
    print(
        f"clients={len(socks)} body={body}{' chunked' if chunked else ''} workers={len(pids)} "
        f"rss_before={before:.1f}MiB rss_peak={peak:.1f}MiB rss_10s_after={after:.1f}MiB "
        f"refused_503={refused}"
    )


if __name__ == "__main__":
    main()
