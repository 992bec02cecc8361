"""The source's share of the latency, for scripts/bench.sh's latency phase.

Reads pg_recvlogical's pgoutput stream on stdin (`-f -`) and, for each of the
first COUNT outbox rows (the bench's payload, whose field "t" is the writer's
clock in microseconds), takes the time it arrived here minus "t". Prints one
JSON line like bench_consume's: {"count", "expected", "complete",
"latency_ms": {"p50", "p99", "max"}}. Exits 1 when the stream ends early.
"""
import json
import math
import os
import re
import sys
import time

count = int(sys.argv[1])
# jsonb prints its shortest keys first: "t" leads the payload's text.
pattern = re.compile(rb'"t": (\d{16})')
latencies = []
tail = b""
fd = sys.stdin.fileno()
while len(latencies) < count:
    chunk = os.read(fd, 1 << 16)
    if not chunk:
        break
    now_us = time.time_ns() // 1000
    data = tail + chunk
    last = 0
    for m in pattern.finditer(data):
        latencies.append((now_us - int(m.group(1))) / 1000)
        last = m.end()
    # Keep a possibly cut match for the next read.
    tail = data[max(last, len(data) - 24):]

latencies = latencies[:count]
latencies.sort()


def pct(p):
    if not latencies:
        return 0.0
    rank = max(1, min(len(latencies), math.ceil(p * len(latencies))))
    return round(latencies[rank - 1], 3)


print(json.dumps({
    "count": len(latencies), "expected": count, "complete": len(latencies) >= count,
    "latency_ms": {"p50": pct(0.5), "p99": pct(0.99), "max": round(latencies[-1], 3) if latencies else 0.0},
}))
sys.exit(0 if len(latencies) >= count else 1)
