"""Turning results into the table, the targets' verdicts, docs/BENCHMARKS.md and the plot.

Targets come from the issue "Filter at cluster scale". They are printed next to each figure with
PASS or FAIL and never asserted anywhere: timings on a shared two-core machine are evidence for
whoever optimises the hot path, not a gate.
"""
from __future__ import annotations

import math
import os
import platform
import re
import subprocess
import time
from pathlib import Path

from bench.procs import REPO_ROOT

DOCS = REPO_ROOT / "docs" / "BENCHMARKS.md"
PLOT = REPO_ROOT / "docs" / "bench-filter-latency.png"
BEGIN = "<!-- bench:begin (written by `make bench`; edit outside these markers) -->"
END = "<!-- bench:end -->"

FILTER_P99_TARGET_MS = {1000: 5.0, 5000: 20.0}
SCHEDULE_TARGET_PER_S = 200.0
P_FLATNESS = 1.2
KERNEL_SPEEDUP = 20.0
EVENTS_PER_S = 20_000.0
LAG_P99_MS = 50.0
READY_S = 10.0
RSS_MB = 400.0


def machine() -> dict:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                                text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = math.nan
    return {"cores": os.cpu_count(), "cpu": model, "python": platform.python_version(),
            "kernel": platform.release(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "commit": commit, "load_before": load}


def _num(value, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, float) and value >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _verdict(ok: bool | None) -> str:
    return "" if ok is None else ("PASS" if ok else "FAIL")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |"
    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    return [line, rule, *body]


def _clusters(results: dict) -> list[dict]:
    return results.get("clusters", [])


def _find(results: dict, name: str) -> dict | None:
    return next((c for c in _clusters(results) if c["name"] == name), None)


def _filter_row(cluster: dict | None, concurrency: int) -> dict | None:
    if not cluster:
        return None
    return next((r for r in cluster.get("filter", []) if r["concurrency"] == concurrency), None)


def _errors(results: dict, phase: str) -> list[str]:
    """The error answers a phase got, so a fast figure made of errors cannot pass unnoticed."""
    lines = []
    for c in _clusters(results):
        for r in c.get(phase, []):
            for message, count in r.get("errors", {}).items():
                mode = " (binds async)" if r.get("mode") == "kube-scheduler" else ""
                lines.append(f"- N={c['nodes']:,} P={c['pods']:,} c={r['concurrency']}{mode}: {count} × {message}")
    return ["", "Errors:", *lines] if lines else []


def filter_target(nodes: int, concurrency: int) -> float | None:
    return FILTER_P99_TARGET_MS.get(nodes) if concurrency == 1 else None


def flatness(results: dict) -> tuple[float | None, float | None]:
    """(p99 at N=1000 P=40000 / p99 at P=0, c=1) when both were measured."""
    p0 = _filter_row(_find(results, "p0"), 1)
    p40 = _filter_row(_find(results, "p40000"), 1)
    if not p0 or not p40:
        return None, None
    return p40["p99"] / p0["p99"], p0["p99"]


CONTENTION_TARGET_S = 10.0


def _render_budget(results: dict) -> list[str]:
    """Issue 13's rows: requests per pod by verb, throughput on the chart's budget, lock contention."""
    out: list[str] = []
    for c in _clusters(results):
        if r := c.get("requests"):
            total = sum(v for k, v in r["per_pod"].items())
            verbs = ", ".join(f"{k} {_num(v, 2)}" for k, v in r["per_pod"].items())
            out += [f"**API requests per scheduled pod** (N={c['nodes']:,}, P={c['pods']:,}, {r['pods']} pods "
                    "in kube-scheduler's pattern, counted by the in-repo API server; heartbeats paused, and the few "
                    "handshake stamps still owed from before the pause counted apart; the device plugin's half "
                    "is not the scheduler's)", "",
                    f"- on the critical path (the --kube-qps bucket): **{_num(r['critical_per_pod'], 2)}** a pod "
                    f"(target 2, and {_verdict(r['critical_per_pod'] <= 2.05)} for at most one retry in 20 pods: "
                    "the hundredths over 2 are the lock's compare-and-set tried again because something else "
                    "wrote the node just before, the one retry compare-and-set is made for)",
                    *([f"- after the bind's answer, in the background (the vgpu-node label, only where the API "
                       f"server drops a Binding's labels): {_num(r['background_per_pod'], 2)} a pod"]
                      if "background_per_pod" in r else []),
                    f"- Events (a bucket of their own): {_num(r['events_per_pod'], 2)} a pod",
                    f"- in all: **{_num(total, 2)}** a pod (target ≤ 4: {_verdict(total <= 4)})",
                    f"- by method and resource: {verbs}",
                    *(["- not any pod's, in the same window (node upkeep): "
                       + ", ".join(f"{k} {v}" for k, v in sorted(r["upkeep"].items()))] if r.get("upkeep") else []),
                    ""]
    rows = []
    for c in _clusters(results):
        if c.get("scheduler_args") or c.get("budget"):
            for r in c.get("schedule", []):
                paced = r.get("rate")
                target = (f"≥ 100/s with filter p99 ≤ 5 ms "
                          f"{_verdict(r['pods_per_s'] >= 100 and r['filter']['p99'] <= 5)}" if paced
                          else f"≥ 100/s {_verdict(r['pods_per_s'] >= 100)}")
                rounds = r.get("p99_rounds") or []
                rows.append([f"{c['nodes']:,}", f"{c['pods']:,}", " ".join(c["scheduler_args"]) or "none (the chart's)",
                             f"{paced:g}/s" if paced else "as fast as answered", _num(r["pods_per_s"]),
                             f"{r['bound']}/{r['attempted']}", _num(r["filter"]["p50"], 2), _num(r["filter"]["p99"], 2),
                             " / ".join(_num(v, 2) for v in rounds) if len(rounds) > 1 else "",
                             _num(r["bind"]["p99"], 2), _num(r["server_cpu_ms_per_pod"], 2), target])
    if rows:
        out += ["**filter+bind throughput on the chart's budget** (hami-py started as HAMi's chart starts it, with "
                "neither --kube-qps nor --kube-burst: the defaults, 600/1200, which manifests/deployment.yaml "
                "passes too; flags column: what else was passed; one /filter "
                "at a time, binds in the background, as kube-scheduler drives an extender; first with each filter "
                "sent as soon as the last answered, which keeps the scheduler's one event loop saturated, then "
                "with pods arriving at a sustained rate above issue 13's 100 pods/s, the round with the median "
                "filter p99 of three)", ""]
        out += _table(["N", "P", "flags", "pods arrive", "pods/s", "bound", "filter p50 ms", "filter p99 ms",
                       "p99 of each round", "bind p99 ms", "server CPU ms/pod", "target"], rows)
        out.append("")
    rows = []
    for c in _clusters(results):
        if w := c.get("write-delay"):
            f, sch, base = w["filter"], w["schedule"], w.get("baseline")
            rows.append([f"{c['nodes']:,}", f"{c['pods']:,}", _num(w["delay_ms"], 0), _num(f["p50"], 2),
                         _num(f["p99"], 2), " / ".join(_num(v, 2) for v in f.get("p99_rounds", [f["p99"]])),
                         f"{_num(base['p50'], 2)} / {_num(base['p99'], 2)}" if base else "—",
                         f"{f['outcomes'].get('placed', 0)}/{f['n']}",
                         _num(sch["bind"]["p50"], 1), _num(sch["bind"]["p99"], 1), _num(sch["pods_per_s"]),
                         f"filter p99 ≤ {w['filter_target_ms']:g} ms {_verdict(f['p99'] <= w['filter_target_ms'])}"])
    if rows:
        out += ["**/filter with every API write delayed** (the in-repo API server holds each POST/PUT/PATCH/DELETE "
                "the scheduler sends for the delay before serving it; /filter at concurrency 1, the round with the "
                "median p99 of five, beside as many rounds without the delay, the two alternating; then filter+bind "
                "one filter at a time with binds in the background)", ""]
        out += _table(["N", "P", "write delay ms", "filter p50 ms", "filter p99 ms", "p99 of each round",
                       "no delay: p50 / p99 ms", "placed", "bind p50 ms", "bind p99 ms", "pods/s", "target"], rows)
        out.append("")
    rows = []
    for c in _clusters(results):
        if b := c.get("backlog"):
            f = b["filter"]
            rows.append([f"{c['nodes']:,}", f"{c['pods']:,}", f"{b['backlog_pods']} binds on {b['stuck_nodes']} nodes",
                         f"{b['binds_waiting_at_end']}/{b['backlog_pods']}", _num(f["p50"], 2), _num(f["p99"], 2),
                         " / ".join(_num(v, 2) for v in f.get("p99_rounds", [f["p99"]])),
                         _num(b["server_over_5ms_pct"], 1),
                         f"{b['outcomes'].get('placed', 0)}/{f['n']}",
                         f"p99 ≤ 5 ms {_verdict(f['p99'] <= 5 and b['binds_waiting_at_end'] == b['backlog_pods'])}"])
    if rows:
        out += ["**/filter during a backlog** (issue 24: device plugins hung on some nodes, a pod bound there with "
                "bind-phase allocating holding each node's lock, taken just before; pods filtered onto those nodes "
                "and their binds sent, all waiting on the locks; meanwhile new pods' /filter over every node, one at "
                "a time as kube-scheduler's scheduling cycle sends them, the round with the median p99 of three; "
                "the chart's budget)", ""]
        out += _table(["N", "P", "waiting", "still waiting at the end", "filter p50 ms", "filter p99 ms",
                       "p99 of each round", "server > 5 ms %", "placed", "target"], rows)
        out.append("")
    rows = []
    for c in _clusters(results):
        if r := c.get("contention"):
            rows.append([f"{r['pods']} pods onto {r['nodes']} nodes, {_num(1000 * r['allocation_delay_s'], 0)} ms "
                         "per allocation", _num(r["seconds"], 2), f"{r['bound']}/{r['pods']}", str(r["binds"]),
                         str(r["lock_failures"]),
                         f"≤ {CONTENTION_TARGET_S:g} s {_verdict(r['bound'] == r['pods'] and r['seconds'] <= CONTENTION_TARGET_S)}"])
    if rows:
        out += ["**node lock contention** (kube-scheduler's pattern with its pod backoff, 1 s doubling to 10 s; "
                "binpack, so every pod wants the node whose lock the last allocation holds; the simulated device "
                "plugin frees each lock after its allocation)", ""]
        out += _table(["run", "s to all bound", "bound", "binds", "binds failed on the node lock", "target"], rows)
        for c in _clusters(results):
            if (r := c.get("contention")) and r["errors"]:
                out += [f"- {n} × {e}" for e, n in sorted(r["errors"].items(), key=lambda kv: -kv[1])]
        out.append("")
    return out


def render_tables(results: dict) -> list[str]:
    out: list[str] = []
    rows = []
    for c in _clusters(results):
        for r in c.get("filter", []):
            target = filter_target(c["nodes"], r["concurrency"])
            rows.append([f"{c['nodes']:,}", f"{c['pods']:,}", str(r["concurrency"]), _num(r["p50"], 2),
                         _num(r["p90"], 2), _num(r["p99"], 2), _num(r["server_mean_ms"], 2),
                         _num(r.get("server_over_5ms_pct", float("nan")), 1), _num(r["server_cpu_ms"], 2), _num(r["requests_per_s"]),
                         f"{r['outcomes'].get('placed', 0)}/{r['n']}",
                         " / ".join(_num(v, 2) for v in r.get("p99_rounds", [])) if len(r.get("p99_rounds", [])) > 1 else "",
                         f"≤ {target:g} ms {_verdict(r['p99'] <= target)}" if target else ""])
    if rows:
        out += ["**/filter latency** (ms, end to end over HTTP; /filter makes no API call; all N node names per request; "
                "at concurrency 1 the round with the median p99 is shown, every round's p99 next to it)", ""]
        out += _table(["N", "P", "conc", "p50", "p90", "p99", "server mean",
                       "server > 5 ms %", "server CPU/req",
                       "req/s", "placed", "p99 of each round", "target (p99)"], rows)
        ratio, _ = flatness(results)
        if ratio is not None:
            out += ["", f"p99 at N=1000, P=40000 is {ratio:.2f}× the p99 at P≈0 "
                        f"(target ≤ {P_FLATNESS}×: {_verdict(ratio <= P_FLATNESS)})"]
        out += _errors(results, "filter")
        out.append("")
    out += render_floor(results)

    rows = []
    for c in _clusters(results):
        for r in c.get("schedule", []):
            # Judged as kube-scheduler drives an extender (older results have no mode: every row).
            target = c["nodes"] == 1000 and r.get("mode", "kube-scheduler") == "kube-scheduler"
            mode = ("1 filter at a time, binds async" if r.get("mode") == "kube-scheduler"
                    else f"same, pods arriving at {r['rate']:g}/s" if r.get("mode") == "kube-scheduler paced"
                    else f"{r['concurrency']} whole pods")
            rows.append([f"{c['nodes']:,}", f"{c['pods']:,}", mode, _num(r["pods_per_s"]),
                         f"{r['bound']}/{r['attempted']}", _num(r["filter"]["p99"], 2), _num(r["bind"]["p99"], 2),
                         _num(r["server_cpu_ms_per_pod"], 2),
                         f"≥ {SCHEDULE_TARGET_PER_S:g}/s {_verdict(r['pods_per_s'] >= SCHEDULE_TARGET_PER_S)}"
                         if target else ""])
    if rows:
        out += ["**filter+bind throughput** (pods bound per second; device plugin releases node locks; "
                "the target is judged as kube-scheduler drives an extender: one scheduling cycle, so one "
                "/filter, at a time, each /bind in its own binding cycle in the background)", ""]
        out += _table(["N", "P", "in flight", "pods/s", "bound", "filter p99 ms", "bind p99 ms", "server CPU ms/pod",
                       "target"], rows)
        out += _errors(results, "schedule")
        out.append("")
    out += _render_budget(results)
    out += render_all_mode(results)

    rows = []
    for c in _clusters(results):
        if b := c.get("burst"):
            rows.append([f"burst: {b['events']:,} pod events at once (N={c['nodes']:,}, P={c['pods']:,})",
                         f"{_num(b['events_per_s'])} events/s applied", f"≥ {EVENTS_PER_S:,.0f}/s",
                         _verdict(b["events_per_s"] >= EVENTS_PER_S)])
            rows.append(["  same, including the API server's commit", f"{_num(b['end_to_end_events_per_s'])} events/s",
                         "", ""])
            rows.append(["  CPU per event: scheduler / API server stand-in",
                         f"{_num(b['server_cpu_us_per_event'])} / {_num(b.get('api_cpu_us_per_event'))} µs", "", ""])
        if lag := c.get("lag"):
            idle, loaded = lag["idle_ms"], lag["loaded_ms"]
            rows.append(["delete-to-free lag, idle", f"p50 {_num(idle['p50'])} / p99 {_num(idle['p99'])} ms "
                         f"(n={idle['n']})", "", ""])
            replay = lag.get("replay")
            rows.append([f"delete-to-free lag, stream committed live: {lag['stream_target_rate']:,.0f} events/s asked "
                         f"({_num(lag['stream_rate'])}/s produced)",
                         f"p50 {_num(loaded['p50'])} / p99 {_num(loaded['p99'])} ms (n={loaded['n']})",
                         "" if replay else f"p99 ≤ {LAG_P99_MS:g} ms",
                         "" if replay else _verdict(loaded["p99"] <= LAG_P99_MS if loaded["n"] else False)])
            rows.append(["  steady stream applied", f"{_num(lag['applied_rate'])} events/s, "
                         f"{_num(lag['behind_at_end_s'], 2)} s behind at its end", "", ""])
            api_share = lag.get("api_cpu_share", math.nan)
            note = " (the stand-in API server was the bottleneck)" if api_share >= 0.9 else ""
            rows.append(["  CPU share during the stream: scheduler / API server stand-in",
                         f"{_num(100 * lag['server_cpu_share'], 0)} % / {_num(100 * api_share, 0)} %{note}", "", ""])
            if replay:
                r_lag = replay["lag_ms"]
                rows.append([f"delete-to-free lag, stream delivered at {replay['rate']:,.0f} events/s "
                             f"({replay['events']:,} events committed beforehand, delivered at "
                             f"{_num(replay['delivered_rate'])}/s)",
                             f"p50 {_num(r_lag['p50'])} / p99 {_num(r_lag['p99'])} / max {_num(r_lag['max'])} ms "
                             f"(n={r_lag['n']}); scheduler CPU {_num(100 * replay['server_cpu_share'], 0)} %",
                             f"p99 ≤ {LAG_P99_MS:g} ms",
                             _verdict(r_lag["p99"] <= LAG_P99_MS and not replay["cut"] if r_lag["n"] else False)])
    big = _find(results, "n5000")
    for c in _clusters(results):
        is_big = c is big
        quiet = f" (API server quiet again at {c['settled_s']:.1f} s)" if "settled_s" in c else ""
        rows.append([f"start to ready (N={c['nodes']:,}, P={c['pods']:,})", f"{c['ready_s']:.2f} s{quiet}",
                     f"≤ {READY_S:g} s" if is_big else "", _verdict(c["ready_s"] <= READY_S) if is_big else ""])
    for c in _clusters(results):
        is_big = c is big
        mem_end = c.get("memory_end") or c.get("memory_ready") or {}
        if not mem_end:
            continue
        scrape = c.get("metrics_scrape") or {}
        first = scrape.get("first_scrape_rss_mb")
        scraped = (f"; one /metrics scrape: {scrape['mb']:.1f} MB in {scrape['seconds']:.2f} s"
                   + (f", the first one added {first:.0f} MiB" if first is not None else "") if scrape else "")
        rows.append([f"server RSS (N={c['nodes']:,}, P={c['pods']:,})",
                     f"{c['memory_ready']['rss_mb']:.0f} MiB after ready, {mem_end['rss_mb']:.0f} at end, "
                     f"peak {mem_end['peak_mb']:.0f}{scraped}", f"peak ≤ {RSS_MB:g} MiB" if is_big else "",
                     _verdict(mem_end["peak_mb"] <= RSS_MB) if is_big else ""])
    if rows:
        out += ["**watch events, start-up, memory**", ""]
        out += _table(["measure", "value", "target", ""], rows)
        out.append("")

    out += render_mixed(results)

    rows = []
    for k in results.get("kernel", []):
        rows.append([f"{k['nodes']:,}", f"{k['pods']:,}", _num(k["cython_us"]), _num(k["python_us"]),
                     f"{k['speedup']:.0f}×", _num(k["decide_us"]), "yes" if k["agree"] else "NO",
                     f"≥ {KERNEL_SPEEDUP:g}× {_verdict(k['speedup'] >= KERNEL_SPEEDUP)}"])
    if rows:
        out += ["**kernel alone** (µs per call, all N nodes as candidates; decide() = the whole in-process "
                "decision with the Cython kernel)", ""]
        out += _table(["N", "P", "Cython µs", "Python µs", "speedup", "decide() µs", "same answer", "target"], rows)
        out.append("")
    rows = [[f"{g['nodes']:,}", f"{g['pods']:,}", str(g["members"]), _num(g["plan_ms"]), _num(g["max_ms"]),
             _num(g["per_member_us"])] for g in results.get("gangs", [])]
    if rows:
        out += ["**a gang planned** (one /filter reserving every member, in process; docs/GANGS.md)", ""]
        out += _table(["N", "P", "members", "plan ms (median)", "slowest ms", "µs per member"], rows)
        out.append("")
    return out


MIXED_RATIO = 1.3
FLOOR_RATIO = 2.0     # issue 35: /filter within 2× of its floor
# Upstream's /filter p99 as issue 35 measured it (its binary, same load, its 2-core machine): for
# scale only, since the binary does not run here.
UPSTREAM_P99_MS = {1000: 266.0, 5000: 2094.0}


def render_floor(results: dict) -> list[str]:
    """/filter at concurrency 1 against its floor (bench/floor.py): the HTTP exchange alone plus
    decide() alone, measured in the same run."""
    rows = []
    for c in _clusters(results):
        r = _filter_row(c, 1)
        if r is None or "floor" not in r or "decide_alone_us" not in r:
            continue
        decide_ms = r["decide_alone_us"] / 1000
        floor50, floor99 = r["floor"]["p50"] + decide_ms, r["floor"]["p99"] + decide_ms
        ratio50, ratio99 = r["p50"] / floor50, r["p99"] / floor99
        # Issue 35's sizes (8 running pods a node) are judged; the P sweep and N=100 are shown.
        judged = c["nodes"] in UPSTREAM_P99_MS and c["pods"] == 8 * c["nodes"]
        upstream = UPSTREAM_P99_MS.get(c["nodes"]) if judged else None
        rows.append([f"{c['nodes']:,}", f"{c['pods']:,}", f"{_num(r['p50'], 2)} / {_num(r['p99'], 2)}",
                     f"{_num(r['floor']['p50'], 2)} / {_num(r['floor']['p99'], 2)}", _num(decide_ms, 2),
                     f"{_num(floor50, 2)} / {_num(floor99, 2)}", f"{ratio50:.2f}× / {ratio99:.2f}×",
                     f"{upstream / r['p99']:.0f}×" if upstream else "",
                     f"≤ {FLOOR_RATIO:g}× {_verdict(ratio50 <= FLOOR_RATIO and ratio99 <= FLOOR_RATIO)}"
                     if judged else ""])
    if not rows:
        return []
    out = ["**/filter against its floor** (ms, concurrency 1, the same bodies; HTTP floor: an aiohttp server that "
           "reads and decodes the body and answers the same size (bench/floor.py); decide(): Filterer.decide alone "
           "in process on the same cluster; floor = the two added; upstream: its p99 as issue 35 measured it on "
           f"its machine ({', '.join(f'{v:,.0f} ms at {k:,}' for k, v in UPSTREAM_P99_MS.items())} nodes), over ours; judged "
           "at issue 35's sizes, 8 running pods a node)", ""]
    out += _table(["N", "P", "/filter p50 / p99", "HTTP floor p50 / p99", "decide() alone", "floor p50 / p99",
                   "/filter ÷ floor", "upstream p99 ÷ ours", "target"], rows)
    out.append("")
    return out


def render_mixed(results: dict) -> list[str]:
    """The mixed cluster's /filter beside the all-NVIDIA one of the same run, and the ratio."""
    m = results.get("mixed")
    if not m:
        return []
    if m.get("skipped"):
        return [f"**mixed cluster /filter**: skipped, {m['skipped']}", ""]
    target = m.get("target_ratio", MIXED_RATIO)
    base = {r["concurrency"]: r for r in m["nvidia"].get("filter", [])}
    ratios = {r["concurrency"]: r for r in m.get("ratios", [])}
    rows = []
    for r in m["mixed"].get("filter", []):
        b = base.get(r["concurrency"])
        q = ratios.get(r["concurrency"])
        if b is None or q is None:
            continue
        cpu = q.get("server_cpu_ms")
        rows.append([str(r["concurrency"]), f"{_num(b['p50'], 2)} / {_num(b['p99'], 2)}",
                     f"{_num(r['p50'], 2)} / {_num(r['p99'], 2)}", f"{q['p50']:.2f}× / {q['p99']:.2f}×",
                     f"{_num(b['server_cpu_ms'], 2)} / {_num(r['server_cpu_ms'], 2)}"
                     + (f" ({cpu:.2f}×)" if cpu is not None and math.isfinite(cpu) else ""),
                     f"{r['outcomes'].get('placed', 0)}/{r['n']}",
                     f"≤ {target:g}× {_verdict(q['p50'] <= target and q['p99'] <= target)}"])
    out = [f"**mixed cluster /filter** (ms, p50 / p99; N={m['nodes']:,}, P={m['pods']:,}: "
           + (f"{m['layout']}, " if m.get("layout") else "") + "8 devices a node; the pod stream cycles "
           f"{', '.join(m['families'])}; the all-NVIDIA cluster of the same N and P measured in the same run"
           + (", the two clusters' rounds alternating" if m.get("interleaved") else "") + ")", ""]
    out += _table(["conc", "all NVIDIA", "mixed", "ratio", "server CPU ms/req (NVIDIA / mixed)", "placed (mixed)",
                   "target (p50 and p99)"], rows)
    decide = m.get("decide_us")
    if decide:
        base_us = decide["nvidia"].get("NVIDIA")
        mixed = decide["mixed"]
        mean = sum(mixed.values()) / len(mixed) if mixed else float("nan")
        out += ["", f"in-process decide() (µs, median, nothing reserved): all-NVIDIA cluster {_num(base_us, 0)}; "
                    "mixed cluster " + ", ".join(f"{k} {_num(v, 0)}" for k, v in mixed.items())
                + (f" (mean {_num(mean, 0)}, {mean / base_us:.2f}× the all-NVIDIA one)" if base_us else "")]
    one = next((r for r in m["mixed"].get("filter", []) if r.get("by_family")), None)
    if one:
        out += ["", "by family at concurrency 1 (p50 / p99 ms): " + "; ".join(
            f"{name} {_num(v['p50'], 2)} / {_num(v['p99'], 2)} (n={v['n']})" for name, v in one["by_family"].items())]
    out.append("")
    return out


def render_header(results: dict) -> list[str]:
    m = results["machine"]
    return [f"Command: `{results['command']}` ({results['plan']} plan), {m['date']}, commit {m['commit'] or '?'}",
            "",
            f"Machine: {m['cores']} cores ({m['cpu']}), Python {m['python']}, Linux {m['kernel']}; "
            f"load average {m['load_before']:.2f} when the run started (the cores are shared).",
            ""]


def plot(results: dict, path: Path = PLOT) -> Path | None:
    """Filter latency (p50 and p99, c=1 and c=8) against N, and against P at N=1000."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (ax_n, ax_p) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110)
    by_n = sorted((c for c in _clusters(results) if c["pods"] == 8 * c["nodes"] and c.get("filter")),
                  key=lambda c: c["nodes"])
    by_p = sorted((c for c in _clusters(results) if c["nodes"] == 1000 and c.get("filter")), key=lambda c: c["pods"])
    for ax, clusters, key, xlabel in ((ax_n, by_n, "nodes", "nodes N (P = 8·N)"),
                                      (ax_p, by_p, "pods", "running pods P (N = 1000; P≈0 = 16 probe blockers)")):
        for conc, style in ((1, "-"), (8, "--")):
            for q, marker in (("p50", "o"), ("p99", "s")):
                xs = [c[key] for c in clusters if _filter_row(c, conc)]
                ys = [_filter_row(c, conc)[q] for c in clusters if _filter_row(c, conc)]
                if xs:
                    ax.plot(xs, ys, style, marker=marker, label=f"{q}, concurrency {conc}")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("/filter latency (ms)")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    if by_n:
        ax_n.set_xscale("log")
        for nodes, target in FILTER_P99_TARGET_MS.items():
            ax_n.plot([nodes], [target], marker="*", color="red", markersize=12, linestyle="none")
        ax_n.set_title("/filter latency against N (★ = p99 target)")
    ax_p.set_title("/filter latency against P")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def update_docs(results: dict, *, docs: Path = DOCS, plot_path: Path | None = PLOT) -> None:
    """Rewrite the part of docs/BENCHMARKS.md between the markers; keep everything else."""
    block = [BEGIN, "", *render_header(results), *render_tables(results)]
    if plot_path is not None:
        block += [f"![/filter latency against N and P]({plot_path.name})", ""]
    block.append(END)
    text = docs.read_text() if docs.exists() else f"# Benchmarks\n\n{BEGIN}\n{END}\n"
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        text = text.rstrip("\n") + "\n\n" + BEGIN + "\n" + END + "\n"
    docs.write_text(pattern.sub(lambda _: "\n".join(block), text))


def render_all_mode(results: dict) -> list[str]:
    """--filter-mode=all (bench/all_mode.py), beside the same run's best-mode figures at that N."""
    rows = []
    for c in _clusters(results):
        a = c.get("all-mode")
        if not a:
            continue
        best = next((b for b in _clusters(results) if b["nodes"] == c["nodes"] and b.get("filter")), None)
        best_filter = _filter_row(best, 1)
        best_ks = next((r for r in (best or {}).get("schedule", []) if r.get("mode") == "kube-scheduler"), None)
        s = a["schedule"]
        rows.append([f"{c['nodes']:,}", f"{c['pods']:,}", _num(a["fit_nodes"], 0), _num(a["answer_kb"], 1),
                     f"{_num(a['filter']['p50'], 2)} / {_num(a['filter']['p99'], 2)}",
                     f"{_num(best_filter['p50'], 2)} / {_num(best_filter['p99'], 2)}" if best_filter else "—",
                     f"{_num(a['prioritize']['p50'], 2)} / {_num(a['prioritize']['p99'], 2)}",
                     f"{_num(a['cycle']['p50'], 2)} / {_num(a['cycle']['p99'], 2)}",
                     _num(a["server_cpu_ms_per_cycle"], 2),
                     f"{_num(s['pods_per_s'])} ({s['bound']}/{s['attempted']})",
                     _num(best_ks["pods_per_s"]) if best_ks else "—"])
    if not rows:
        return []
    out = ["**--filter-mode=all** (ms, p50 / p99, one pod at a time; /filter answers every fitting node, "
           "/prioritize scores them, /bind fits again; `best` columns: the same run's best-mode cluster of "
           "that size)", ""]
    out += _table(["N", "P", "fit nodes", "answer KB", "filter", "best filter", "prioritize",
                   "filter+prioritize", "server CPU ms/cycle", "pods/s (bound)", "best pods/s"], rows)
    errors = [f"- N={c['nodes']:,}: {count} × {message}" for c in _clusters(results) if c.get("all-mode")
              for part in (c["all-mode"], c["all-mode"]["schedule"]) for message, count in part["errors"].items()]
    return out + (["", "Errors:", *errors] if errors else []) + [""]
