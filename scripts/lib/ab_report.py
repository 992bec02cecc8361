"""The A/B table of one scripts/bench.sh run (called by it, not run alone).

    ab_report.py round OUT TCK TXN I    one line: round I of the TXN-row A/B
    ab_report.py table OUT TCK MAX_LOSS the table of every A/B shape (markdown);
                                        exit status 3 when HEAD's median drain
                                        rate is below (1 - MAX_LOSS) x the
                                        baseline's in a shape

A is the baseline build, B is HEAD (the working tree as built), C is
pg_recvlogical on the same backlog. Drain rate = events / (start -> last event
at the consumer), as in the main table; CPU per event is the process's CPU
from its start to the last event; events per request is the drain's events
over its produce requests (outboxd_kafka_produce_requests_total, "-" for a
build without that counter).

Under each shape, where B's drains spent the host's CPU: the relay, its
walsender and the broker per event, the whole host busy (every process, the
bench's consumer included) per event and as a share of its cores during B's
drain and C's, and the cores B's per-event cost would need at 0.9 x C. Over
the host's core count, 0.9 x the ceiling is out of this host's reach whatever
the relay does.
"""
import os
import json
import statistics
import sys

mode, out = sys.argv[1], sys.argv[2]
tck = int(sys.argv[3])

m = {}
for line in open(f"{out}/metrics.txt"):
    k, _, v = line.strip().partition("=")
    m[k] = v


def num(key):
    v = m.get(key)
    try:
        return float(v) if v not in (None, "") else None
    except ValueError:
        return None


def consumer(run):
    try:
        return json.load(open(f"{out}/ab/{run}.json"))
    except (OSError, ValueError):
        return None


def outboxd_run(txn, who, i):
    """(events/s, CPU µs per event, peak RSS MiB) of one drain, None if incomplete."""
    run = f"ab-{txn}-{who}-{i}"
    n = num(f"ab.{txn}.events")
    r = consumer(run)
    start = num(f"{run}.start_ms")
    if not r or not r.get("complete") or not n or start is None:
        return None
    eps = n * 1000 / max(r["last_arrival_ms"] - start, 1)
    ticks = num(f"{run}.cpu_ticks")
    cpu = ticks / tck * 1e6 / n if ticks is not None else None
    rss = num(f"{run}.peak_rss_kib")
    requests = num(f"{run}.produce_requests")
    per_request = n / requests if requests else None
    return eps, cpu, (rss / 1024 if rss else None), per_request


def per_event(run, key):
    """CPU µs per event of one drain's ticks `key`, or None."""
    n = num(f"ab.{run.split('-')[1]}.events")
    t = num(f"{run}.{key}")
    return t / tck * 1e6 / n if n and t is not None else None


def host_share(run):
    """(busy µs per event, busy share of all cores) of one drain, or None."""
    busy, total = num(f"{run}.host_busy_ticks"), num(f"{run}.host_ticks")
    per = per_event(run, "host_busy_ticks")
    if per is None or not busy or not total:
        return None
    return per, busy / total


def ceiling_run(txn, i):
    n = num(f"ab.{txn}.events")
    ms = num(f"ab-{txn}-ceiling-{i}.drain_ms")
    return n * 1000 / ms if n and ms else None


def rnd(txn, i):
    return outboxd_run(txn, "base", i), outboxd_run(txn, "head", i), ceiling_run(txn, i)


def f(v, spec="{:,.0f}"):
    return "-" if v is None else spec.format(v)


if mode == "round":
    txn, i = sys.argv[4], sys.argv[5]
    a, b, c = rnd(txn, i)
    ea, eb = (a[0] if a else None), (b[0] if b else None)
    print(f"A {f(ea)} ev/s, B {f(eb)} ev/s, ceiling {f(c)} ev/s; "
          f"B/A {f(eb / ea if ea and eb else None, '{:.2f}')}, "
          f"B/ceiling {f(eb / c if eb and c else None, '{:.2f}')}")
    sys.exit(0)

max_loss = float(sys.argv[4])
shapes = sorted({k.split(".")[1] for k in m if k.startswith("ab.") and k.endswith(".events")}, key=int)
print(f"A/B: A = baseline {m.get('ab.baseline_rev', '?')}, B = HEAD {m.get('ab.head_rev', '?')}, "
      "C = pg_recvlogical; each round drains one backlog with A and B (alternating which goes first) "
      "and then C, each from its own slot.")
print()
status = 0
for txn in shapes:
    reps = int(num(f"ab.{txn}.reps") or 0)
    events = int(num(f"ab.{txn}.events") or 0)
    print(f"{events:,} events in {txn}-row transactions, {reps} rounds:")
    print()
    print("| round | A ev/s | B ev/s | C ev/s | B/A | A/C | B/C | A µs/event | B µs/event | A RSS MiB | B RSS MiB "
          "| A ev/request | B ev/request |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    cols = {k: [] for k in ("a", "b", "c", "ba", "ac", "bc", "acpu", "bcpu", "arss", "brss", "areq", "breq")}
    for i in range(1, reps + 1):
        a, b, c = rnd(txn, i)
        row = {
            "a": a and a[0], "b": b and b[0], "c": c,
            "ba": a and b and b[0] / a[0], "ac": a and c and a[0] / c, "bc": b and c and b[0] / c,
            "acpu": a and a[1], "bcpu": b and b[1], "arss": a and a[2], "brss": b and b[2],
            "areq": a and a[3], "breq": b and b[3],
        }
        for k, v in row.items():
            if v is not None:
                cols[k].append(v)
        print(f"| {i} | {f(row['a'])} | {f(row['b'])} | {f(row['c'])} | {f(row['ba'], '{:.2f}')} | "
              f"{f(row['ac'], '{:.2f}')} | {f(row['bc'], '{:.2f}')} | {f(row['acpu'], '{:.1f}')} | "
              f"{f(row['bcpu'], '{:.1f}')} | {f(row['arss'], '{:.1f}')} | {f(row['brss'], '{:.1f}')} | "
              f"{f(row['areq'], '{:.1f}')} | {f(row['breq'], '{:.1f}')} |")
        if not b:
            status = max(status, 1)

    def med(k, spec):
        return f(statistics.median(cols[k]) if cols[k] else None, spec)
    print(f"| median | {med('a', '{:,.0f}')} | {med('b', '{:,.0f}')} | {med('c', '{:,.0f}')} | "
          f"{med('ba', '{:.2f}')} | {med('ac', '{:.2f}')} | {med('bc', '{:.2f}')} | {med('acpu', '{:.1f}')} | "
          f"{med('bcpu', '{:.1f}')} | {med('arss', '{:.1f}')} | {med('brss', '{:.1f}')} | "
          f"{med('areq', '{:.1f}')} | {med('breq', '{:.1f}')} |")
    print()
    cores = os.cpu_count() or 1
    budget = []
    for i in range(1, reps + 1):
        run = f"ab-{txn}-head-{i}"
        host, chost = host_share(run), host_share(f"ab-{txn}-ceiling-{i}")
        c = ceiling_run(txn, i)
        if host:
            budget.append((i, per_event(run, "cpu_ticks"), per_event(run, "walsender_ticks"),
                           per_event(run, "broker_ticks"), host[0], host[1], chost and chost[1],
                           c and host[0] * 0.9 * c / 1e6))
    if budget:
        print(f"Where B's drains spent the host's {cores} cores (µs per event; busy = every process):")
        print()
        print("| round | relay | walsender | broker | host busy | host busy % (B) | host busy % (C) "
              "| cores B needs at 0.9 x C |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for i, relay, ws, broker, busy, share, cshare, need in budget:
            print(f"| {i} | {f(relay, '{:.1f}')} | {f(ws, '{:.1f}')} | {f(broker, '{:.1f}')} | "
                  f"{f(busy, '{:.1f}')} | {f(share and share * 100, '{:.0f}')} | "
                  f"{f(cshare and cshare * 100, '{:.0f}')} | {f(need, '{:.2f}')} |")
        print()
    if cols["bc"]:
        print(f"B at >= 0.9 x the ceiling in {sum(v >= 0.9 for v in cols['bc'])} of {len(cols['bc'])} rounds "
              f"(lowest {min(cols['bc']):.2f}); B peak RSS max {max(cols['brss'] or [0]):.1f} MiB.")
    if cols["ba"]:
        ba = statistics.median(cols["ba"])
        if ba < 1 - max_loss and m.get("ab.configs_differ"):
            print(f"B drains {txn}-row transactions at {ba:.2f} x A: BENCH_HEAD_TOML and BENCH_BASE_TOML "
                  "differ, so this compares two configurations and is no regression check")
        elif ba < 1 - max_loss:
            print(f"REGRESSION: HEAD drains {txn}-row transactions at {ba:.2f} x the baseline "
                  f"(more than {max_loss:.0%} slower)")
            status = 3
    print()
sys.exit(status)
