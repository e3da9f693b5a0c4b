"""Every error path of /filter and /bind: a precise message in an HTTP 200 body, the server still
serving, and no reservation left behind."""
from __future__ import annotations

import pytest

from hami_py.embedded import embedded_options
from hami_py.fakeapi.objects import gpu_node, gpu_pod
from hami_py.k8s.nodelock import LOCK_ANNOTATION
from tests.conftest import assert_books_balance, pod_events_applied, register_nodes, wait_until


@pytest.fixture
def scheduler_options():
    return embedded_options(body_limit=64 * 1024, kube_timeout=2)


async def _node(api, app, name="n1", gpus=1):
    return await register_nodes(api, app, gpu_node(name, gpus=gpus))


def _used_mem(app, node="n1"):
    return sum(d["usedmem"] for d in app.cache.device_usage(node))


async def test_oversized_body_is_an_error_not_a_truncation(api, app, extender):
    status, body = await extender.post("filter", b'{"Pod": {"metadata": {"name": "' + b"x" * 70000 + b'"}}}')
    assert status == 200
    assert body["Error"] == "request body exceeds the limit of 65536 bytes"
    assert body["NodeNames"] is None
    status, body = await extender.post("bind", b"{" + b" " * 70000 + b"}")
    assert (status, body) == (200, {"Error": "request body exceeds the limit of 65536 bytes"})


@pytest.mark.parametrize("payload, message", [
    (b"", "empty request body: EOF"),
    (b'{"Pod": ', "invalid JSON request body"),
    (b"[1, 2]", "extender args must be a JSON object"),
    (b'{"NodeNames": ["n1"]}', "extender args missing pod"),
    (b'{"Pod": null, "NodeNames": ["n1"]}', "extender args missing pod"),
    (b'{"Pod": "text", "NodeNames": ["n1"]}', "extender args pod must be an object"),
    (b"[" * 5000 + b"]" * 5000, "invalid JSON request body"),
])
async def test_malformed_filter_requests_get_a_clear_error(app, extender, payload, message):
    status, body = await extender.post("filter", payload)
    assert status == 200
    assert body["Error"].startswith(message), body
    assert set(body) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}


async def test_keys_are_matched_case_insensitively_like_go(api, app, extender):
    names = await _node(api, app)
    pod = api.create("pods", gpu_pod("p", gpumem=1000))
    _, body = await extender.post("filter", {"pod": pod, "nodenames": names})
    assert body["NodeNames"] == names


async def test_no_node_list_at_all_is_an_error_not_a_crash(api, app, extender):
    pod = api.create("pods", gpu_pod("p", gpumem=1000))
    _, body = await extender.post("filter", {"Pod": pod})
    assert body["Error"] == "extender args have neither NodeNames nor Nodes"
    _, body = await extender.post("filter", {"Pod": pod, "NodeNames": "n1"})
    assert body["Error"] == "extender args NodeNames must be a list of node names"


@pytest.mark.parametrize("limits, fragment", [
    ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1.5"}, "nvidia.com/gpumem"),
    ({"nvidia.com/gpu": "half"}, "nvidia.com/gpu"),
    ({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "-5"}, "nvidia.com/gpucores"),
])
async def test_malformed_device_quantities_are_refused_loudly(api, app, extender, limits, fragment):
    names = await _node(api, app)
    pod = gpu_pod("p")
    pod["spec"]["containers"][0]["resources"]["limits"] = limits
    pod = api.create("pods", pod)
    result = await extender.filter(pod, names)
    assert fragment in result["Error"] and "default/p" in result["Error"], result
    assert _used_mem(app) == 0


def _count_refused(value: str, reason: str) -> tuple[dict, str]:
    return {"nvidia.com/gpu": value}, f"invalid nvidia.com/gpu request in container main: device count {value} {reason}"


def _percent_refused(resource: str, value: str) -> tuple[dict, str]:
    return ({"nvidia.com/gpu": "1", resource: value},
            f"invalid {resource} value {value} in container main: must be an integer between 0 and 100")


@pytest.mark.parametrize("limits, message", [
    _count_refused("1Ei", "is out of range"),      # 2^60: quantities are judged by value
    _count_refused("1e19", "is not a plain integer"),
    _count_refused("-1", "is out of range"),
    _count_refused("2147483648", "is out of range"),
    _percent_refused("nvidia.com/gpucores", "150"),
    _percent_refused("nvidia.com/gpumem-percentage", "200"),
    _percent_refused("nvidia.com/gpumem-percentage", "50.5"),
    ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2147483648"},
     'container "main": nvidia.com/gpumem "2147483648" is out of range: must be between 0 and 2147483647 MiB'),
])
async def test_invalid_device_requests_fail_closed(api, app, extender, limits, message):
    """HAMi after v2.10 (#2740, #2784, #2994, #2789): a request out of range is refused with its
    reason (HTTP 200, ``Error``), never scheduled as if it asked for nothing or for whole cards."""
    names = await _node(api, app)
    pod = gpu_pod("p")
    pod["spec"]["containers"][0]["resources"]["limits"] = limits
    pod = api.create("pods", pod)
    status, body = await extender.post("filter", {"Pod": pod, "NodeNames": names})
    assert status == 200
    assert body["Error"] == f"pod default/p: {message}" and body["NodeNames"] is None, body
    assert _used_mem(app) == 0 and not app.cache.pods


async def test_a_count_of_zero_asks_for_no_device(api, app, extender):
    """An explicit ``nvidia.com/gpu: 0`` is no request (#2994): passed through, nothing reserved."""
    names = await _node(api, app)
    pod = api.create("pods", gpu_pod("p", gpus=0, gpucores=150))
    status, body = await extender.post("filter", {"Pod": pod, "NodeNames": names})
    assert (status, body["Error"], body["NodeNames"]) == (200, "", names)
    assert _used_mem(app) == 0 and not app.cache.pods


@pytest.mark.parametrize("value, message", [
    ("slot=1,core=1", "expected slot, core, and memory weights"),
    ("slot=1,core,memory=1", "expected key=value entries"),
    ("slot=1,slot=1,memory=1", 'duplicate "slot" weight'),
    ("slot=a,core=1,memory=1", '"slot" weight must be an integer'),
    ("slot=-1,core=1,memory=1", '"slot" weight must not be negative'),
    ("slot=1,gpu=1,memory=1", 'unknown weight "gpu"'),
    ("slot=0,core=0,memory=0", "at least one weight must be positive"),
])
async def test_invalid_scoring_weights_annotation(api, app, extender, value, message):
    names = await _node(api, app)
    pod = api.create("pods", gpu_pod("p", gpumem=1000, annotations={"hami.io/device-scoring-weights": value}))
    result = await extender.filter(pod, names)
    assert result["Error"] == (f'calcScore failed invalid hami.io/device-scoring-weights annotation "{value}": '
                               f"{message} for pod p")
    assert _used_mem(app) == 0


async def test_filter_succeeds_with_every_api_write_failing_and_a_failed_binding_rolls_back(api, app, extender):
    """/filter writes nothing, so an API server refusing every write cannot fail it; the bind's
    Binding then fails, and releases the reservation and the node lock with nothing on the pod."""
    names = await _node(api, app)
    pod = api.create("pods", gpu_pod("p", gpumem=1000))
    for method in ("PATCH", "PUT", "POST", "DELETE"):
        api.faults.add(method=method, status=500, times=None)
    result = await extender.filter(pod, names)
    assert result["NodeNames"] == names and result["Error"] == ""
    assert _used_mem(app) == 1000
    assert api.get("pods", "p", namespace="default")["metadata"]["resourceVersion"] == pod["metadata"]["resourceVersion"]
    assert (await extender.bind(pod, "n1"))["Error"]
    assert _used_mem(app) == 0 and not app.cache.pods
    stored = api.get("pods", "p", namespace="default")
    assert stored["metadata"]["resourceVersion"] == pod["metadata"]["resourceVersion"]   # nothing half-applied
    assert LOCK_ANNOTATION not in (api.get("nodes", "n1")["metadata"].get("annotations") or {})
    api.faults.clear()
    result = await extender.filter(pod, names)  # kube-scheduler retries; now it works
    assert result["NodeNames"] == names
    assert (await extender.bind(pod, "n1")) == {"Error": ""}
    assert _used_mem(app) == 1000
    assert api.get("pods", "p", namespace="default")["metadata"]["annotations"]["hami.io/vgpu-node"] == "n1"
    assert_books_balance(app)


async def test_bind_of_a_vanished_pod_rolls_back(api, app, extender):
    names = await _node(api, app)
    pod = api.create("pods", gpu_pod("p", gpumem=1000))
    await extender.filter(pod, names)
    assert _used_mem(app) == 1000
    api.delete("pods", "p", namespace="default")
    assert (await extender.bind(pod, "n1")) == {"Error": 'pod "p" not found'}
    assert _used_mem(app) == 0


async def test_bind_args_missing_fields(app, extender):
    _, body = await extender.post("bind", {"PodName": "p"})
    assert body == {"Error": "binding args missing PodNamespace, Node"}


@pytest.mark.parametrize("status", [409, 503])
async def test_binding_that_did_not_land_releases_lock_and_reservation(api, app, extender, status):
    """A Binding refused (409) or failed before it was applied (503): the pod stays unbound and
    its reservation and the node lock are released."""
    names = await _node(api, app)
    pod = api.create("pods", gpu_pod("p", gpumem=1000))
    await extender.filter(pod, names)
    fault = api.faults.add(method="POST", path="/binding$", status=status)
    result = await extender.bind(pod, "n1")
    assert fault.hits == 1
    assert result["Error"]
    assert api.get("pods", "p", namespace="default")["spec"].get("nodeName") is None
    assert _used_mem(app) == 0
    assert LOCK_ANNOTATION not in (api.get("nodes", "n1")["metadata"].get("annotations") or {})
    # The decision went with the Binding: nothing of it is on the pod, and the rolled-back
    # decision stays rolled back as later events of the pod arrive.
    touched = api.patch("pods", "p", {"metadata": {"labels": {"touched": "yes"}}}, namespace="default")
    assert "hami.io/vgpu-node" not in (touched["metadata"].get("annotations") or {})
    assert not touched["spec"].get("nodeName")
    await pod_events_applied(app, touched)
    assert app.cache.pods == {}
    assert _used_mem(app) == 0


async def test_binding_that_landed_despite_an_error_is_not_undone(api, app, extender):
    names = await _node(api, app)
    pod = api.create("pods", gpu_pod("p", gpumem=1000))
    await extender.filter(pod, names)
    api.faults.add(method="POST", path="/binding$", status=504, after_apply=True)
    assert await extender.bind(pod, "n1") == {"Error": ""}
    assert api.get("pods", "p", namespace="default")["spec"]["nodeName"] == "n1"
    assert _used_mem(app) == 1000


async def test_filter_waits_for_sync_and_reports_when_it_never_comes(api):
    from hami_py.embedded import running_scheduler
    from hami_py.fakeapi.kubescheduler import ExtenderClient
    api.faults.add(method="GET", path="^/api/v1/pods$", status=500, times=None)
    async with running_scheduler(api, options=embedded_options(sync_timeout_s=0.3), wait_ready=False,
                                 device_plugin=False) as app:
        client = ExtenderClient(app.url)
        try:
            pod = api.create("pods", gpu_pod("p", gpumem=1000))
            status, body = await client.post("filter", {"Pod": pod, "NodeNames": ["n1"]})
            assert (status, body["Error"], body["NodeNames"]) == (200, "scheduler cache is not synced yet", None)
            result = await client.filter(pod, ["n1"])
            assert result["Error"] == "scheduler cache is not synced yet"
            async with client.session.get(f"{app.url}/readyz") as r:
                assert r.status == 503
            async with client.session.get(f"{app.url}/healthz") as r:
                assert r.status == 200
            api.faults.clear()
            await wait_until(lambda: app.ready, "sync after the API server recovers", timeout=30)
            async with client.session.get(f"{app.url}/readyz") as r:
                assert r.status == 200
        finally:
            await client.close()


async def test_unknown_path_and_wrong_method(app, extender):
    async with extender.session.get(f"{app.url}/filter") as r:
        assert r.status == 405
    async with extender.session.post(f"{app.url}/nope") as r:
        assert r.status == 404
