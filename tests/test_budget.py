"""The API budget: the scheduler says at start when --kube-qps caps it below 10 pods a second.

Upstream's client defaults (``--kube-qps 5 --kube-burst 10``) stay the flags' defaults, and with
three requests a pod (lock and Binding on the critical path, the label after) they allow 1.67 pods/s: an operator who kept
them must be told, in the log, what they cost.
"""
from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from hami_py.cli import build_parser, options_from_args
from hami_py.embedded import embedded_options, running_scheduler
from hami_py.k8s.budget import REQUESTS_PER_POD, pods_per_second_cap

WARNING = "the API budget caps scheduling"


async def _start_logs(api, **options) -> list[dict]:
    with capture_logs() as logs:
        async with running_scheduler(api, options=embedded_options(**options), device_plugin=False):
            pass
    return [e for e in logs if e["event"] == WARNING]


async def test_upstreams_default_budget_is_a_warning_with_the_cap(api):
    defaults = options_from_args(build_parser().parse_args([]))
    assert (defaults.kube_qps, defaults.kube_burst) == (5.0, 10)      # upstream's, unchanged
    warnings = await _start_logs(api, kube_qps=defaults.kube_qps, kube_burst=defaults.kube_burst)
    assert len(warnings) == 1
    assert warnings[0]["log_level"] == "warning"
    assert warnings[0]["pods_per_s"] == 1.67 == round(5.0 / REQUESTS_PER_POD, 2)
    assert warnings[0]["kube_qps"] == 5.0 and warnings[0]["kube_burst"] == 10


@pytest.mark.parametrize("qps", [0, 30, 600])    # unlimited, exactly 10 pods/s, the manifests' budget
async def test_a_budget_of_ten_pods_a_second_or_more_is_no_warning(api, qps):
    assert await _start_logs(api, kube_qps=qps, kube_burst=1000) == []


async def test_just_under_ten_pods_a_second_warns(api):
    warnings = await _start_logs(api, kube_qps=29, kube_burst=100)
    assert [w["pods_per_s"] for w in warnings] == [9.67]


def test_zero_qps_means_no_cap():
    assert pods_per_second_cap(0) is None and pods_per_second_cap(-1) is None
