"""hami-py runs under HAMi's own Helm chart: the extender container's command line, as rendered.

The argument lists below were written down by reading the chart's scheduler Deployment template
(``charts/hami/templates/scheduler/deployment.yaml``, container ``vgpu-scheduler-extender``) with
its default values (``schedulerName: hami-scheduler``, webhook on, leader election on, namespace
``hami-system``, ``scheduler.extender.extraArgs``), and with each value that changes the command
set: every combination of ``devices.ascend.enabled`` and ``devices.iluvatar.enabled``, the
webhook off, a node label selector with legacy metrics. The chart runs the command
``scheduler``; the rest is the arguments. No Helm, and nothing copied from the chart's files: only the rendered command lines.

Two chart generations: v2.10's (4707fb02), and the newest the code index holds (HAMi's main
branch up to 2026-10-11: #2882 adds the device plugin's ServiceAccount for /refit and moves the
listener to ``scheduler.service.httpTargetPort`` 9443 (#2208); #3039 adds ``--extender-bind`` on
loopback at ``scheduler.extenderPort`` 9444; #2905 passes ``scheduler.kubeQPS``, ``kubeBurst`` and
``kubeTimeout`` and #2944 ``scheduler.nodeLockRetryTimeout`` only when set (their defaults are
"", keeping the binary's); ``scheduler.nodeLockExpire`` stays an environment variable,
``HAMI_NODELOCK_EXPIRE``, which upstream's own flag default overrides and we ignore alike). The
final Deployment template of these was read from the reviews, digests and the chart's values
documentation only, so the newest list is also given without ``--extender-bind``, as #2882 left
it. The newest chart's device ConfigMap with default values is ``tests/fixtures/newest-chart-
device-config.yaml`` (rendered by hand the same way); its managedResources are written down below.
"""
from __future__ import annotations

import dataclasses
from importlib import resources
from pathlib import Path

import aiohttp
import pytest

from hami_py.cli import build_parser, options_from_args
from hami_py.config import DeviceConfig, load_device_config
from hami_py.devices.registry import FamilySwitches, build_vendors, managed_resource_names
from hami_py.embedded import embedded_options, running_scheduler
from hami_py.fakeapi.kubescheduler import ExtenderClient

# The command for each combination of the values that change it. The chart's defaults:
# webhook on (TLS on 443), scheduler.extender.extraArgs = [--debug, -v=4], no node label
# selector, legacyMetrics off. devices.ascend.enabled and devices.iluvatar.enabled are the only
# devices.*.enabled values the extender's command reads (the others change only the
# kube-scheduler's managedResources and the device plugins' DaemonSets).
_TLS = ["--http_bind=0.0.0.0:443", "--cert_file=/tls/tls.crt", "--key_file=/tls/tls.key"]
_PLAIN = ["--http_bind=0.0.0.0:80"]
_COMMON = [
    "--scheduler-name=hami-scheduler",
    "--metrics-bind-address=:9395",
    "--node-scheduler-policy=binpack",
    "--gpu-scheduler-policy=spread",
    "--force-overwrite-default-scheduler=true",
    "--device-config-file=/device-config.yaml",
    "--leader-elect=true",
    "--leader-elect-resource-name=hami-scheduler",
    "--leader-elect-resource-namespace=hami-system",
]
_EXTRA_ARGS = ["--debug", "-v=4"]


def _rendered(*, webhook: bool = True, ascend: bool = False, iluvatar: bool = False,
              selector: str = "", legacy_metrics: bool = False) -> list[str]:
    """The template's order: bind address, the fixed flags, the two family switches, the node
    label selector, legacy metrics, then extraArgs."""
    argv = (_TLS if webhook else _PLAIN) + _COMMON
    argv += ["--enable-ascend=true"] * ascend + ["--enable-iluvatar=true"] * iluvatar
    argv += [f"--node-label-selector={selector}"] * bool(selector) + ["--legacy-metrics=true"] * legacy_metrics
    return argv + _EXTRA_ARGS


CHART_RENDERINGS = {
    "default": _rendered(),
    "ascend": _rendered(ascend=True),
    "iluvatar": _rendered(iluvatar=True),
    "ascend+iluvatar": _rendered(ascend=True, iluvatar=True),
    "no-webhook": _rendered(webhook=False),
    "selector+legacy-metrics": _rendered(selector="gpu=on,zone=a", legacy_metrics=True),
}
# The newest chart: the listener on 9443 (TLS with the webhook's pair, or plain when the
# webhook is off), the extender on loopback 9444 (#3039), the device plugin's account (#2882).
_NEWEST_TLS = ["--http_bind=0.0.0.0:9443", "--cert_file=/tls/tls.crt", "--key_file=/tls/tls.key"]
_EXTENDER = ["--extender-bind=127.0.0.1:9444"]
_DEVICE_PLUGIN = ["--device-plugin-namespace=hami-system", "--device-plugin-service-account=hami-device-plugin"]


def _newest(*, webhook: bool = True, extender: bool = True, ascend: bool = False, iluvatar: bool = False,
            client: tuple[str, str, str] = ("", "", ""), retry: str = "", extra: tuple[str, ...] = ()) -> list[str]:
    """``client`` is (scheduler.kubeQPS, kubeBurst, kubeTimeout), ``retry`` scheduler.nodeLockRetryTimeout:
    each passed only when not empty, as the template does; ``extra`` is added to extraArgs."""
    argv = (_NEWEST_TLS if webhook else ["--http_bind=0.0.0.0:9443"]) + _EXTENDER * extender + _COMMON
    argv += _DEVICE_PLUGIN + ["--enable-ascend=true"] * ascend + ["--enable-iluvatar=true"] * iluvatar
    argv += [f"--{flag}={value}" for flag, value in zip(("kube-qps", "kube-burst", "kube-timeout"), client) if value]
    argv += [f"--node-lock-retry-timeout={retry}"] * bool(retry)
    return argv + _EXTRA_ARGS + list(extra)


NEWEST_RENDERINGS = {
    "newest": _newest(),
    "newest-ascend+iluvatar": _newest(ascend=True, iluvatar=True),
    "newest-no-webhook": _newest(webhook=False),
    "newest-before-extender-bind": _newest(extender=False),
    "newest-kube-client": _newest(client=("50", "100", "30")),
    "newest-fractional-qps": _newest(client=("7.5", "", "")),
    "newest-node-lock-retry": _newest(retry="45s"),
    "newest-node-lock-retry-off": _newest(retry="0"),
    # scheduler.profilingBindAddress is only read with --profiling, given through extraArgs
    "newest-profiling": _newest(extra=("--profiling=true", "--profiling-bind-address=127.0.0.1:6060")),
}
CHART_RENDERINGS.update(NEWEST_RENDERINGS)
CHART_DEFAULT = CHART_RENDERINGS["default"]
CHART_ASCEND_ILUVATAR = CHART_RENDERINGS["ascend+iluvatar"]


@pytest.mark.parametrize("argv", CHART_RENDERINGS.values(), ids=CHART_RENDERINGS.keys())
def test_every_argument_the_chart_renders_is_accepted(argv):
    options = options_from_args(build_parser().parse_args(argv))
    assert options.scheduler_name == "hami-scheduler" and options.leader_elect
    assert options.device_config_file == "/device-config.yaml"
    assert options.enable_ascend == ("--enable-ascend=true" in argv)
    assert options.enable_iluvatar == ("--enable-iluvatar=true" in argv)
    assert options.debug and options.verbosity == 4
    if argv in NEWEST_RENDERINGS.values():
        assert options.http_bind == "0.0.0.0:9443"
        assert options.extender_bind == ("127.0.0.1:9444" if "--extender-bind=127.0.0.1:9444" in argv else "")
        assert (options.device_plugin_namespace, options.device_plugin_service_account) == (
            "hami-system", "hami-device-plugin")
    else:
        assert options.http_bind == ("0.0.0.0:443" if "--cert_file=/tls/tls.crt" in argv else "0.0.0.0:80")
        assert not options.extender_bind and not options.device_plugin_namespace
    if "--legacy-metrics=true" in argv:
        assert options.legacy_metrics and options.node_label_selector == {"gpu": "on", "zone": "a"}
    # What the newest chart passes only when its values are set takes effect; unset, ours stay.
    given = dict(a.split("=", 1) if "=" in a else (a, "true") for a in argv if a.startswith("--"))
    assert (options.kube_qps, options.kube_burst, options.kube_timeout) == (
        (50.0, 100, 30) if "--kube-burst" in given else (7.5, 15, 0) if "--kube-qps" in given else (600.0, 1200, 0))
    assert options.node_lock_retry_timeout_s == {"45s": 45.0, "0": 0.0}.get(given.get("--node-lock-retry-timeout"), 28.0)
    assert options.profiling == ("--profiling" in given)
    assert options.profiling_bind_address == "127.0.0.1:6060"


def test_the_switches_bring_in_the_families_they_gate():
    options = options_from_args(build_parser().parse_args(CHART_ASCEND_ILUVATAR))
    switches = FamilySwitches(enable_ascend=options.enable_ascend, enable_iluvatar=options.enable_iluvatar)
    with_switches = build_vendors(DeviceConfig.default(), switches)
    without = build_vendors(DeviceConfig.default())
    gated = set(with_switches) - set(without)
    assert {"Ascend910B3", "MR-V100"} <= gated
    assert not any(key.startswith("Ascend") or key in ("MR-V100", "MR-V50", "BI-V150", "BI-V100") for key in without)


NEWEST_DEVICE_CONFIG = Path(__file__).parent / "fixtures" / "newest-chart-device-config.yaml"


def v2_10_device_config() -> str:
    """The v2.10 chart's device ConfigMap: hami-py's packaged default with the Hygon names v2.10
    rendered (``hygon.com/dcu*``); nothing else in it changed in a way v2.10's scheduler read."""
    text = resources.files("hami_py.data").joinpath("device-config.yaml").read_text()
    assert text.count("hygon.com/hcu") == 3
    return text.replace("hygon.com/hcu", "hygon.com/dcu")


@pytest.mark.parametrize("argv", CHART_RENDERINGS.values(), ids=CHART_RENDERINGS.keys())
async def test_the_scheduler_starts_and_serves_with_each_rendered_command(api, tmp_path, argv):
    """Each rendered command, with only what this machine cannot have replaced: local ports
    instead of 443/80/9395, no TLS files, no leader election lease (no chart namespace here),
    and the device ConfigMap's file of the same chart generation (its default rendering) at a
    temporary path."""
    newest = argv in NEWEST_RENDERINGS.values()
    config_file = tmp_path / "device-config.yaml"
    config_file.write_text(NEWEST_DEVICE_CONFIG.read_text() if newest else v2_10_device_config())
    options = options_from_args(build_parser().parse_args(argv))
    local = embedded_options()
    options = dataclasses.replace(options, http_bind=local.http_bind, metrics_bind_address=local.metrics_bind_address,
                                  cert_file="", key_file="", leader_elect=False, device_config_file=str(config_file),
                                  kube_qps=local.kube_qps, kube_burst=local.kube_burst,
                                  extender_bind="127.0.0.1:0" if options.extender_bind else "")
    switches = FamilySwitches(enable_ascend=options.enable_ascend, enable_iluvatar=options.enable_iluvatar)
    expected = build_vendors(DeviceConfig.default(), switches)
    async with running_scheduler(api, options=options, device_config=load_device_config(str(config_file)),
                                 device_plugin=False) as app:
        assert app.ready
        assert set(app.vendors) == set(expected)
        # Both Hygon generations are served under either chart's ConfigMap (docs/devices/hygon.md).
        assert (app.vendors["HCU"].count_resource_name, app.vendors["DCU"].count_resource_name) == (
            "hygon.com/hcunum", "hygon.com/dcunum")
        extender = ExtenderClient(app.url)
        try:
            status, body = await extender.post("filter", b"{}")
        finally:
            await extender.close()
        assert status == 200 and body["Error"] == "extender args missing pod"   # serving, and precise
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{app.cluster_url}/filter", data=b"{}") as answer:
                # With --extender-bind the cluster listener serves no extender verb (v2.10's serves all).
                assert answer.status == (404 if options.extender_bind else 200)
            async with session.post(f"{app.cluster_url}/refit", data=b"{}") as answer:
                # Configured (the newest chart names the device plugin's account): a caller with no token.
                assert answer.status == (401 if options.device_plugin_namespace else 503)


def test_the_charts_command_is_installed():
    """The chart runs ``command: [scheduler, ...]``, which replaces the image's entry point."""
    from importlib.metadata import entry_points
    scripts = {e.name: e.value for e in entry_points(group="console_scripts")}
    assert scripts.get("scheduler") == "hami_py.cli:main" == scripts.get("hami-scheduler")


# The newest chart's extender managedResources with its default values, as its _helpers.tpl builds
# them (#3124, #3152): NVIDIA's five names, Cambricon's count, Hygon's three, Metax's count and
# sGPU names, Mthreads' and AWS Neuron's and AMD's customresources, Enflame's, Kunlun's, Vastai's
# and Biren's standard names from their resource fields (their customresources default to []);
# Ascend's and Iluvatar's customresources only with devices.<vendor>.enabled; remote GPUs off.
CHART_MANAGED = [
    "nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores", "nvidia.com/gpumem-percentage",
    "nvidia.com/priority", "cambricon.com/vmlu", "hygon.com/hcunum", "hygon.com/hcumem", "hygon.com/hcucores",
    "metax-tech.com/gpu", "metax-tech.com/sgpu", "metax-tech.com/vcore", "metax-tech.com/vmemory",
    "mthreads.com/vgpu", "enflame.com/drs-gcu", "enflame.com/gcu-memory", "enflame.com/gcu-core", "enflame.com/gcu",
    "kunlunxin.com/xpu", "kunlunxin.com/vxpu", "kunlunxin.com/vxpu-memory",
    "aws.amazon.com/neuron", "aws.amazon.com/neuroncore", "vastaitech.com/va", "birentech.com/gpu",
    "amd.com/gpu", "amd.com/gpumem", "amd.com/gpucores",
]
CHART_ASCEND = [f"huawei.com/{chip}{suffix}" for chip in ("Ascend910A", "Ascend910B2", "Ascend910B3", "Ascend910B4",
                                                           "Ascend910B4-1", "Ascend310P", "Ascend910C")
                for suffix in ("", "-memory", "-core")]
CHART_ILUVATAR = [f"iluvatar.ai/{chip}{suffix}" for chip in ("BI-V100", "BI-V150", "MR-V100", "MR-V50")
                  for suffix in ("-vgpu", ".vCore", ".vMem")]
# What hami-py manages beyond the chart's list: the memory and core names of families the chart
# lists by their count alone (a container asking them asks the count too, so kube-scheduler sends
# it anyway), and the DCU generation served beside the HCU one. The newest chart does not list
# the DCU names: a cluster still running DCU plugins under it adds them to the extender's
# managedResources (docs/devices/hygon.md), as hami-py's own manifests do.
HAMI_PY_ALSO = {"cambricon.com/mlu.smlu.vmemory", "cambricon.com/mlu.smlu.vcore", "mthreads.com/sgpu-memory",
                "mthreads.com/sgpu-core", "hygon.com/dcunum", "hygon.com/dcumem", "hygon.com/dcucores"}


@pytest.mark.parametrize("ascend,iluvatar", [(False, False), (True, True)], ids=["default", "ascend+iluvatar"])
def test_the_newest_charts_device_config_loads_and_its_managed_resources_are_ours(ascend, iluvatar):
    """hami-py reads the newest chart's default device ConfigMap as it is (keys it has no use for,
    such as nvidia.adoptExistingMIGInstances or vnpus.vnpuDeviceSplitCount, are read or ignored,
    never refused), and every resource the chart sends to the extender is one hami-py manages."""
    config = load_device_config(NEWEST_DEVICE_CONFIG)
    vendors = build_vendors(config, FamilySwitches(enable_ascend=ascend, enable_iluvatar=iluvatar))
    ours = managed_resource_names(vendors)
    chart = CHART_MANAGED + CHART_ASCEND * ascend + CHART_ILUVATAR * iluvatar
    assert len(set(chart)) == len(chart)
    assert sorted(set(chart) - set(ours)) == []          # nothing the chart sends us is unknown to us
    assert set(ours) - set(chart) == HAMI_PY_ALSO
    # the values #3152 made explicit are the ones hami-py runs with
    assert config.sections["hygon"] == {"resourceCountName": "hygon.com/hcunum", "resourceMemoryName": "hygon.com/hcumem",
                                        "resourceCoreName": "hygon.com/hcucores", "memoryFactor": 1}
    assert config.sections["metax"]["resourceCountName"] == "metax-tech.com/gpu" and "Metax-GPU" in vendors
    assert vendors["AMD"].resource_names()[:3] == ["amd.com/gpu", "amd.com/gpumem", "amd.com/gpucores"]
