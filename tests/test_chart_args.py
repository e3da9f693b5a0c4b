"""hami-py runs under HAMi's own Helm chart: the extender container's command line, as rendered.

The argument lists below were written down by reading the chart's scheduler Deployment template
(``charts/hami/templates/scheduler/deployment.yaml``, container ``vgpu-scheduler-extender``) with
its default values (``schedulerName: hami-scheduler``, webhook on, leader election on, namespace
``hami-system``), once as rendered by default and once with ``devices.ascend.enabled`` and
``devices.iluvatar.enabled`` set. The chart runs the command ``scheduler``; the rest is the
arguments. No Helm, and nothing copied from the chart's files: only the rendered command lines.
"""
from __future__ import annotations

import dataclasses

import pytest

from hami_py.cli import build_parser, options_from_args
from hami_py.config import DeviceConfig
from hami_py.devices.registry import FamilySwitches, build_vendors
from hami_py.embedded import embedded_options, running_scheduler

CHART_DEFAULT = [
    "--http_bind=0.0.0.0:443",
    "--cert_file=/tls/tls.crt",
    "--key_file=/tls/tls.key",
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
CHART_ASCEND_ILUVATAR = CHART_DEFAULT + ["--enable-ascend=true", "--enable-iluvatar=true"]
CHART_LEGACY_SELECTOR = CHART_DEFAULT + ["--node-label-selector=gpu=on,zone=a", "--legacy-metrics=true"]


@pytest.mark.parametrize("argv", [CHART_DEFAULT, CHART_ASCEND_ILUVATAR, CHART_LEGACY_SELECTOR],
                         ids=["default", "ascend+iluvatar", "selector+legacy-metrics"])
def test_every_argument_the_chart_renders_is_accepted(argv):
    options = options_from_args(build_parser().parse_args(argv))
    assert options.scheduler_name == "hami-scheduler" and options.leader_elect
    assert options.device_config_file == "/device-config.yaml"
    assert options.enable_ascend == ("--enable-ascend=true" in argv)
    assert options.enable_iluvatar == ("--enable-iluvatar=true" in argv)


def test_the_switches_bring_in_the_families_they_gate():
    options = options_from_args(build_parser().parse_args(CHART_ASCEND_ILUVATAR))
    switches = FamilySwitches(enable_ascend=options.enable_ascend, enable_iluvatar=options.enable_iluvatar)
    with_switches = build_vendors(DeviceConfig.default(), switches)
    without = build_vendors(DeviceConfig.default())
    gated = set(with_switches) - set(without)
    assert {"Ascend910B3", "MR-V100"} <= gated
    assert not any(key.startswith("Ascend") or key in ("MR-V100", "MR-V50", "BI-V150", "BI-V100") for key in without)


async def test_the_scheduler_starts_and_serves_with_the_charts_ascend_and_iluvatar_arguments(api):
    """The rendered arguments, with only what this machine cannot have replaced: local ports
    instead of 443/9395, no TLS files, no leader election lease (no chart namespace here)."""
    options = options_from_args(build_parser().parse_args(CHART_ASCEND_ILUVATAR))
    local = embedded_options()
    options = dataclasses.replace(options, http_bind=local.http_bind, metrics_bind_address=local.metrics_bind_address,
                                  cert_file="", key_file="", leader_elect=False, device_config_file="",
                                  kube_qps=local.kube_qps, kube_burst=local.kube_burst)
    async with running_scheduler(api, options=options, device_plugin=False) as app:
        assert app.ready
        assert app.options.enable_ascend and app.options.enable_iluvatar
        assert set(app.vendors) >= set(build_vendors(DeviceConfig.default(), FamilySwitches(True, True)))


def test_the_charts_command_is_installed():
    """The chart runs ``command: [scheduler, ...]``, which replaces the image's entry point."""
    from importlib.metadata import entry_points
    scripts = {e.name: e.value for e in entry_points(group="console_scripts")}
    assert scripts.get("scheduler") == "hami_py.cli:main" == scripts.get("hami-scheduler")
