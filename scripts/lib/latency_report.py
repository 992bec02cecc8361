"""The latency table of scripts/bench.sh's latency phase (called by it).

    latency_report.py OUT

Reads OUT/metrics.txt and OUT/lat/*.json and prints, per transaction shape,
outboxd's write -> consumer latency beside its floor (the relay's producer
alone, same pace, shape, broker and consumer) and the source's share
(pg_recvlogical's write -> receipt), with the targets: outboxd p50 <= floor
p50 + 1 ms and p99 <= floor p99 + 2 ms. Exit status 0 whatever the verdict:
the table says it.
"""
import json
import sys

out = sys.argv[1]
m = {}
for line in open(f"{out}/metrics.txt"):
    k, _, v = line.strip().partition("=")
    m[k] = v


def lat(run):
    try:
        r = json.load(open(f"{out}/lat/{run}.json"))
    except (OSError, ValueError):
        return None
    return r["latency_ms"] if r.get("complete") else None


def f(v):
    return "-" if v is None else f"{v:.2f}"


rate = m.get("lat.rate", "?")
print(f"Latency at {rate} events/s (write -> consumer, ms; the floor is the relay's producer alone, "
      "linger.ms 0, same pace, shape, broker and consumer; receipt is pg_recvlogical's write -> receipt):")
print()
print("| rows/txn | outboxd p50 | p99 | floor p50 | p99 | outboxd - floor p50 | p99 | target (+1 / +2 ms) "
      "| receipt p50 | p99 | baseline p50 | p99 |")
print("|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|")
for txn in m.get("lat.shapes", "").split(","):
    if not txn:
        continue
    head, floor, receipt, base = (lat(f"lat-{w}-{txn}") for w in ("head", "floor", "receipt", "base"))
    d50 = head["p50"] - floor["p50"] if head and floor else None
    d99 = head["p99"] - floor["p99"] if head and floor else None
    if d50 is None:
        verdict = "-"
    else:
        verdict = "met" if d50 <= 1 and d99 <= 2 else "NOT met"
    g = lambda r, q: r[q] if r else None  # noqa: E731
    print(f"| {txn} | {f(g(head, 'p50'))} | {f(g(head, 'p99'))} | {f(g(floor, 'p50'))} | {f(g(floor, 'p99'))} "
          f"| {f(d50)} | {f(d99)} | {verdict} | {f(g(receipt, 'p50'))} | {f(g(receipt, 'p99'))} "
          f"| {f(g(base, 'p50'))} | {f(g(base, 'p99'))} |")
print()
