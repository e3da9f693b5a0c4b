"""``hami-scheduler``: upstream's scheduler flags (plus ``--webhook-bind-address``, ours), and the
``simulate``, ``defrag`` and ``version`` commands.

A bad flag, a bad value or an unreadable file is reported in one line and exit code 2; nobody
configuring a scheduler should have to read a traceback to find a typo.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import math
import re
import signal
import sys

from hami_py import __version__
from hami_py.app import Options, SchedulerApp, split_host_port
from hami_py.cliargs import EXIT_USAGE, OneLineParser, UsageError, check_gpu_policy, check_node_policy
from hami_py.config import ConfigError, DeviceConfig, load_device_config
from hami_py.devices.codec import parse_go_bool
from hami_py.devices.registry import FamilySwitches, build_vendors
from hami_py.k8s.budget import resolve_budget
from hami_py.k8s.event_parking import DEFAULT_WINDOW_S, FILTERING_SUCCEED_MODES, UNBOUND
from hami_py.http.tls import TLSConfigError
from hami_py.k8s.leader import check_leader_options, leader_identity
from hami_py.logs import configure_logging
from hami_py.scheduling.decision.policies import GPU_POLICY_TOKENS, NODE_POLICIES, normal_gpu_policy
from hami_py.scheduling.verbs.prioritize import FILTER_MODES

_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|us|µs|ns|h|m|s)")
_DURATION_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def _duration(text: str) -> float:
    """Go-style durations as upstream's flags take them: 5m, 28s, 1h30m, 500ms, or plain seconds.
    Never negative, NaN or infinite: ``--node-lock-timeout nan`` would make every lock look expired."""
    s = text.strip()
    if re.fullmatch(r"\d+(?:\.\d*)?|\.\d+", s):
        total = float(s)
    elif s and re.fullmatch(f"(?:{_DURATION.pattern})+", s):
        total = sum(float(num) * _DURATION_UNITS[unit] for num, unit in _DURATION.findall(s))
    else:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r} (e.g. 5m, 28s, 1h30m, 500ms)")
    if not math.isfinite(total):
        raise argparse.ArgumentTypeError(f"invalid duration {text!r} (too large)")
    return total


def _bool(text: str) -> bool:
    value = parse_go_bool(text)   # Go's strconv.ParseBool spellings, as upstream's flags take
    if value is None:
        raise argparse.ArgumentTypeError(f"invalid boolean {text!r}")
    return value


def _selector(text: str) -> dict[str, str]:
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        k, sep, v = part.partition("=")
        if not sep or not k:
            raise argparse.ArgumentTypeError(f"invalid label selector entry {part!r} (want key=value)")
        out[k.strip()] = v.strip()
    return out


def _address(text: str) -> str:
    try:
        split_host_port(text, default_host="0.0.0.0")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _optional_address(text: str) -> str:
    return _address(text) if text else text


def check_refit_identity(ns: argparse.Namespace) -> None:
    """HAMi after v2.10 refuses to start without the device plugin's ServiceAccount (the only
    caller /refit accepts): an unconfigured identity would fail every refit silently while the
    scheduler looked healthy. Its chart passes both flags with --extender-bind, so the newest
    layout (--extender-bind given) needs them here too; v2.10's argument lists, which have none
    of the three, still start, with /refit answering that it is not configured. One of the two
    without the other is a mistake in any layout."""
    namespace, account = ns.device_plugin_namespace, ns.device_plugin_service_account
    if bool(namespace) != bool(account):
        raise UsageError("--device-plugin-namespace and --device-plugin-service-account must be given together "
                         f"(they name the ServiceAccount /refit accepts; got {namespace!r} and {account!r})")
    if ns.extender_bind and not namespace:
        raise UsageError("--extender-bind (HAMi's layout after v2.10) needs --device-plugin-namespace and "
                         "--device-plugin-service-account: they name the only ServiceAccount whose token /refit "
                         "accepts")


# The commands main() hands over to, as --help names them above the scheduler's flags.
COMMANDS = {
    "simulate": "place a workload on a described cluster with the real scheduler; no cluster needed",
    "defrag": "plan the fewest pod moves that make room for pending device pods, or free whole devices",
    "version": "print the version",
}


def _help_top() -> str:
    width = max(map(len, COMMANDS))
    return "\n".join([
        "commands:",
        *(f"  {name:<{width}}  {text}" for name, text in COMMANDS.items()),
        "",
        "HAMi-compatible scheduler extender for shared GPUs: without a command, it runs with the flags",
        "below. hami-scheduler COMMAND --help shows a command's own flags.",
    ])


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="hami-scheduler", usage="%(prog)s [flags]\n       %(prog)s {" + ",".join(COMMANDS)
                      + "} [args]", description=_help_top(), formatter_class=argparse.RawDescriptionHelpFormatter)
    flag = p.add_argument
    flag("--http_bind", default="127.0.0.1:8080", type=_address,
         help="the cluster-facing listener: /webhook, /refit, /healthz, /readyz (and, without "
              "--extender-bind, /filter and /bind too, as HAMi v2.10 serves them)")
    flag("--extender-bind", default=None, type=_optional_address,
         help="the extender's own listener (/filter, /bind, /prioritize, /preempt), kept on loopback for the "
              "kube-scheduler beside it, as HAMi after v2.10 (its default there: 127.0.0.1:9444); absent or "
              "empty: they are served on --http_bind, as HAMi v2.10 serves them")
    flag("--cert_file", default="", help="TLS certificate (TLS when both cert and key are set)")
    flag("--key_file", default="", help="TLS private key")
    flag("--webhook-bind-address", default="", type=_optional_address,
         help="serve /webhook (and /healthz, /readyz) on this address, with the TLS pair, and no longer "
              "on --http_bind (not an upstream flag; empty: /webhook on --http_bind, as upstream)")
    flag("--scheduler-name", default="", help="scheduler name the webhook writes into pods")
    flag("--node-scheduler-policy", default="binpack",
         help="default node policy: binpack, spread or fragmentation-aware")
    flag("--gpu-scheduler-policy", default="spread",
         help="default device policy: binpack, spread, fragmentation-aware, or a chain such as numa,binpack")
    flag("--metrics-bind-address", default=":9395", type=_address, help="metrics server address")
    flag("--node-label-selector", default={}, type=_selector, help="k=v,k2=v2: only nodes with these labels")
    flag("--kube-qps", default=None, type=float,
         help="API client queries per second (neither this nor --kube-burst given: 600, 100 pods/s)")
    flag("--kube-burst", default=None, type=int, help="API client burst (neither flag given: 1200)")
    flag("--kube-timeout", default=0, type=int, help="API client timeout in seconds (0: none)")
    flag("--profiling", default=False, type=_bool, nargs="?", const=True,
         help="serve the profiling endpoints (/debug/pprof/: task stacks, a CPU profile, heap counts) on "
              "--profiling-bind-address")
    flag("--profiling-bind-address", default="127.0.0.1:6060", type=_address,
         help="the profiling listener (plain HTTP; keep it on loopback)")
    flag("--device-plugin-namespace", default="",
         help="namespace of the device plugin's ServiceAccount, the only caller /refit accepts")
    flag("--device-plugin-service-account", default="",
         help="name of the device plugin's ServiceAccount, the only caller /refit accepts")
    flag("--node-lock-timeout", default=300.0, type=_duration, help="node lock expiry (Go duration)")
    flag("--node-lock-retry-timeout", default=28.0, type=_duration, help="PodGroup lock retry budget")
    flag("--node-lock-wait", default=10.0, type=_duration,
         help="ours: how long a bind waits for a node lock another pod's allocation holds (0: fail at once)")
    flag("--node-lock-stuck-after", default=30.0, type=_duration,
         help="ours: a node lock held this long by a bound pod whose allocation is unfinished is stuck: "
              "filters pass the node over, binds onto it fail at once (0: never)")
    flag("--filtering-succeed-events", default=UNBOUND, choices=list(FILTERING_SUCCEED_MODES),
         help="ours: unbound = a FilteringSucceed Event only for a pod whose bind fails or does not come "
              "within --filtering-succeed-window (a bound pod gets one Event, BindingSucceed); "
              "always = every successful filter writes one at once (upstream's)")
    flag("--filtering-succeed-window", default=DEFAULT_WINDOW_S, type=_duration,
         help="ours: how long a successful filter's Event waits for the pod's bind (Go duration; 0: not at all)")
    flag("--device-preemption", default=False, type=_bool, nargs="?", const=True,
         help="ours: a pod with a priority that fits nowhere evicts the fewest lower-priority device pods "
              "of one node that make room, through the Eviction API (off by default)")
    flag("--device-preemption-hold", default=120.0, type=_duration,
         help="ours: how long the room freed by a device preemption is held for its pod (Go duration)")
    flag("--force-overwrite-default-scheduler", default=True, type=_bool, nargs="?", const=True)
    flag("--leader-elect", default=False, type=_bool, nargs="?", const=True)
    flag("--leader-elect-resource-name", default="")
    flag("--leader-elect-resource-namespace", default="")
    flag("--legacy-metrics", default=False, type=_bool, nargs="?", const=True)
    flag("--device-config-file", default="", help="device configuration YAML (upstream's schema)")
    # Upstream's Hygon resource-name flags (v2.10's --dcu-*, its successor's --hcu-*): accepted,
    # and, as upstream, without effect: upstream overwrites them with the device config's hygon
    # section at start-up, so a chart or script passing them gets exactly what it got there.
    for generation, word, default in (("hcu", "count", "hygon.com/hcunum"), ("hcu", "memory", "hygon.com/hcumem"),
                                      ("hcu", "cores", "hygon.com/hcucores"), ("dcu", "count", "hygon.com/dcunum"),
                                      ("dcu", "memory", "hygon.com/dcumem"), ("dcu", "cores", "hygon.com/dcucores")):
        flag(f"--{generation}-{'name' if word == 'count' else word}", default=default,
             help=f"upstream's {generation.upper()} {word} resource name; accepted without effect, as upstream: "
                  "the device config's hygon section names the Hygon resources (docs/devices/hygon.md)")
    flag("--enable-ascend", default=False, type=_bool, nargs="?", const=True,
         help="schedule the Ascend NPUs of the device config's vnpus section")
    flag("--enable-iluvatar", default=False, type=_bool, nargs="?", const=True,
         help="schedule the Iluvatar GPUs of the device config's iluvatars section")
    flag("--kubeconfig", default=None, help="kubeconfig file (else $KUBECONFIG, else in-cluster)")
    flag("--debug", default=False, type=_bool, nargs="?", const=True, help="debug logging")
    flag("-v", "--v", dest="verbosity", default=0, type=int, help="log verbosity (klog style)")
    flag("--log-format", default="json", choices=["json", "console"], help="log output format")
    flag("--max-request-bytes", default=1 << 20, type=int, help="largest extender request body")
    flag("--filter-mode", default="best", choices=list(FILTER_MODES),
         help="ours: best = /filter answers the one node our policy prefers and reserves it (upstream's); "
              "all = every node where the pod fits, scored by /prioritize, fitted again and reserved at "
              "/bind on the node kube-scheduler chose")
    return p


def options_from_args(ns: argparse.Namespace) -> Options:
    qps, burst, source = resolve_budget(ns.kube_qps, ns.kube_burst)
    return Options(
        http_bind=ns.http_bind, webhook_bind_address=ns.webhook_bind_address,
        extender_bind=ns.extender_bind or "", profiling_bind_address=ns.profiling_bind_address,
        device_plugin_namespace=ns.device_plugin_namespace,
        device_plugin_service_account=ns.device_plugin_service_account,
        cert_file=ns.cert_file, key_file=ns.key_file,
        scheduler_name=ns.scheduler_name, node_scheduler_policy=ns.node_scheduler_policy,
        gpu_scheduler_policy=ns.gpu_scheduler_policy, metrics_bind_address=ns.metrics_bind_address,
        node_label_selector=ns.node_label_selector, kube_qps=qps, kube_burst=burst, kube_budget_source=source,
        kube_timeout=ns.kube_timeout, profiling=ns.profiling, node_lock_timeout_s=ns.node_lock_timeout,
        node_lock_retry_timeout_s=ns.node_lock_retry_timeout, node_lock_wait_s=ns.node_lock_wait,
        node_lock_stuck_after_s=ns.node_lock_stuck_after,
        filtering_succeed_events=ns.filtering_succeed_events,
        filtering_succeed_window_s=ns.filtering_succeed_window,
        device_preemption=ns.device_preemption, device_preemption_hold_s=ns.device_preemption_hold,
        force_overwrite_default_scheduler=ns.force_overwrite_default_scheduler,
        leader_elect=ns.leader_elect, leader_elect_resource_name=ns.leader_elect_resource_name,
        leader_elect_resource_namespace=ns.leader_elect_resource_namespace,
        legacy_metrics=ns.legacy_metrics, device_config_file=ns.device_config_file,
        enable_ascend=ns.enable_ascend, enable_iluvatar=ns.enable_iluvatar,
        kubeconfig=ns.kubeconfig, debug=ns.debug, verbosity=ns.verbosity,
        body_limit=ns.max_request_bytes,
        filter_mode=ns.filter_mode,
    )


def _fail(message: str) -> int:
    sys.stderr.write(f"hami-scheduler: {message}\n")
    return EXIT_USAGE


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "version":
        print(__version__)  # noqa: T201 - the command's output
        return 0
    if argv and argv[0] == "simulate":
        from hami_py.simulate.cli import main as simulate_main
        return simulate_main(argv[1:])
    if argv and argv[0] == "defrag":
        from hami_py.defrag.cli import main as defrag_main
        return defrag_main(argv[1:])
    try:
        ns = build_parser().parse_args(argv)
        # Trimmed, each comma token too (HAMi #2854: " binpack " is binpack, not spread).
        ns.node_scheduler_policy = ns.node_scheduler_policy.strip()
        ns.gpu_scheduler_policy = normal_gpu_policy(ns.gpu_scheduler_policy)
        check_node_policy(ns.node_scheduler_policy, NODE_POLICIES)
        check_gpu_policy(ns.gpu_scheduler_policy, GPU_POLICY_TOKENS, chain=True, first=NODE_POLICIES)
        if bool(ns.cert_file) != bool(ns.key_file):
            raise UsageError("--cert_file and --key_file must be given together")
        check_refit_identity(ns)
        if ns.webhook_bind_address and not ns.cert_file:
            raise UsageError("--webhook-bind-address needs --cert_file and --key_file: "
                             "the API server calls webhooks over HTTPS only")
        try:
            check_leader_options(leader_elect=ns.leader_elect, name=ns.leader_elect_resource_name,
                                 namespace=ns.leader_elect_resource_namespace, identity=leader_identity())
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        for path in (ns.cert_file, ns.key_file):
            if path:
                open(path, "rb").close()
        device_config = load_device_config(ns.device_config_file) if ns.device_config_file else DeviceConfig.default()
    except UsageError as exc:
        return _fail(str(exc))
    except ConfigError as exc:
        return _fail(str(exc))
    except OSError as exc:
        return _fail(f"cannot read {exc.filename}: {exc.strerror}")
    level = logging.DEBUG if ns.debug or ns.verbosity >= 4 else logging.INFO
    configure_logging(json=ns.log_format == "json", level=level)
    options = options_from_args(ns)
    try:
        # Each family reads its own config section here, before any connection is made: a bad
        # key stops the process with the file's line, as a malformed file does.
        vendors = build_vendors(device_config, FamilySwitches(enable_ascend=options.enable_ascend,
                                                              enable_iluvatar=options.enable_iluvatar))
    except ConfigError as exc:
        return _fail(str(exc))
    return asyncio.run(serve(options, device_config, vendors=vendors))


async def serve(options: Options, device_config: DeviceConfig, *, vendors: dict | None = None) -> int:
    from hami_py.k8s.client import load_configuration
    try:
        configuration = await load_configuration(options.kubeconfig)
    except Exception as exc:  # noqa: BLE001 - whatever the loader raises, say it in one line
        return _fail(f"cannot load cluster configuration: {exc}")
    app = SchedulerApp(options, device_config=device_config, configuration=configuration, vendors=vendors)
    try:
        await app.start()
    except TLSConfigError as exc:
        await app.stop()
        return _fail(str(exc))
    except OSError as exc:
        await app.stop()
        return _fail(f"cannot listen: {exc}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await app.stop()
    return 0
