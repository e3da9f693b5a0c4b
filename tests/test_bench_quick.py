"""The benchmark harness keeps working: its smallest scenario runs end to end and yields numbers.

``make bench-quick`` is what CI may run to keep the benchmarks alive, and the lead engineer reads
their figures when optimising the hot path, so a harness that silently measures nothing (every
filter an error, a phase skipped, a NaN in the table) is a real regression. Times are never
asserted here: the machine is shared and noisy. Only the shape and sanity of the numbers are.
"""
from __future__ import annotations

import dataclasses
import math

import aiohttp

from bench import report
from bench.plans import QUICK, ClusterPlan, ContentionPlan, EventsPlan, WriteDelayPlan
from bench.scenarios import run_cluster, run_mixed
from bench.seed import FAMILY_VENDOR, ClusterShape, mixed_unavailable


def _smallest_quick_scenario():
    """The quick plan's smallest cluster, with every phase, at the fewest samples that still
    exercise each code path (both concurrencies, burst, idle and loaded lag)."""
    n100 = min((c for c in QUICK.clusters if not c.compare_with_nvidia), key=lambda c: c.shape.nodes)
    return dataclasses.replace(
        n100, filter_samples=10, schedule_pods=8, phase_time_limit_s=5.0,
        events=EventsPlan(burst_pods=100, load_rate=2000, load_seconds=0.6, idle_probes=2, replay_seconds=0.5))


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _check_latencies(summary: dict, *, n: int) -> None:
    assert summary["n"] == n
    assert all(_positive(summary[k]) for k in ("p50", "p90", "p99", "max", "mean")), summary
    assert summary["p50"] <= summary["p90"] <= summary["p99"] <= summary["max"]


async def test_smallest_quick_scenario_yields_well_formed_numbers(tmp_path):
    plan = _smallest_quick_scenario()
    async with aiohttp.ClientSession() as session:
        result = await run_cluster(plan, session=session, workdir=tmp_path)

    assert (result["nodes"], result["pods"]) == (plan.shape.nodes, plan.shape.pods)
    assert _positive(result["ready_s"]) and _positive(result["seed_s"])

    assert [row["concurrency"] for row in result["filter"]] == list(plan.concurrencies)
    for row in result["filter"]:
        # Every filtered pod fits somewhere in the seeded cluster: errors would mean the harness
        # measured error answers, not decisions.
        assert row["outcomes"] == {"placed": plan.filter_samples}, row["errors"]
        _check_latencies(row, n=plan.filter_samples)
        assert _positive(row["requests_per_s"]) and _positive(row["server_mean_ms"])
        assert row["server_cpu_ms"] >= 0

    # Each concurrency with whole pods in flight, then kube-scheduler's way (serial filters, async binds).
    assert [(row["concurrency"], row["mode"]) for row in result["schedule"]] == \
        [(c, "whole pods") for c in plan.concurrencies] + [(1, "kube-scheduler")]
    for row in result["schedule"]:
        assert 0 < row["bound"] <= row["attempted"] == plan.schedule_pods
        assert _positive(row["pods_per_s"])
        _check_latencies(row["filter"], n=plan.schedule_pods)

    burst = result["burst"]
    assert burst["events"] == 3 * plan.events.burst_pods + 1      # + the sentinel's delete
    assert _positive(burst["events_per_s"]) and _positive(burst["end_to_end_events_per_s"])

    lag = result["lag"]
    _check_latencies(lag["idle_ms"], n=plan.events.idle_probes)
    assert lag["loaded_ms"]["n"] >= 1     # the probe loop takes one at least, however slow the run
    _check_latencies(lag["loaded_ms"], n=lag["loaded_ms"]["n"])
    assert lag["stream_events"] > 0 and _positive(lag["applied_rate"]) and _positive(lag["stream_rate"])
    # The replay: every event held, then released at the asked rate; one lag per probe node.
    replay = lag["replay"]
    assert replay["events"] >= 2000 * 0.5 and not replay["cut"] and _positive(replay["delivered_rate"])
    _check_latencies(replay["lag_ms"], n=plan.shape.probe_nodes)

    for key in ("memory_ready", "memory_end", "memory_after_scrape"):
        assert _positive(result[key]["rss_mb"]) and result[key]["peak_mb"] >= result[key]["rss_mb"]
    assert result["metrics_scrape"]["pod_events"] >= lag["stream_events"]

    results = {"command": "test", "plan": "quick", "machine": report.machine(), "clusters": [result], "kernel": []}
    table = "\n".join(report.render_header(results) + report.render_tables(results))
    assert "/filter latency" in table and "nan" not in table.lower()


async def test_the_api_budget_rows_count_requests_and_drain_a_contended_node(tmp_path):
    """The issue-13 rows (docs/BENCHMARKS.md): API requests per pod as the API server counts
    them, and a queue of binpacked pods on one node's lock, at the smallest size."""
    # Ten nodes, so that the six pods spread onto nodes of their own: no bind meets another's lock.
    plan = ClusterPlan("budget-quick", ClusterShape(10, 8, probe_nodes=1), concurrencies=(), request_count_pods=6,
                       phase_time_limit_s=20.0, contention=ContentionPlan(pods=6, allocation_delay_s=0.02),
                       write_delay=WriteDelayPlan(delay_s=0.05, filter_samples=20, schedule_pods=4, rounds=1))
    async with aiohttp.ClientSession() as session:
        result = await run_cluster(plan, session=session, workdir=tmp_path)

    requests = result["requests"]
    assert requests["pods"] == requests["attempted"] == 6 and not requests["errors"], requests
    # The lock and the Binding for each pod, nothing else on its critical path (/filter writes
    # nothing, the bind reads nothing, the Binding carries the label); the Events counted apart.
    assert requests["critical_per_pod"] == 2, requests
    assert requests["per_pod"].get("POST pods/binding") == 1.0, requests["per_pod"]
    assert requests["per_pod"].get("PATCH nodes") == 1.0, requests["per_pod"]
    assert requests["background_per_pod"] == 0 and requests["events_per_pod"] > 0, requests

    # With every write delayed by 50 ms, /filter still answers without waiting for any (its p99
    # far under the delay; no latency target on a shared test machine), and binds wait for theirs.
    delayed = result["write-delay"]
    assert delayed["filter"]["outcomes"].get("placed") == delayed["filter"]["n"] == 20, delayed
    assert delayed["filter"]["p99"] < 50, delayed["filter"]
    assert delayed["schedule"]["bound"] == 4 and delayed["schedule"]["bind"]["p50"] >= 100, delayed["schedule"]

    contention = result["contention"]
    # Every bind that met the lock of the allocation before it waited for it (--node-lock-wait,
    # 10 s, against allocations of 20 ms): none failed on the lock, and all were allocated.
    assert contention["bound"] == contention["allocated"] == 6, contention
    assert contention["lock_failures"] == 0, contention

    results = {"command": "test", "plan": "quick", "machine": report.machine(), "clusters": [result], "kernel": []}
    table = "\n".join(report.render_tables(results))
    assert "API requests per scheduled pod" in table and "node lock contention" in table and "nan" not in table.lower()
    assert "every API write delayed" in table


async def test_the_mixed_scenario_measures_both_clusters(tmp_path):
    """The mixed row: an all-NVIDIA cluster and a mixed one (every family) of the same size,
    /filter on each, every family's pods placed, and the ratio in the table."""
    assert not mixed_unavailable(), mixed_unavailable()
    mixed = next(c for c in QUICK.clusters if c.compare_with_nvidia)
    families = {"NVIDIA", *FAMILY_VENDOR.values()}
    samples = 2 * len(mixed.filter_families)
    plan = dataclasses.replace(mixed, shape=ClusterShape(30, 240, probe_nodes=2, layout="mixed"),
                               filter_samples=samples, phase_time_limit_s=10.0)
    async with aiohttp.ClientSession() as session:
        result = await run_mixed(plan, session=session, workdir=tmp_path)
    for key in ("nvidia", "mixed"):
        [row] = result[key]["filter"]
        _check_latencies(row, n=samples)
        assert row["outcomes"] == {"placed": samples} and not row["errors"], row
    by_family = result["mixed"]["filter"][0]["by_family"]
    assert set(by_family) == families and len(families) == len(mixed.filter_families)
    assert all(v["n"] == 2 for v in by_family.values())
    assert set(result["decide_us"]["mixed"]) == families
    assert all(_positive(v) for d in result["decide_us"].values() for v in d.values()), result["decide_us"]
    [ratio] = result["ratios"]
    assert _positive(ratio["p50"]) and _positive(ratio["p99"])
    table = "\n".join(report.render_mixed({"mixed": result}))
    assert "mixed cluster /filter" in table and "nan" not in table.lower()


async def test_the_all_mode_phase_measures_filter_prioritize_and_bind(tmp_path):
    """--filter-mode=all (bench/all_mode.py): every fitting node answered, each prioritized, and
    kube-scheduler's pattern (filter, prioritize, choose, bind in the background) binds them all."""
    from bench.all_mode import AllModePlan
    plan = ClusterPlan("all-quick", ClusterShape(20, 160, probe_nodes=2), concurrencies=(), phase_time_limit_s=20.0,
                       scheduler_args=("--filter-mode=all",), all_mode=AllModePlan(samples=10, schedule_pods=8))
    async with aiohttp.ClientSession() as session:
        result = await run_cluster(plan, session=session, workdir=tmp_path, phases=("all-mode",))
    a = result["all-mode"]
    for key in ("filter", "prioritize", "cycle"):
        _check_latencies(a[key], n=10)
    assert a["fit_nodes"] == 18 and not a["errors"], a      # every node but the two full probe nodes
    assert _positive(a["answer_kb"]) and _positive(a["server_cpu_ms_per_cycle"])
    schedule = a["schedule"]
    assert schedule["bound"] == schedule["attempted"] == 8 and not schedule["errors"], schedule
    _check_latencies(schedule["bind"], n=8)
    results = {"command": "test", "plan": "quick", "machine": report.machine(), "clusters": [result], "kernel": []}
    table = "\n".join(report.render_tables(results))
    assert "--filter-mode=all" in table and "nan" not in table.lower()


def test_the_cpu_meter_sees_a_window_shorter_than_a_clock_tick():
    """Every per-request CPU figure divides a short window's CPU by its requests. /proc/<pid>/stat
    counts 10 ms ticks, so ten 0.4 ms /filter cycles could read as zero CPU (a CI run did): the
    meter must resolve a few milliseconds of work."""
    import os
    import time

    from bench.procs import process_cpu_seconds
    before = process_cpu_seconds(os.getpid())
    spent_from = time.process_time()
    while time.process_time() - spent_from < 0.002:
        pass
    used = process_cpu_seconds(os.getpid()) - before
    assert 0 < used < 1, used


def test_the_gang_scenario_plans_a_whole_gang_and_reports_it():
    """bench/gangs.py: one /filter reserving every member of a gang (issue 34), timed in process."""
    from bench.gangs import gang_bench
    result = gang_bench(QUICK.gang_shapes[0], members=QUICK.gang_members, rounds=QUICK.gang_rounds)
    assert result["members"] == QUICK.gang_members and result["rounds"] == QUICK.gang_rounds
    assert all(_positive(result[k]) for k in ("plan_ms", "max_ms", "per_member_us")), result
    results = {"command": "test", "plan": "quick", "machine": report.machine(), "clusters": [], "kernel": [],
               "gangs": [result]}
    table = "\n".join(report.render_tables(results))
    assert "**a gang planned**" in table and "nan" not in table.lower()
