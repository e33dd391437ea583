#!/usr/bin/env python3
"""Issue 31: how much the `dns` example amplifies a reflection attack, with its answer-rate
limit on (its default: 200 answers per second per IPv4 /24) and off (--max-answers-per-ip 0).

    bench/dns/amplification.py [DNS [ZONE]]

DNS defaults to target/debug/examples/dns (cargo build -p appsrv --example dns), ZONE to
crates/appsrv-dns/examples/dns.zone; run from the workspace root. Loopback only, bounded: at
most RATE * SECONDS queries per run (environment: RATE 2000, SECONDS 5, SOURCES 200).

1. The worst answer: every owner name of the zone is asked every common type over UDP, with
   EDNS(0) offering 4096 bytes (the server clamps it to its --max-udp-size, 1232) and
   without EDNS (512 bytes); the question whose answer is largest against its query is the
   attacker's choice.
2. A flood of that question from SOURCES addresses of one /24 (127.0.0.2 and up: forged
   sources of one victim network), RATE queries per second in all for SECONDS, round robin,
   against a server with the limit on, one that counts each address alone
   (--answers-ipv4-prefix 32: the grouping before issue 31), and one with the limit off. Bytes in: the queries
   sent; bytes out: the answers that reached the sources (the victim's network). The
   server's own counters (status: bytes_in, bytes_out, rate_limited) are printed beside.
"""
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time

DNS = sys.argv[1] if len(sys.argv) > 1 else "target/debug/examples/dns"
ZONE = sys.argv[2] if len(sys.argv) > 2 else "crates/appsrv-dns/examples/dns.zone"
RATE = int(os.environ.get("RATE", "2000"))
SECONDS = float(os.environ.get("SECONDS", "5"))
SOURCES = int(os.environ.get("SOURCES", "200"))
TYPES = {"A": 1, "NS": 2, "CNAME": 5, "SOA": 6, "MX": 15, "TXT": 16, "AAAA": 28}


def query(qid, name, qtype, edns):
    """A query with RD clear, as an attacker sends it; EDNS(0) with `edns` bytes if given."""
    q = struct.pack(">HHHHHH", qid, 0, 1, 0, 0, 1 if edns else 0)
    for label in name.rstrip(".").split("."):
        q += bytes([len(label)]) + label.encode()
    q += b"\0" + struct.pack(">HH", qtype, 1)
    if edns:
        q += b"\0" + struct.pack(">HHIH", 41, edns, 0, 0)
    return q


def owners(zone):
    """The owner names of a master file (enough of the syntax for the sample zone)."""
    origin, names = None, set()
    for line in open(zone):
        line = line.split(";")[0].rstrip()
        if line.startswith("$ORIGIN"):
            origin = line.split()[1]
        elif line and not line[0].isspace() and not line.startswith("$"):
            o = line.split()[0]
            names.add(origin if o == "@" else o if o.endswith(".") else f"{o}.{origin}")
    return sorted(names)


def free_port():
    while True:
        t = socket.socket()
        t.bind(("127.0.0.1", 0))
        port = t.getsockname()[1]
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            u.bind(("127.0.0.1", port))
            return port
        except OSError:
            pass
        finally:
            t.close()
            u.close()


class Server:
    def __init__(self, *flags):
        self.dir = tempfile.mkdtemp(prefix="appsrv-amp-")
        self.ctl = os.path.join(self.dir, "ctl")
        self.port = free_port()
        self.cmd = [DNS, "--zone", ZONE, "-l", f"udp://127.0.0.1:{self.port}",
                    "-l", f"127.0.0.1:{self.port}", "-w", "2", "--control", self.ctl, *flags]
        self.log = open(os.path.join(self.dir, "log"), "w+")
        self.proc = subprocess.Popen(self.cmd, stderr=self.log, stdout=subprocess.DEVNULL)
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        probe.settimeout(0.2)
        for _ in range(150):
            probe.sendto(query(1, "www.example.test.", 1, None), ("127.0.0.1", self.port))
            try:
                probe.recv(4096)
                return
            except OSError:
                pass
        self.stop()
        sys.exit(f"{' '.join(self.cmd)} does not answer")

    def status(self):
        out = subprocess.run([DNS, "status", "--json", "--control", self.ctl],
                             capture_output=True, check=True).stdout
        return json.loads(out)["totals"]["datagrams"]

    def stop(self):
        """Stops the server (its workers follow the master) and removes its directory."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def worst(server):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(2)
    rows = []
    for name in owners(ZONE):
        for tname, t in TYPES.items():
            for edns in (4096, None):
                q = query(0x4242, name, t, edns)
                s.sendto(q, ("127.0.0.1", server.port))
                a = s.recv(65536)
                rows.append((len(a) / len(q), len(a), len(q), name, tname, edns))
    rows.sort(reverse=True)
    return rows


def flood(server, q):
    clients = []
    for i in range(SOURCES):
        c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        c.bind((f"127.0.0.{2 + i}", 0))
        c.setblocking(False)
        clients.append(c)
    before = server.status()
    total = int(RATE * SECONDS)
    sent = received = answers = 0
    start = time.monotonic()
    while sent < total:
        # Paced in 10 ms steps; the sockets drained as the answers come.
        due = min(total, int((time.monotonic() - start) * RATE) + 1)
        while sent < due:
            clients[sent % SOURCES].sendto(q, ("127.0.0.1", server.port))
            sent += 1
        time.sleep(0.01)
    time.sleep(0.5)
    for c in clients:
        while True:
            try:
                received += len(c.recv(65536))
                answers += 1
            except BlockingIOError:
                break
        c.close()
    took = time.monotonic() - start
    after = server.status()
    d = {k: after[k] - before.get(k, 0) for k in after}
    return sent, len(q) * sent, answers, received, took, d


def main():
    on = Server()
    try:
        measure(on, lambda flags: Server(*flags))
    finally:
        on.stop()


def measure(on, start):
    """The worst query against `on`, then the three floods (servers made by `start`)."""
    rows = worst(on)
    ratio, out_b, in_b, name, tname, edns = rows[0]
    print(f"appsrv dns example: {DNS} (zone {ZONE}); {SOURCES} sources 127.0.0.2-{1 + SOURCES} (one /24),"
          f" {RATE} queries/s for {SECONDS:g} s")
    print("largest answers against their query (UDP, RD clear):")
    for r in rows[:5]:
        print(f"  {r[3]} {r[4]} {'EDNS ' + str(r[5]) if r[5] else 'no EDNS'}: {r[2]} bytes in, {r[1]} out: {r[0]:.1f}x")
    q = query(0x4242, name, TYPES[tname], edns)
    off = None
    try:
        print()
        print("| run | queries sent | bytes in | answers received | bytes out | out / in |"
              " server: rate_limited, bytes_in, bytes_out |")
        print("|---|---|---|---|---|---|---|")
        for label, flags in [("limit on (the default: 200/s per /24)", None),
                             ("limit per address (--answers-ipv4-prefix 32: before issue 31)",
                              ["--answers-ipv4-prefix", "32"]),
                             ("limit off (--max-answers-per-ip 0)", ["--max-answers-per-ip", "0"])]:
            if flags is None:
                server = on
            else:
                if off:
                    off.stop()
                server = off = start(flags)
            sent, bytes_in, answers, bytes_out, took, d = flood(server, q)
            print(f"| {label} | {sent} in {took:.1f} s | {bytes_in} | {answers} | {bytes_out} |"
                  f" {bytes_out / bytes_in:.2f} | {d.get('rate_limited')}, {d.get('bytes_in')},"
                  f" {d.get('bytes_out')} |")
    finally:
        if off:
            off.stop()


main()
