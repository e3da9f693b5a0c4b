"""hami-py runs under HAMi's own Helm chart: the extender container's command line, as rendered.

The argument lists below were written down by reading the chart's scheduler Deployment template
(``charts/hami/templates/scheduler/deployment.yaml``, container ``vgpu-scheduler-extender``) with
its default values (``schedulerName: hami-scheduler``, webhook on, leader election on, namespace
``hami-system``, ``scheduler.extender.extraArgs``), and with each value that changes the command
set: every combination of ``devices.ascend.enabled`` and ``devices.iluvatar.enabled``, the
webhook off, a node label selector with legacy metrics. The chart runs the command
``scheduler``; the rest is the arguments. No Helm, and nothing copied from the chart's files: only the rendered command lines.

Two chart generations: v2.10's (4707fb02), and the newest the code index holds (after HAMi
#2882, which adds the device plugin's ServiceAccount for /refit and moves the listener to 9443,
and #3039, which adds ``--extender-bind`` on loopback; the final template of #3039 was read from
its review only, so the newest list is also given without ``--extender-bind``, as #2882 left it).
"""
from __future__ import annotations

import dataclasses
from importlib import resources

import aiohttp
import pytest

from hami_py.cli import build_parser, options_from_args
from hami_py.config import DeviceConfig, load_device_config
from hami_py.devices.registry import FamilySwitches, build_vendors
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


def _newest(*, webhook: bool = True, extender: bool = True, ascend: bool = False, iluvatar: bool = False) -> list[str]:
    argv = (_NEWEST_TLS if webhook else ["--http_bind=0.0.0.0:9443"]) + _EXTENDER * extender + _COMMON
    argv += _DEVICE_PLUGIN + ["--enable-ascend=true"] * ascend + ["--enable-iluvatar=true"] * iluvatar
    return argv + _EXTRA_ARGS


NEWEST_RENDERINGS = {
    "newest": _newest(),
    "newest-ascend+iluvatar": _newest(ascend=True, iluvatar=True),
    "newest-no-webhook": _newest(webhook=False),
    "newest-before-extender-bind": _newest(extender=False),
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


def test_the_switches_bring_in_the_families_they_gate():
    options = options_from_args(build_parser().parse_args(CHART_ASCEND_ILUVATAR))
    switches = FamilySwitches(enable_ascend=options.enable_ascend, enable_iluvatar=options.enable_iluvatar)
    with_switches = build_vendors(DeviceConfig.default(), switches)
    without = build_vendors(DeviceConfig.default())
    gated = set(with_switches) - set(without)
    assert {"Ascend910B3", "MR-V100"} <= gated
    assert not any(key.startswith("Ascend") or key in ("MR-V100", "MR-V50", "BI-V150", "BI-V100") for key in without)


@pytest.mark.parametrize("argv", CHART_RENDERINGS.values(), ids=CHART_RENDERINGS.keys())
async def test_the_scheduler_starts_and_serves_with_each_rendered_command(api, tmp_path, argv):
    """Each rendered command, with only what this machine cannot have replaced: local ports
    instead of 443/80/9395, no TLS files, no leader election lease (no chart namespace here),
    and the device ConfigMap's file (the chart's default rendering) at a temporary path."""
    config_file = tmp_path / "device-config.yaml"
    config_file.write_bytes(resources.files("hami_py.data").joinpath("device-config.yaml").read_bytes())
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
