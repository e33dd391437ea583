#!/usr/bin/env python3
"""The zone and the dnsperf query files of bench/dns.sh (deterministic: same arguments, same files).

    bench/dns/gen.py OUTDIR [NAMES [QUERIES]]

writes, in OUTDIR:
  bench.test.zone   one RFC 1035 master file for the zone `bench.test.` ($ORIGIN, $TTL, `@`,
                    relative and absolute names), loaded as it is by NSD, Knot and appsrv's
                    `dns` example:
                      @ SOA, @ NS ns1 (ns1 has an A and an AAAA: in-zone glue)
                      oneI    1 A record  (I = 1..NAMES): an answer of 1 record
                      eightI  8 A records (I = 1..NAMES): an answer of 8 records
                      sixI    1 AAAA      (I = 1..NAMES/10)
                      aliasI  CNAME oneI  (I = 1..NAMES/10; a chain inside the zone)
                      mx (MX) and txt (TXT), for the sanity checks
  queries-a1.txt    QUERIES dnsperf lines (`NAME TYPE`), shuffled: 70 % `oneI A`, 10 % `sixI AAAA`
                    (both answers of 1 record), 20 % names that do not exist (`nxI A`: NXDOMAIN,
                    the SOA in authority)
  queries-a8.txt    the same with `eightI A` (answers of 8 records) instead of `oneI A`/`sixI AAAA`:
                    80 % answers of 8 records, 20 % NXDOMAIN
NAMES defaults to 1000, QUERIES to 10000. dnsperf loops over a file for as long as -l runs.
"""
import os
import random
import sys


def zone(names):
    out = [
        "; bench/dns/gen.py: the zone of bench/dns.sh",
        "$ORIGIN bench.test.",
        "$TTL 3600",
        "@\tIN\tSOA\tns1.bench.test. hostmaster.bench.test. (",
        "\t\t1\t; serial",
        "\t\t3600\t; refresh",
        "\t\t900\t; retry",
        "\t\t604800\t; expire",
        "\t\t300 )\t; minimum (negative TTL)",
        "@\tIN\tNS\tns1",
        "ns1\tIN\tA\t192.0.2.53",
        "ns1\tIN\tAAAA\t2001:db8::53",
        "mx\tIN\tMX\t10 one1.bench.test.",
        'txt\tIN\tTXT\t"bench/dns.sh" "zone"',
    ]
    for i in range(1, names + 1):
        out.append("one%d\tIN\tA\t10.%d.%d.1" % (i, i // 256, i % 256))
    for i in range(1, names + 1):
        for j in range(1, 9):
            # The name once, then blank owners: the previous owner, as RFC 1035 says.
            owner = "eight%d" % i if j == 1 else ""
            out.append("%s\t300\tIN\tA\t172.16.%d.%d" % (owner, i % 256, j))
    for i in range(1, max(1, names // 10) + 1):
        out.append("six%d.bench.test.\tIN\tAAAA\t2001:db8::%x" % (i, i))
    for i in range(1, max(1, names // 10) + 1):
        out.append("alias%d\tIN\tCNAME\tone%d" % (i, i))
    return "\n".join(out) + "\n"


def queries(names, n, big, seed):
    rnd = random.Random(seed)
    six = max(1, names // 10)
    lines = []
    for _ in range(n):
        r = rnd.random()
        if r < 0.2:
            lines.append("nx%d.bench.test. A" % rnd.randint(1, names))
        elif big:
            lines.append("eight%d.bench.test. A" % rnd.randint(1, names))
        elif r < 0.3:
            lines.append("six%d.bench.test. AAAA" % rnd.randint(1, six))
        else:
            lines.append("one%d.bench.test. A" % rnd.randint(1, names))
    return "\n".join(lines) + "\n"


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    outdir = sys.argv[1]
    names = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 10000
    if names < 1 or n < 1:
        sys.exit("gen.py: NAMES and QUERIES must be at least 1")
    os.makedirs(outdir, exist_ok=True)
    files = {
        "bench.test.zone": zone(names),
        "queries-a1.txt": queries(names, n, False, 1),
        "queries-a8.txt": queries(names, n, True, 8),
    }
    for name, text in files.items():
        with open(os.path.join(outdir, name), "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
