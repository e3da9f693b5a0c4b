"""``hami-scheduler simulate``: parse the flags, load both files, run the scenarios, print a report.

Input problems (a flag, a file, a field) are one line on stderr naming the file, line and field,
and exit status 2, before any scheduler starts. A scheduler that fails mid-run is exit status 1.
"""
from __future__ import annotations

import argparse
import logging
import sys

from hami_py.cliargs import EXIT_INTERRUPTED, EXIT_USAGE, OneLineParser, UsageError, check_gpu_policy, check_node_policy
from hami_py.config import ConfigError, DeviceConfig, load_device_config
from hami_py.devices.registry import EVERY_FAMILY, build_vendors
from hami_py.logs import configure_logging
from hami_py.offline.cluster import Cluster, load_cluster
from hami_py.offline.remote_gpus import with_remote_gpus
from hami_py.offline.source import InputError, load_documents
from hami_py.scheduling.decision.policies import BINPACK, FRAGMENTATION_AWARE, SPREAD
from hami_py.simulate.progress import ProgressBar
from hami_py.simulate.report_html import render_html
from hami_py.simulate.report_json import render_json
from hami_py.simulate.report_text import render_table
from hami_py.simulate.results import Report, ScenarioResult
from hami_py.simulate.runner import Scenario, run_scenarios
from hami_py.simulate.scenario_run import SimulationError
from hami_py.simulate.workload import POLICIES, Workload, load_workload

EXIT_FAILED = 1
DEFAULT_HTML_FILE = "simulation-report.html"


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="hami-scheduler simulate",
                description="Place a workload on a described cluster with the real scheduler; no cluster needed.")
    p.add_argument("--cluster", required=True, help="cluster file: simulator nodes list or kubectl get nodes -o yaml")
    p.add_argument("--workload", required=True, help="workload file: simulator pods list or Pod manifests")
    # Checked after parsing (check_node_policy, check_gpu_policy), so the error says what to choose
    # in the words the scheduler and defrag use.
    policies = "{" + ",".join(POLICIES) + "}"
    p.add_argument("--node-scheduler-policy", default="binpack", metavar=policies, help="default node policy")
    p.add_argument("--gpu-scheduler-policy", default="spread", metavar=policies, help="default GPU policy")
    p.add_argument("--compare-policies", action="store_true",
                   help="also run every node x GPU policy pair and compare them")
    p.add_argument("--defrag-every", type=int, default=0, metavar="K",
                   help="run the defragmenter every K arrivals: pending pods get room by moving the fewest pods")
    p.add_argument("--output", default="table", choices=("table", "json", "html"), help="report format")
    p.add_argument("--report-file", default=None,
                   help=f"where --output html writes (default {DEFAULT_HTML_FILE}; - for stdout)")
    p.add_argument("--device-config-file", default="", help="device configuration YAML (upstream's schema)")
    p.add_argument("--detail", action="store_true", help="per-GPU and per-pod tables even for large runs")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


# --compare-policies: upstream's four pairs, then fragmentation-aware for both (its device order
# and its node score are one design; mixing it with binpack or spread is for a pod annotation).
CLASSIC_POLICIES = (BINPACK, SPREAD)


def compared_scenarios(chosen: Scenario) -> list[Scenario]:
    """The scenarios --compare-policies runs, each with the chosen --defrag-every; the chosen
    pair last when it is none of them (a mixed pair such as binpack/fragmentation-aware)."""
    every = chosen.defrag_every
    scenarios = [Scenario(n, g, every) for n in CLASSIC_POLICIES for g in CLASSIC_POLICIES]
    scenarios.append(Scenario(FRAGMENTATION_AWARE, FRAGMENTATION_AWARE, every))
    if chosen not in scenarios:
        scenarios.append(chosen)
    return scenarios


def _fail(message: str, code: int = EXIT_USAGE) -> int:
    sys.stderr.write(f"hami-scheduler simulate: {message}\n")
    return code


def main(argv: list[str] | None = None) -> int:
    try:
        ns = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
        check_node_policy(ns.node_scheduler_policy, POLICIES)
        check_gpu_policy(ns.gpu_scheduler_policy, POLICIES, chain=False, first=POLICIES)
        if ns.defrag_every < 0:
            raise UsageError(f"--defrag-every must be 0 (never) or a number of arrivals, not {ns.defrag_every}")
        if ns.report_file is not None and ns.output != "html":
            raise UsageError("--report-file goes with --output html")
        device_config = load_device_config(ns.device_config_file) if ns.device_config_file else DeviceConfig.default()
        # A cluster with lupine servers needs the remote-GPU family on (off in the chart's
        # default): decided on the file's documents, which the loader then reads (parsed once).
        documents = load_documents(ns.cluster)
        device_config, remote_note = with_remote_gpus(documents, device_config)
        configure_logging(json=False, level=logging.WARNING)   # before the vendors, which may log
        vendors = build_vendors(device_config, EVERY_FAMILY)
        cluster = load_cluster(ns.cluster, vendors=vendors, documents=documents)
        if remote_note:
            cluster.notes.insert(0, remote_note)
        workload = load_workload(ns.workload, vendors=vendors, device_config=device_config)
    except (UsageError, ConfigError, InputError) as exc:
        return _fail(str(exc))
    chosen = Scenario(ns.node_scheduler_policy, ns.gpu_scheduler_policy, ns.defrag_every)
    scenarios = compared_scenarios(chosen) if ns.compare_policies else [chosen]
    progress = ProgressBar(enabled=False if ns.no_progress else None)
    progress.start(f"{len(scenarios)} policy pairs" if len(scenarios) > 1 else chosen.label)
    try:
        results = run_scenarios(cluster=cluster, workload=workload, scenarios=scenarios,
                                device_config=device_config, progress=progress.update)
    except (SimulationError, TimeoutError, OSError) as exc:
        return _fail(f"the simulation failed: {exc}", EXIT_FAILED)
    except KeyboardInterrupt:
        return _fail("interrupted", EXIT_INTERRUPTED)
    finally:
        progress.finish()
    primary = results[scenarios.index(chosen)]
    report = build_report(cluster=cluster, workload=workload, primary=primary,
                          comparison=results if ns.compare_policies else [])
    return _emit(report, output=ns.output, report_file=ns.report_file, detail=ns.detail)


def build_report(*, cluster: Cluster, workload: Workload, primary: ScenarioResult,
                 comparison: list[ScenarioResult]) -> Report:
    templates = len(workload.templates)
    described = (f"{workload.total_pods} pods from {templates} template{'s' if templates != 1 else ''}, "
                 f"arriving {workload.order}"
                 + (f" (seed {workload.seed})" if workload.order == "shuffled" else ""))
    if any(t.lifetime for t in workload.templates):
        described += ", some with lifetimes"
    return Report(cluster_file=cluster.path, cluster=cluster.describe(), workload_file=workload.path,
                  workload=described, notes=[*cluster.notes, *workload.notes], primary=primary,
                  comparison=comparison)


def _emit(report: Report, *, output: str, report_file: str | None, detail: bool) -> int:
    if output == "json":
        sys.stdout.write(render_json(report))
        return 0
    if output == "table":
        sys.stdout.write(render_table(report, detail=detail))
        return 0
    html = render_html(report)
    target = report_file or DEFAULT_HTML_FILE
    if target == "-":
        sys.stdout.write(html)
        return 0
    try:
        with open(target, "w", encoding="utf-8") as handle:
            handle.write(html)
    except OSError as exc:
        return _fail(f"cannot write {target}: {exc.strerror or exc}", EXIT_FAILED)
    sys.stdout.write(f"wrote {target}\n")
    return 0
