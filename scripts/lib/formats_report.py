"""The value-format table of one scripts/bench.sh run (called by it, not run alone).

    formats_report.py round OUT TCK TXN I FORMATS   one line: round I of the TXN-row shape
    formats_report.py table OUT TCK FORMATS         the table of every shape (markdown);
                                                    exit status 3 when a target is missed,
                                                    1 when a drain was incomplete

Drain rate = events / (start -> last event at the consumer), as in the main
table. A format's ratio is its drain rate over json's in the same round
(same backlog, same slot position); the table gives each round's and the
median. Registry requests are outboxd_schema_registry_requests_total at the
drain's end, start-up included (every outcome).

Targets (issue 37): avro >= 0.85 x json and json-schema >= 0.8 x json
(median ratio, each shape), peak RSS <= 32 MiB, and registry requests a
handful per drain (<= MAX_REQUESTS below), not one per event.
"""
import json
import statistics
import sys

TARGET_RATIO = {"avro": 0.85, "json-schema": 0.8}
MAX_RSS_MIB = 32
MAX_REQUESTS = 10

mode, out = sys.argv[1], sys.argv[2]
tck = int(sys.argv[3])

m = {}
for line in open(f"{out}/metrics.txt"):
    k, _, v = line.strip().partition("=")
    m[k] = v


def num(key):
    try:
        return float(m[key]) if m.get(key) not in (None, "") else None
    except ValueError:
        return None


def drain(txn, fmt, i):
    """(events/s, CPU µs per event, peak RSS MiB, registry requests, first -> last events/s,
    start -> first event s) of one drain, None if incomplete."""
    run = f"fmt-{txn}-{fmt}-{i}"
    n = num(f"fmt.{txn}.events")
    try:
        r = json.load(open(f"{out}/formats/{run}.json"))
    except (OSError, ValueError):
        return None
    start = num(f"{run}.start_ms")
    if not r.get("complete") or not n or start is None:
        return None
    ticks = num(f"{run}.cpu_ticks")
    rss = num(f"{run}.peak_rss_kib")
    return (n * 1000 / max(r["last_arrival_ms"] - start, 1),
            ticks / tck * 1e6 / n if ticks is not None else None,
            rss / 1024 if rss else None,
            num(f"{run}.registry_requests"),
            n * 1000 / max(r["last_arrival_ms"] - r["first_arrival_ms"], 1),
            (r["first_arrival_ms"] - start) / 1000)


def f(v, spec="{:,.0f}"):
    return "-" if v is None else spec.format(v)


if mode == "round":
    txn, i, fmts = sys.argv[4], sys.argv[5], sys.argv[6].split()
    runs = {fmt: drain(txn, fmt, i) for fmt in fmts}
    base = runs.get("json")
    parts = []
    for fmt in fmts:
        r = runs[fmt]
        ratio = f" ({r[0] / base[0]:.2f} x json)" if r and base and fmt != "json" else ""
        parts.append(f"{fmt} {f(r and r[0])} ev/s{ratio}, {f(r and r[2], '{:.1f}')} MiB, "
                     f"{f(r and r[3])} registry requests")
    print("; ".join(parts))
    sys.exit(0)

fmts = sys.argv[4].split()
shapes = sorted({k.split(".")[1] for k in m if k.startswith("fmt.") and k.endswith(".events")}, key=int)
print(f"Value formats: this tree's outboxd ({', '.join(fmts)}) on one backlog per shape, each drain "
      "from its own slot, the order of the formats rotating from round to round.")
print()
status = 0
misses = []
for txn in shapes:
    reps = int(num(f"fmt.{txn}.reps") or 0)
    events = int(num(f"fmt.{txn}.events") or 0)
    print(f"{events:,} events in {txn}-row transactions, {reps} rounds (ev/s; ratio to json in the round; "
          "CPU µs per event; peak RSS MiB; registry requests):")
    print()
    head = ["round"]
    for fmt in fmts:
        head += [f"{fmt} ev/s"] + ([f"{fmt}/json"] if fmt != "json" else []) + \
            [f"{fmt} µs/ev", f"{fmt} MiB", f"{fmt} req"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---:|" * len(head))
    cols = {}
    for i in range(1, reps + 1):
        runs = {fmt: drain(txn, fmt, i) for fmt in fmts}
        base = runs.get("json")
        row = [str(i)]
        for fmt in fmts:
            r = runs[fmt]
            if not r:
                status = max(status, 1)
                misses.append(f"{fmt} {txn}-row round {i}: incomplete drain")
            vals = {"eps": r and r[0], "cpu": r and r[1], "rss": r and r[2], "req": r and r[3],
                    "ratio": r and base and r[0] / base[0]}
            for k, v in vals.items():
                if v is not None:
                    cols.setdefault((fmt, k), []).append(v)
            row += [f(vals["eps"])] + ([f(vals["ratio"], "{:.2f}")] if fmt != "json" else []) + \
                [f(vals["cpu"], "{:.1f}"), f(vals["rss"], "{:.1f}"), f(vals["req"])]
        print("| " + " | ".join(row) + " |")

    def agg(fmt, k, fn=statistics.median):
        v = cols.get((fmt, k))
        return fn(v) if v else None
    row = ["median (RSS, requests: max)"]
    for fmt in fmts:
        row += [f(agg(fmt, "eps"))] + ([f(agg(fmt, "ratio"), "{:.2f}")] if fmt != "json" else []) + \
            [f(agg(fmt, "cpu"), "{:.1f}"), f(agg(fmt, "rss", max), "{:.1f}"), f(agg(fmt, "req", max))]
    print("| " + " | ".join(row) + " |")
    print()
    print("Start-up left out (medians): first -> last event ev/s and the ratio to json in the round; "
          "start -> first event s:")
    print()
    print("| " + " | ".join(f"{fmt} first->last ev/s | {fmt}/json | {fmt} start s" for fmt in fmts) + " |")
    print("|" + "---:|" * (3 * len(fmts)))
    steady = {fmt: [] for fmt in fmts}
    for i in range(1, reps + 1):
        runs = {fmt: drain(txn, fmt, i) for fmt in fmts}
        for fmt in fmts:
            r, base = runs[fmt], runs.get("json")
            if r:
                steady[fmt].append((r[4], r[4] / base[4] if base else None, r[5]))
    cells = []
    for fmt in fmts:
        v = steady[fmt]
        ratios = [x[1] for x in v if x[1] is not None]
        cells += [f(statistics.median([x[0] for x in v]) if v else None),
                  f(statistics.median(ratios) if ratios else None, "{:.2f}"),
                  f(statistics.median([x[2] for x in v]) if v else None, "{:.2f}")]
    print("| " + " | ".join(cells) + " |")
    print()
    for fmt in fmts:
        ratio, rss, req = agg(fmt, "ratio"), agg(fmt, "rss", max), agg(fmt, "req", max)
        if fmt in TARGET_RATIO and ratio is not None and ratio < TARGET_RATIO[fmt]:
            misses.append(f"{fmt} {txn}-row: {ratio:.2f} x json (target >= {TARGET_RATIO[fmt]})")
        if rss is not None and rss > MAX_RSS_MIB:
            misses.append(f"{fmt} {txn}-row: peak RSS {rss:.1f} MiB (target <= {MAX_RSS_MIB})")
        if fmt != "json" and req is not None and req > MAX_REQUESTS:
            misses.append(f"{fmt} {txn}-row: {req:.0f} registry requests in a drain (target <= {MAX_REQUESTS})")
if misses:
    print("Targets missed or drains incomplete:")
    print()
    for line in misses:
        print(f"- {line}")
    status = max(status, 3)
else:
    print(f"Every target met: avro >= {TARGET_RATIO['avro']} x json, json-schema >= "
          f"{TARGET_RATIO['json-schema']} x json (medians), peak RSS <= {MAX_RSS_MIB} MiB, "
          f"<= {MAX_REQUESTS} registry requests per drain.")
sys.exit(status)
