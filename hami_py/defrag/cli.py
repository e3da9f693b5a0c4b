"""``hami-scheduler defrag``: plan the fewest moves that make room (or free whole devices), print
the plan, and with ``--execute`` carry it out.

Input problems (a flag, a file, a field) are one line on stderr and exit status 2, before any
scheduler starts. A plan that reaches its goal (or a dry run of one) is exit status 0; one that
does not is 1, with the reason in the report. Without ``--execute`` nothing outside this process
is changed: a live cluster is only listed.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys

import structlog

from hami_py.cliargs import EXIT_INTERRUPTED, EXIT_USAGE, OneLineParser, UsageError, check_gpu_policy, check_node_policy
from hami_py.config import ConfigError, DeviceConfig, load_device_config
from hami_py.defrag.planner import Planner
from hami_py.defrag.plan import Plan
from hami_py.defrag.report import Header, render_html, render_json, render_table
from hami_py.defrag.world import (
    DEFAULT_SCHEDULER_NAME, World, list_live, live_client, live_source, load_snapshot, open_world,
    snapshot_from_objects, snapshot_live,
)
from hami_py.devices.registry import EVERY_FAMILY, build_vendors
from hami_py.logs import configure_logging
from hami_py.offline.remote_gpus import with_remote_gpus, with_remote_gpus_listed
from hami_py.offline.source import InputError, load_documents
from hami_py.scheduling.eviction.defrag_holds import MAX_HOLD_S
from hami_py.scheduling.decision.policies import GPU_POLICY_TOKENS, NODE_POLICIES

EXIT_OK = 0
EXIT_NOT_SATISFIED = 1
DEFAULT_HTML_FILE = "defrag-report.html"

log = structlog.get_logger("hami_py.defrag")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="hami-scheduler defrag",
                      description="Plan the fewest pod moves that make room for pending device pods, "
                                  "or free whole devices; a dry run unless --execute.")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--cluster", help="a dump: kubectl get nodes,pods,pdb -A -o yaml (or a simulator cluster file)")
    source.add_argument("--kubeconfig", help="a live cluster, listed read-only (changed only with --execute)")
    p.add_argument("--context", default=None, help="the kubeconfig context (with --kubeconfig)")
    p.add_argument("--free", type=_positive, default=None, metavar="N",
                   help="free N whole devices instead of making room for pending pods")
    p.add_argument("--model", default=None, help="with --free: devices whose type contains this (e.g. A100)")
    p.add_argument("--across-nodes", action="store_true", help="with --free: the devices may be on several nodes")
    p.add_argument("--max-priority", type=_integer, default=0,
                   help="with --free: move only pods of at most this priority (default 0)")
    p.add_argument("--node-scheduler-policy", default="binpack", help="default node policy, as the scheduler's")
    p.add_argument("--gpu-scheduler-policy", default="spread", help="default device policy, as the scheduler's")
    p.add_argument("--device-config-file", default="", help="device configuration YAML (upstream's schema)")
    p.add_argument("--scheduler-name", default=DEFAULT_SCHEDULER_NAME,
                   help="pending pods of this schedulerName are made room for")
    p.add_argument("--namespace", action="append", default=None, metavar="NS",
                   help="make room only for the pending pods of this namespace (repeatable; default all)")
    p.add_argument("--max-moves", type=_positive, default=None, metavar="N", help="at most N moves in the plan")
    p.add_argument("--output", default="table", choices=("table", "json", "html"), help="report format")
    p.add_argument("--report-file", default=None,
                   help=f"where --output html writes (default {DEFAULT_HTML_FILE}; - for stdout)")
    p.add_argument("--execute", action="store_true", help="carry the plan out (default: a dry run)")
    p.add_argument("--eviction-rate", type=float, default=2.0, metavar="PER_S",
                   help="with --execute: at most this many evictions a second (default 2)")
    p.add_argument("--hold-seconds", type=float, default=300.0, metavar="S",
                   help="with --execute: how long the freed devices are held for their pods (default 300)")
    return p


def check_flags(ns: argparse.Namespace) -> None:
    check_node_policy(ns.node_scheduler_policy, NODE_POLICIES)
    check_gpu_policy(ns.gpu_scheduler_policy, GPU_POLICY_TOKENS, chain=True, first=NODE_POLICIES)
    if ns.free is not None and ns.namespace:
        raise UsageError("--namespace chooses pending pods: it does not go with --free")
    if ns.free is None and (ns.model is not None or ns.across_nodes):
        raise UsageError("--model and --across-nodes go with --free")
    if ns.context is not None and not ns.kubeconfig:
        raise UsageError("--context goes with --kubeconfig")
    if ns.report_file is not None and ns.output != "html":
        raise UsageError("--report-file goes with --output html")
    if ns.execute and not ns.kubeconfig:
        raise UsageError("--execute needs --kubeconfig: a dump cannot be changed")
    if not ns.eviction_rate > 0:
        raise UsageError(f"--eviction-rate must be positive, not {ns.eviction_rate}")
    if not 0 < ns.hold_seconds <= MAX_HOLD_S:
        raise UsageError(f"--hold-seconds must be above 0 and at most {MAX_HOLD_S:g} (the scheduler's cap), "
                         f"not {ns.hold_seconds}")


def _fail(message: str, code: int = EXIT_USAGE) -> int:
    sys.stderr.write(f"hami-scheduler defrag: {message}\n")
    return code


def main(argv: list[str] | None = None) -> int:
    try:
        ns = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
        check_flags(ns)
        device_config = load_device_config(ns.device_config_file) if ns.device_config_file else DeviceConfig.default()
        configure_logging(json=False, level=logging.WARNING)   # before the vendors, which may log
        snapshot = vendors = None       # a live cluster's: once listed (_run)
        if ns.cluster:
            # A dump with lupine servers needs the remote-GPU family on (off in the chart's
            # default); no server's /metrics is read (the plan is the books'). Parsed once.
            documents = load_documents(ns.cluster)
            device_config, remote_note = with_remote_gpus(documents, device_config)
            vendors = build_vendors(device_config, EVERY_FAMILY)
            snapshot = load_snapshot(ns.cluster, vendors=vendors, scheduler_name=ns.scheduler_name,
                                     documents=documents)
            if remote_note:
                snapshot.notes.insert(0, remote_note)
    except (UsageError, ConfigError, InputError) as exc:
        return _fail(str(exc))
    try:
        return asyncio.run(_run(ns, snapshot=snapshot, vendors=vendors, device_config=device_config))
    except (InputError, UsageError, ConfigError) as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:
        return _fail("interrupted", EXIT_INTERRUPTED)
    except (TimeoutError, OSError) as exc:
        return _fail(f"cannot plan: {exc}", EXIT_NOT_SATISFIED)


async def _run(ns: argparse.Namespace, *, snapshot, vendors, device_config: DeviceConfig) -> int:
    if snapshot is None:
        try:
            objects = await list_live(kubeconfig=ns.kubeconfig, context=ns.context)
        except Exception as exc:  # noqa: BLE001 - a kubeconfig or API failure, said in one line
            raise UsageError(f"cannot list the cluster of {ns.kubeconfig}: {' '.join(str(exc).split())}") from None
        # As for a dump: lupine servers in the cluster turn the remote-GPU family on, and no
        # server's /metrics is read. Decided once: a replan (--execute) uses the same families.
        device_config, remote_note = with_remote_gpus_listed(objects, device_config)
        vendors = build_vendors(device_config, EVERY_FAMILY)
        snapshot = snapshot_from_objects(objects, source=live_source(ns.kubeconfig, ns.context), vendors=vendors,
                                         scheduler_name=ns.scheduler_name)
        if remote_note:
            snapshot.notes.insert(0, remote_note)
    async with open_world(snapshot, device_config=device_config, node_policy=ns.node_scheduler_policy,
                          gpu_policy=ns.gpu_scheduler_policy) as world:
        plan = make_plan(world, ns)
        header = Header(source=snapshot.cluster.path, cluster=snapshot.cluster.describe(),
                        node_policy=ns.node_scheduler_policy, gpu_policy=ns.gpu_scheduler_policy,
                        notes=list(snapshot.notes), dry_run=not ns.execute)
    execution = None
    if ns.execute and plan.satisfied and plan.moves:
        execution = await _execute(plan, ns, vendors=vendors, device_config=device_config)
    code = _emit(plan, header, output=ns.output, report_file=ns.report_file, execution=execution)
    if code != EXIT_OK:
        return code
    reached = plan.satisfied and (execution is None or execution.complete)
    return EXIT_OK if reached else EXIT_NOT_SATISFIED


def make_plan(world: World, ns: argparse.Namespace, *, exclude=frozenset()) -> Plan:
    planner = Planner(world, max_moves=ns.max_moves, exclude=exclude)
    if ns.free is not None:
        return planner.free_devices(ns.free, model=ns.model, same_node=not ns.across_nodes,
                                    max_priority=ns.max_priority)
    pending = world.pending
    if ns.namespace:
        pending = [p for p in pending if (p.get("metadata") or {}).get("namespace", "default") in ns.namespace]
    return planner.make_room(pending)


async def _execute(plan: Plan, ns: argparse.Namespace, *, vendors, device_config: DeviceConfig):
    """Carry the plan out (defrag/execute.py). A refused eviction replans from a fresh snapshot
    of the cluster, without the refused pods."""
    from hami_py.defrag.execute import execute_plan

    async def replan(refused: set[str]) -> Plan | None:
        snapshot = await snapshot_live(kubeconfig=ns.kubeconfig, context=ns.context, vendors=vendors,
                                       scheduler_name=ns.scheduler_name)
        async with open_world(snapshot, device_config=device_config, node_policy=ns.node_scheduler_policy,
                              gpu_policy=ns.gpu_scheduler_policy) as fresh:
            again = make_plan(fresh, ns, exclude=refused)
        return again if again.satisfied else None

    client = await live_client(kubeconfig=ns.kubeconfig, context=ns.context)
    try:
        execution = await execute_plan(plan=plan, client=client, replan=replan, rate_per_s=ns.eviction_rate,
                                       hold_s=ns.hold_seconds)
    finally:
        await client.close()
    log.info("defrag executed", execution=execution.as_json())
    return execution


def _emit(plan: Plan, header: Header, *, output: str, report_file: str | None, execution=None) -> int:
    if output == "json":
        sys.stdout.write(render_json(plan, execution=execution.as_json() if execution is not None else None))
        return EXIT_OK
    if output == "table":
        sys.stdout.write(render_table(plan, header))
        if execution is not None:
            sys.stdout.write(f"\nExecuted    {'complete' if execution.complete else 'NOT complete'}: "
                             f"{len(execution.evicted)} evicted, {len(execution.refused)} refused, "
                             f"{execution.plans} plan(s)"
                             + (f" ({execution.reason})" if execution.reason else "") + "\n")
        return EXIT_OK
    html = render_html(plan, header)
    target = report_file or DEFAULT_HTML_FILE
    if target == "-":
        sys.stdout.write(html)
        return EXIT_OK
    try:
        with open(target, "w", encoding="utf-8") as handle:
            handle.write(html)
    except OSError as exc:
        return _fail(f"cannot write {target}: {exc.strerror or exc}", EXIT_NOT_SATISFIED)
    sys.stdout.write(f"wrote {target}\n")
    return EXIT_OK
