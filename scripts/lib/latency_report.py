"""The latency table of scripts/bench.sh's latency phase (called by it).

    latency_report.py OUT

Reads OUT/metrics.txt and OUT/lat/*.json and prints, per transaction shape,
outboxd's write -> consumer latency beside its two floors and the source's
share (pg_recvlogical's write -> receipt):
- the floor: the relay's producer alone (same pace, shape, broker and
  consumer), with the host's cores to itself and the broker;
- the floor beside the source (when run, BENCH_FLOOR_LOADED): the same
  producer while the writers write the same rows and pg_recvlogical
  streams them, so the cores carry what they carry under a relay, less the
  relay itself;
- the floor through the source (when run, BENCH_FLOOR_THROUGH): pg_recvlogical
  streams the writers' rows into the same producer, which sends each payload
  as it arrives: the source's hand-over and the producer alone in series,
  record by record, the least a pgoutput relay's latency can be here.
The targets: outboxd p50 <= floor p50 + 1 ms and p99 <= floor p99 + 2 ms,
judged against each floor. Exit status 0 whatever the verdict: the table
says it.
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


def over(head, floor, q):
    return head[q] - floor[q] if head and floor else None


def verdict(head, floor):
    if not (head and floor):
        return "-"
    return "met" if over(head, floor, "p50") <= 1 and over(head, floor, "p99") <= 2 else "NOT met"


rate = m.get("lat.rate", "?")
print(f"Latency at {rate} events/s (write -> consumer, ms; the floor is the relay's producer alone, "
      "linger.ms 0, same pace, shape, broker and consumer; the floor beside the source is the same "
      "while the writers write and pg_recvlogical streams the same rows; the floor through the "
      "source is the same producer sending what pg_recvlogical receives, as it arrives; receipt is "
      "pg_recvlogical's write -> receipt):")
print()
print("| rows/txn | outboxd p50 | p99 | floor p50 | p99 | outboxd - floor p50 | p99 "
      "| floor beside the source p50 | p99 | outboxd - it p50 | p99 "
      "| floor through the source p50 | p99 | outboxd - it p50 | p99 "
      "| target (+1 / +2 ms): floor / beside / through the source "
      "| receipt p50 | p99 | baseline p50 | p99 | baseline target: floor / beside / through |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---|")
for txn in m.get("lat.shapes", "").split(","):
    if not txn:
        continue
    head, floor, loaded, through, receipt, base = (
        lat(f"lat-{w}-{txn}") for w in ("head", "floor", "loaded", "through", "receipt", "base"))
    g = lambda r, q: r[q] if r else None  # noqa: E731
    print(f"| {txn} | {f(g(head, 'p50'))} | {f(g(head, 'p99'))} | {f(g(floor, 'p50'))} | {f(g(floor, 'p99'))} "
          f"| {f(over(head, floor, 'p50'))} | {f(over(head, floor, 'p99'))} "
          f"| {f(g(loaded, 'p50'))} | {f(g(loaded, 'p99'))} "
          f"| {f(over(head, loaded, 'p50'))} | {f(over(head, loaded, 'p99'))} "
          f"| {f(g(through, 'p50'))} | {f(g(through, 'p99'))} "
          f"| {f(over(head, through, 'p50'))} | {f(over(head, through, 'p99'))} "
          f"| {verdict(head, floor)} / {verdict(head, loaded)} / {verdict(head, through)} "
          f"| {f(g(receipt, 'p50'))} | {f(g(receipt, 'p99'))} "
          f"| {f(g(base, 'p50'))} | {f(g(base, 'p99'))} "
          f"| {verdict(base, floor)} / {verdict(base, loaded)} / {verdict(base, through)} |")
print()
