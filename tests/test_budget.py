"""The API budget: HAMi's chart passes neither --kube-qps nor --kube-burst, and the scheduler
then uses a budget that places 100 pods a second; explicit flags win, and the start-up log names
the budget in force, with a warning when it caps scheduling below 10 pods a second.

Upstream's client defaults (``--kube-qps 5 --kube-burst 10``), with three requests a pod (lock and
Binding on the critical path, the label after), allow 1.67 pods/s: an operator who sets them must
be told, in the log, what they cost.
"""
from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from hami_py.cli import build_parser, options_from_args
from hami_py.embedded import embedded_options, running_scheduler
from hami_py.fakeapi.objects import gpu_node, gpu_pod
from hami_py.k8s.budget import DEFAULT_BURST, DEFAULT_QPS, REQUESTS_PER_POD, pods_per_second_cap
from tests.conftest import HANDSHAKE, Gate, handshake_of, place, register_nodes, wait_until

WARNING = "the API budget caps scheduling"


async def _start_logs(api, event: str = WARNING, **options) -> list[dict]:
    with capture_logs() as logs:
        async with running_scheduler(api, options=embedded_options(**options), device_plugin=False):
            pass
    return [e for e in logs if e["event"] == event]


def _options(*argv: str):
    return options_from_args(build_parser().parse_args(list(argv)))


def test_without_either_flag_the_budget_places_100_pods_a_second():
    chart = _options()          # HAMi's chart renders neither flag
    assert (chart.kube_qps, chart.kube_burst, chart.kube_budget_source) == (DEFAULT_QPS, DEFAULT_BURST, "default")
    assert pods_per_second_cap(chart.kube_qps) >= 100
    assert chart.kube_qps - 100 * REQUESTS_PER_POD >= 6000 / 30     # and 6 000 nodes' handshake stamps


@pytest.mark.parametrize("argv, expected", [
    (("--kube-qps", "5", "--kube-burst", "10"), (5.0, 10)),      # upstream's client defaults, asked for
    (("--kube-qps", "50"), (50.0, 100)),                          # the burst from the rate
    (("--kube-burst", "20"), (DEFAULT_QPS, 20)),                  # the rate the default
    (("--kube-qps", "0"), (0.0, DEFAULT_BURST)),                  # unlimited
])
def test_explicit_flags_win(argv, expected):
    options = _options(*argv)
    assert (options.kube_qps, options.kube_burst, options.kube_budget_source) == (*expected, "flags")


async def test_the_start_up_log_names_the_budget_in_force(api):
    [line] = await _start_logs(api, "API budget", kube_qps=600, kube_burst=1200, kube_budget_source="default")
    assert (line["kube_qps"], line["kube_burst"], line["source"], line["pods_per_s"]) == (600, 1200, "default", 200.0)


async def test_upstreams_client_defaults_asked_for_are_a_warning_with_the_cap(api):
    asked = _options("--kube-qps", "5", "--kube-burst", "10")
    warnings = await _start_logs(api, kube_qps=asked.kube_qps, kube_burst=asked.kube_burst)
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


async def test_a_pods_lock_and_binding_never_wait_behind_background_work(api, app, extender):
    """Registration upkeep, label follow-ups and requeue nudges draw on a budget of their own: with
    that budget drained (its bucket held shut), the keeper's handshake stamp waits, and a pod is
    still filtered and bound at once (its lock and Binding draw on the critical path's budget)."""
    gate = Gate()
    app.keeper.client.bucket = gate        # the background view shared by keeper, labels and requeue
    assert app.service.binder.labels.client is app.keeper.client and app.requeue.client is app.keeper.client
    node = gpu_node("n1", gpus=1)
    node["metadata"]["annotations"][HANDSHAKE] = "Reported 2026-01-01 00:00:00"
    await register_nodes(api, app, node)
    await wait_until(lambda: gate.waiting >= 1, "the keeper's stamp waiting for its budget")
    pod, result = await place(api, extender, gpu_pod("p", gpumem=1000), ["n1"])
    assert result["NodeNames"] == ["n1"]
    assert (await extender.bind(pod, "n1")) == {"Error": ""}
    assert gate.waiting >= 1 and not handshake_of(api, "n1").startswith("Requesting")
    gate.open.set()
    await wait_until(lambda: handshake_of(api, "n1").startswith("Requesting"), "the stamp written once its budget allows")
