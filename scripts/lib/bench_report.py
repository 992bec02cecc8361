"""Table and plots of one scripts/bench.sh run (called by it, not run alone).

Reads BENCH_DIR/metrics.txt and the consumers' JSON reports, prints the
results table (markdown), and writes the data files and the gnuplot script
that draw PLOT_DIR/drain.png and PLOT_DIR/latency.png.
"""
import json
import sys

(out, plot_dir, tck, events, bulk, rates, steady_s, steady_txn, clients,
 poll_batch, poll_ms, dbz_poll_ms, dbz_flush_ms, systems) = sys.argv[1:15]
tck = int(tck)
rates = rates.split()
systems = systems.split()
relays = [s for s in systems if s != "recvlogical"]
names = {"outboxd": "outboxd", "polling": "polling relay",
         "debezium": "Debezium + EventRouter", "recvlogical": "pg_recvlogical"}
short = {"outboxd": "outboxd", "polling": "polling", "debezium": "Debezium", "recvlogical": "pg_recvlogical"}
shapes = ["1", bulk]

m = {}
for line in open(f"{out}/metrics.txt"):
    k, _, v = line.strip().partition("=")
    # Text values (the A/B's revisions) are the A/B report's, not this one's.
    try:
        m[k] = float(v) if v else 0.0
    except ValueError:
        pass


def report(system, atype):
    try:
        return json.load(open(f"{out}/{system}/{atype}.json"))
    except (OSError, ValueError):
        return None


def drain_eps(system, shape):
    atype = f"{system}-drain-{shape}"
    n = m.get(f"{system}.{atype}.events", 0)
    if system == "recvlogical":
        ms = m.get(f"{system}.{atype}.drain_ms")
        return n * 1000 / ms if ms else None
    r = report(system, atype)
    if not r or not r["complete"]:
        return None
    return n * 1000 / max(r["last_arrival_ms"] - m[f"{system}.{atype}.start_ms"], 1)


def flow_eps(system, shape):
    """Drain throughput without the start-up: first → last event at the consumer."""
    if system == "recvlogical":
        return drain_eps(system, shape)
    r = report(system, f"{system}-drain-{shape}")
    if not r or not r["complete"]:
        return None
    return r["count"] * 1000 / max(r["last_arrival_ms"] - r["first_arrival_ms"], 1)


def first_event_s(system, shape):
    atype = f"{system}-drain-{shape}"
    r = report(system, atype)
    if not r or not r["count"]:
        return None
    return (r["first_arrival_ms"] - m[f"{system}.{atype}.start_ms"]) / 1000


def cpu_us(system, atype):
    r = report(system, atype)
    if not r or not r["complete"]:
        return None  # a short phase's CPU is not per event
    n = m.get(f"{system}.{atype}.events")
    t = m.get(f"{system}.{atype}.cpu_ticks")
    return t / tck * 1e6 / n if n and t is not None else None


def latency(system, rate, q):
    r = report(system, f"{system}-steady-{rate}")
    return r["latency_ms"][q] if r and r["count"] else None


def commit_latency(system, rate, q):
    """Arrival minus the record timestamp, which only outboxd sets to the
    commit time (the poller stamps created_at, Debezium its processing
    time): commit → consumer."""
    r = report(system, f"{system}-steady-{rate}")
    return r.get("record_latency_ms", {}).get(q) if r and r["count"] else None


def delivered_eps(system, rate):
    r = report(system, f"{system}-steady-{rate}")
    return r["throughput_eps"] if r else None


def count_ok(system):
    bad = 0
    for atype in [f"{system}-drain-{s}" for s in shapes] + [f"{system}-steady-{r}" for r in rates]:
        r = report(system, atype)
        if system != "recvlogical" and (not r or not r["complete"]):
            bad += 1
    return "all" if not bad else f"{bad} phase(s) short"


ceiling = {s: drain_eps("recvlogical", s) for s in shapes} if "recvlogical" in systems else {}
rows = []


def fmt(v, f):
    return "—" if v is None else f.format(v)


def row(label, fn, f="{:,.0f}", ratio=True, systems_=None):
    cells = []
    vals = {}
    for s in systems:
        v = fn(s) if (systems_ is None or s in systems_) else None
        vals[s] = v
        cells.append(v if isinstance(v, str) else fmt(v, f))
    r = ""
    a, b = vals.get("outboxd"), vals.get("debezium")
    if ratio and isinstance(a, (int, float)) and isinstance(b, (int, float)) and b:
        r = f"{a / b:.2f}"
    rows.append((label, *cells, r))


for shape in shapes:
    label = "1-row transactions" if shape == "1" else f"{shape}-row transactions"
    row(f"drain, {int(m.get(f'outboxd.outboxd-drain-{shape}.events', float(events))):,} events in {label} (events/s)",
        lambda s: drain_eps(s, shape))

    def vs_ceiling(s, shape=shape):
        v, c = drain_eps(s, shape), ceiling.get(shape)
        return f"{v / c:.2f} ×" if v and c else None
    if ceiling:
        row(f"  … ratio to pg_recvlogical ({label})", vs_ceiling, ratio=False)
    row(f"  … first → last event, start-up left out ({label}, events/s)", lambda s: flow_eps(s, shape))
for shape in shapes:
    row(f"start → first event, drain of {shape}-row transactions (s)", lambda s: first_event_s(s, shape),
        "{:.2f}", systems_=relays)
for shape in shapes:
    row(f"CPU per event, drain of {shape}-row transactions (µs)",
        lambda s: cpu_us(s, f"{s}-drain-{shape}"), "{:.1f}", systems_=relays)
row("peak RSS through a drain (MiB)",
    lambda s: max(m.get(f"{s}.{s}-drain-{sh}.peak_rss_kib", 0) for sh in shapes) / 1024, "{:.1f}", systems_=relays)
row(f"peak RSS, {bulk}-row drain and steady phases (one process, MiB)", lambda s: m.get(f"{s}.peak_rss_kib", 0) / 1024, "{:.1f}", systems_=relays)
for rate in rates:
    row(f"steady {int(rate):,} events/s: writers reached (events/s)",
        lambda s: m.get(f"{s}.{s}-steady-{rate}.writer_tps", 0) * int(steady_txn), systems_=relays, ratio=False)
    for q in ("p50", "p99", "max"):
        row(f"steady {int(rate):,} events/s: latency write → consumer {q} (ms)",
            lambda s: latency(s, rate, q), "{:,.1f}", systems_=relays)
    for q in ("p50", "p99"):
        row(f"steady {int(rate):,} events/s: latency commit → consumer {q} (ms, outboxd: record timestamp)",
            lambda s: commit_latency(s, rate, q), "{:,.1f}", systems_=["outboxd"], ratio=False)
    row(f"steady {int(rate):,} events/s: CPU per event (µs)",
        lambda s: cpu_us(s, f"{s}-steady-{rate}"), "{:.1f}", systems_=relays)
row("duplicates (all phases)", lambda s: sum((report(s, a) or {}).get("duplicates", 0) for a in
    [f"{s}-drain-{x}" for x in shapes] + [f"{s}-steady-{r}" for r in rates]), ratio=False, systems_=relays)
row("every event delivered", count_ok, ratio=False, systems_=relays)

print(f"\n{events} events per drain (1-row and {bulk}-row transactions), steady {', '.join(rates)} events/s for "
      f"{steady_s} s each in {steady_txn}-row transactions; {clients} writers, 374-byte JSON payloads, 6 partitions; "
      f"polling: batch {poll_batch}, poll interval {poll_ms} ms; Debezium: poll.interval.ms={dbz_poll_ms}, "
      f"offset.flush.interval.ms={dbz_flush_ms}, producer idempotent, acks=all, lz4, linger.ms=5 (as outboxd)\n")
header = ("metric", *(names[s] for s in systems), "outboxd / Debezium" if "debezium" in systems else "")
w = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
print("| " + " | ".join(f"{c:<{w[i]}}" if i == 0 else f"{c:>{w[i]}}" for i, c in enumerate(header)) + " |")
print("|" + "|".join("-" * (w[i] + 2) if i == 0 else "-" * (w[i] + 1) + ":" for i in range(len(header))) + "|")
for r in rows:
    print("| " + " | ".join(f"{c:<{w[i]}}" if i == 0 else f"{c:>{w[i]}}" for i, c in enumerate(r)) + " |")

# ---------------------------------------------------------------- plots
with open(f"{out}/drain.dat", "w") as f:
    f.write("shape " + " ".join(f'"{short[s]}"' for s in systems) + "\n")
    for shape in shapes:
        vals = [drain_eps(s, shape) or 0 for s in systems]
        f.write(f'"{shape}-row transactions" ' + " ".join(f"{v:.0f}" for v in vals) + "\n")
with open(f"{out}/latency.dat", "w") as f:
    for rate in rates:
        f.write(f'# rate {rate}\nsystem p50 p99 max\n')
        for s in relays:
            f.write(f'"{short[s]}" ' + " ".join(f"{latency(s, rate, q) or 0:.3f}" for q in ("p50", "p99", "max"))
                    + "\n")
        f.write("\n\n")
ncols = len(systems)
gp = f"""set terminal pngcairo size 900,500 font ',10' noenhanced
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set key top left
set grid ytics
set output '{plot_dir}/drain.png'
set title 'Backlog drain, {int(events):,} events, same PostgreSQL and Kafka (higher is better)'
set ylabel 'events/s'
set yrange [0:*]
set key outside right top
plot for [i=2:{ncols + 1}] '{out}/drain.dat' using i:xtic(1) title columnheader(i)
set output '{plot_dir}/latency.png'
set terminal pngcairo size {450 * len(rates)},500 font ',10' noenhanced
set multiplot layout 1,{len(rates)}
set key inside top left
set logscale y
set yrange [0.5:*]
set ylabel 'ms, write → consumer (log scale)'
"""
for i, rate in enumerate(rates):
    gp += (f"set title 'steady {int(rate):,} events/s'\n"
           f"plot for [c=2:4] '{out}/latency.dat' index {i} using c:xtic(1) title columnheader(c)\n")
gp += "unset multiplot\n"
open(f"{out}/plots.gp", "w").write(gp)
