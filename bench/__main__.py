"""``make bench`` / ``make bench-quick``: hami-scheduler under kube-scheduler's load, measured.

    python -m bench                       the full run (several minutes): prints the table, writes
                                          bench/results.json, rewrites docs/BENCHMARKS.md and its plot
    python -m bench --quick               a small run in under a minute (CI keeps it working; its
                                          times mean little); writes bench/results-quick.json
    python -m bench --only n1000 kernel   just these scenarios (docs untouched)
    python -m bench --only p40000 --scheduler-env PYTHONPATH=exp/gc   (an experiment on the
                                          scheduler alone: flags or environment; docs untouched)
    python -m bench --profile n5000 [--phases filter] [--profile-startup]
                                          one scenario with py-spy recording the scheduler process
                                          (its measured stretches, or its whole life from start-up);
                                          the profile lands in bench/profiles/ and its top functions
                                          are printed

Scenarios: kernel, gang (bench/gangs.py: one /filter planning a whole gang), and the clusters of the plan (full: n100, n1000, p0, p40000, n5000, budget,
contention, mixed; quick: a small n100 with every phase, and a small mixed). ``mixed`` is two
clusters of the same size, all NVIDIA and then 50 % NVIDIA / 30 % Ascend 910B3 / 20 % Kunlun, with
/filter measured on each (a stream of every family's pods on the mixed one) and the ratio; it is
skipped, with the reason printed, while a family module it needs is a placeholder. Every cluster scenario seeds, starts the scheduler and times it
to ready; then it runs its phases: filter, schedule, burst, lag (see bench/scenarios.py).

Three processes take part: this one (the load generator, acting as kube-scheduler), the cluster
(bench/cluster.py: the fake API server, seeded in-process) and hami-scheduler itself, started as
``python -m hami_py``. Progress goes to stderr, the table to stdout.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson

from bench import report
from bench.gangs import gang_bench
from bench.kernel import kernel_bench
from bench.plans import PLANS, Plan
from bench.procs import REPO_ROOT, BenchError
from bench.profiling import Profiler, attach_command, merge_collapsed, render_filter_stages, summarize_collapsed
from bench.scenarios import PHASES, run_cluster, run_mixed

BENCH_DIR = Path(__file__).resolve().parent


def _say(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def scenario_names(plan: Plan) -> list[str]:
    return ["kernel", "gang", *(c.name for c in plan.clusters)]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="the small plan (under a minute)")
    p.add_argument("--only", nargs="+", metavar="SCENARIO", help="run only these scenarios")
    p.add_argument("--phases", default=",".join(PHASES),
                   help=f"comma list of cluster phases to run (default: all of {','.join(PHASES)})")
    p.add_argument("--profile", metavar="SCENARIO", help="run one scenario with py-spy on the scheduler")
    p.add_argument("--profile-format", default="raw", choices=["raw", "flamegraph", "speedscope", "chrometrace"])
    p.add_argument("--profile-native", action="store_true", help="include C frames (the Cython kernel)")
    p.add_argument("--profile-startup", action="store_true",
                   help="start the scheduler under py-spy and profile its whole life (start-up included) "
                        "instead of the measured stretches; with --phases '' that is start-up and settling")
    p.add_argument("--scheduler-arg", action="append", default=[], metavar="ARG",
                   help="extra hami-scheduler flag, e.g. --scheduler-arg=--node-scheduler-policy=spread")
    p.add_argument("--scheduler-env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra environment for the scheduler process only, e.g. PYTHONPATH=exp/gc-off")
    p.add_argument("--out", type=Path, help="results file (default bench/results.json, or results-quick.json)")
    p.add_argument("--no-docs", action="store_true", help="do not rewrite docs/BENCHMARKS.md")
    p.add_argument("--keep-logs", action="store_true", help="keep the processes' logs after a successful run")
    args = p.parse_args(argv)
    plan = PLANS["quick" if args.quick else "full"]
    known = scenario_names(plan)
    wanted = ([args.profile] if args.profile else []) + (args.only or [])
    unknown = [w for w in wanted if w not in known]
    if unknown:
        p.error(f"unknown scenario {', '.join(unknown)} for the {plan.name} plan; known: {', '.join(known)}")
    phases = tuple(x.strip() for x in args.phases.split(",") if x.strip())
    if bad := [x for x in phases if x not in PHASES]:
        p.error(f"unknown phase {', '.join(bad)}; known: {', '.join(PHASES)}")
    if args.profile in ("kernel", "gang"):
        p.error(f"the {args.profile} scenario runs in this process: profile it with py-spy record -- "
                f"python -m bench --only {args.profile}")
    args.plan, args.phases = plan, phases
    args.scheduler_env_map = {}
    for item in args.scheduler_env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            p.error(f"--scheduler-env wants KEY=VALUE, not {item!r}")
        args.scheduler_env_map[key] = value
    args.selected = [args.profile] if args.profile else (args.only or known)
    return args


async def run(args: argparse.Namespace, workdir: Path) -> dict:
    plan: Plan = args.plan
    command = "python -m bench" + (" --quick" if args.quick else "")
    results: dict = {"command": "make bench" if command == "python -m bench" else command, "plan": plan.name,
                     "machine": report.machine(), "clusters": [], "kernel": []}
    if "kernel" in args.selected:
        for shape in plan.kernel_shapes:
            _say(f"[kernel] N={shape.nodes} P={shape.pods}")
            results["kernel"].append(kernel_bench(shape, min_seconds=plan.kernel_seconds))
    if "gang" in args.selected:
        for shape in plan.gang_shapes:
            _say(f"[gang] {plan.gang_members} members, N={shape.nodes} P={shape.pods}")
            results.setdefault("gangs", []).append(gang_bench(shape, members=plan.gang_members,
                                                              rounds=plan.gang_rounds))
    profiler = None
    connector = aiohttp.TCPConnector(limit=64)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
        for cluster_plan in plan.clusters:
            if cluster_plan.name not in args.selected:
                continue
            if args.profile:
                profiler = Profiler(output_dir=BENCH_DIR / "profiles", fmt=args.profile_format,
                                    native=args.profile_native,
                                    label=f"{cluster_plan.name}-{time.strftime('%Y%m%d-%H%M%S')}")
            t0 = time.monotonic()
            if cluster_plan.compare_with_nvidia:   # two clusters, one figure: results["mixed"]
                if "filter" in args.phases:
                    results["mixed"] = await run_mixed(cluster_plan, session=session,
                                                       workdir=workdir / cluster_plan.name, profiler=profiler,
                                                       profile_startup=args.profile_startup,
                                                       scheduler_args=tuple(args.scheduler_arg),
                                                       scheduler_env=args.scheduler_env_map, say=_on_progress)
                    results["mixed"]["seconds"] = time.monotonic() - t0
                continue
            result = await run_cluster(cluster_plan, session=session, workdir=workdir / cluster_plan.name,
                                       phases=args.phases, profiler=profiler,
                                       profile_startup=args.profile_startup,
                                       scheduler_args=tuple(args.scheduler_arg),
                                       scheduler_env=args.scheduler_env_map, say=_on_progress)
            result["seconds"] = time.monotonic() - t0
            results["clusters"].append(result)
    if profiler is not None:
        results["profiles"] = [str(p) for p in profiler.outputs]
    return results


def _on_progress(text: str) -> None:
    _say(text)
    if " pid " in text and "ready" in text:
        pid = text.split(" pid ")[1].split()[0]
        _say(f"    profile it by hand: {attach_command(pid)}")


def _write(results: dict, args: argparse.Namespace) -> Path:
    out = args.out or (BENCH_DIR / ("results-quick.json" if args.quick else "results.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY) + b"\n")
    return out


def _show_profiles(paths: list[Path], filter_results: dict | None = None) -> None:
    """Print where the time went; collapsed stacks of several stretches are merged first. With
    the results of a run of the filter phase alone, also its stages (bench/profiling.py)."""
    raw = [p for p in paths if p.suffix == ".txt" and p.exists()]
    for path in paths:
        if path not in raw:
            _say(f"profile: {path}")
    if not raw:
        return
    merged = raw[0] if len(raw) == 1 else merge_collapsed(raw, raw[0].with_name(
        raw[0].name.rsplit("-run", 1)[0] + "-merged.txt"))
    _say(f"profile (collapsed stacks, for speedscope or flamegraph.pl): {merged}")
    sys.stdout.write("\n" + summarize_collapsed(merged) + "\n")
    rows = [r for c in (filter_results or {}).get("clusters", []) for r in c.get("filter", [])]
    if rows:
        cpu_ms = sum(r["server_cpu_ms"] * r["n"] for r in rows) / sum(r["n"] for r in rows)
        sys.stdout.write("\n" + render_filter_stages(merged, cpu_ms) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="hami-bench-"))
    _say(f"logs in {workdir}")
    started = time.monotonic()
    try:
        results = asyncio.run(run(args, workdir))
    except BenchError as exc:
        _say(f"benchmark failed: {exc}\nlogs kept in {workdir}")
        return 1
    results["seconds"] = time.monotonic() - started
    out = _write(results, args)
    sys.stdout.write("\n".join(report.render_header(results) + report.render_tables(results)) + "\n")
    _say(f"results in {out.relative_to(REPO_ROOT) if out.is_relative_to(REPO_ROOT) else out} "
         f"({results['seconds']:.0f} s)")
    full_run = not (args.quick or args.only or args.profile or args.no_docs or len(args.phases) != len(PHASES)
                    or args.scheduler_arg or args.scheduler_env)
    if full_run:
        plot_path = report.plot(results)
        report.update_docs(results, plot_path=plot_path)
        _say(f"updated {report.DOCS.relative_to(REPO_ROOT)}" + (f" and {plot_path.name}" if plot_path else
                                                                 " (matplotlib missing: no plot)"))
    _show_profiles([Path(p) for p in results.get("profiles", [])], results if args.phases == ("filter",) else None)
    if not args.keep_logs:
        for log in sorted(workdir.rglob("*")):
            if log.is_file():
                log.unlink()
        for folder in sorted(workdir.rglob("*"), reverse=True):
            folder.rmdir()
        workdir.rmdir()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
