"""The fake kube-apiserver must behave like the real one for the clients we use.

Everything here goes over loopback HTTP: typed calls through kubernetes-asyncio (built from a
kubeconfig, exactly as the extender builds its client) and watch streams through raw aiohttp, so a
semantic slip in the fake shows up as the same client-side failure a real cluster would cause.
"""
from __future__ import annotations

import asyncio
import io
import time
from typing import Any

import aiohttp
import orjson
import pytest
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.rest import ApiException

from hami_py.embedded import wait_for
from hami_py.fakeapi import ApiError, FakeApiServer, write_kubeconfig
from tests.conftest import wait_until

DEADLINE = 5.0   # generous per-wait ceiling; every wait returns as soon as its condition holds


def make_pod(name: str, *, namespace: str = "default", labels: dict | None = None,
             node: str | None = None, annotations: dict | None = None) -> dict:
    pod: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {},
                     "annotations": annotations or {}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }
    if node:
        pod["spec"]["nodeName"] = node
    return pod


def make_node(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}


async def read_events(response: aiohttp.ClientResponse, count: int) -> list[dict]:
    async with asyncio.timeout(DEADLINE):
        return [orjson.loads(await response.content.readline()) for _ in range(count)]


async def read_to_end(response: aiohttp.ClientResponse) -> list[dict]:
    async with asyncio.timeout(DEADLINE):
        body = await response.read()
    return [orjson.loads(line) for line in body.splitlines()]


@pytest.fixture
async def server():
    fake = FakeApiServer()
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
async def core(server, tmp_path):
    path = write_kubeconfig(tmp_path / "kubeconfig", server.url)
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(path), client_configuration=configuration)
    async with client.ApiClient(configuration) as api_client:
        yield client.CoreV1Api(api_client)


@pytest.fixture
async def http():
    async with aiohttp.ClientSession() as session:
        yield session


def watch_url(server: FakeApiServer, path: str = "/api/v1/namespaces/default/pods") -> str:
    return f"{server.url}{path}"


# -- basics ------------------------------------------------------------------------------------

async def test_version_health_and_request_log(server, http):
    async with http.get(f"{server.url}/version") as resp:
        assert (await resp.json())["gitVersion"] == "v1.31.0"
    async with http.get(f"{server.url}/healthz") as resp:
        assert await resp.text() == "ok"
    async with http.get(f"{server.url}/api/v1/pods", params={"limit": "5"}) as resp:
        assert resp.status == 200
    assert ("GET", "/api/v1/pods", "limit=5") in server.requests


async def test_create_list_get_through_kubernetes_client(server, core):
    await core.create_node(make_node("node-b"))
    await core.create_node(make_node("node-a"))
    created = await core.create_namespaced_pod("default", make_pod("p1"))
    assert created.metadata.uid and created.metadata.creation_timestamp
    assert created.metadata.resource_version == "3" == str(server.resource_version)
    assert created.status.phase == "Pending"

    nodes = await core.list_node()
    assert [n.metadata.name for n in nodes.items] == ["node-a", "node-b"]
    assert nodes.metadata.resource_version == "3"

    pod = await core.read_namespaced_pod("p1", "default")
    assert (pod.kind, pod.metadata.namespace, pod.metadata.uid) == ("Pod", "default", created.metadata.uid)
    with pytest.raises(ApiException) as exc:
        await core.create_namespaced_pod("default", make_pod("p1"))
    assert exc.value.status == 409 and orjson.loads(exc.value.body)["reason"] == "AlreadyExists"


async def test_missing_object_is_a_not_found_status(server, core, http):
    async with http.get(f"{server.url}/api/v1/namespaces/default/pods/x") as resp:
        assert resp.status == 404
        assert await resp.json() == {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": 'pods "x" not found', "reason": "NotFound",
            "details": {"name": "x", "kind": "pods"}, "code": 404}
    with pytest.raises(ApiException) as exc:
        await core.read_node("nope")
    assert exc.value.status == 404
    async with http.get(f"{server.url}/api/v1/widgets") as resp:
        assert resp.status == 404 and (await resp.json())["kind"] == "Status"
    async with http.put(f"{server.url}/api/v1/pods") as resp:
        assert resp.status == 405 and (await resp.json())["reason"] == "MethodNotAllowed"


async def test_paging_is_a_consistent_snapshot_until_compaction(server, core):
    for i in range(7):
        server.create("pods", make_pod(f"p{i}"))
    first = await core.list_namespaced_pod("default", limit=3)
    snapshot_rv = first.metadata.resource_version
    assert len(first.items) == 3 and first.metadata.remaining_item_count == 4
    server.create("pods", make_pod("p-late"))         # must not show up in the later pages
    names = [p.metadata.name for p in first.items]
    token = first.metadata._continue
    while token:
        page = await core.list_namespaced_pod("default", limit=3, _continue=token)
        assert page.metadata.resource_version == snapshot_rv
        names += [p.metadata.name for p in page.items]
        token = page.metadata._continue
    assert names == [f"p{i}" for i in range(7)]

    again = await core.list_namespaced_pod("default", limit=3)
    server.compact()
    with pytest.raises(ApiException) as exc:
        await core.list_namespaced_pod("default", limit=3, _continue=again.metadata._continue)
    assert exc.value.status == 410 and orjson.loads(exc.value.body)["reason"] == "Expired"
    with pytest.raises(ApiException) as exc:
        await core.list_namespaced_pod("default", _continue="not-a-token")
    assert exc.value.status == 400


async def test_label_and_field_selectors(server, core):
    server.create("pods", make_pod("a", labels={"app": "x", "tier": "web"}, node="n1"))
    server.create("pods", make_pod("b", labels={"app": "y"}))
    server.create("pods", make_pod("c", namespace="other", labels={"app": "x"}))

    async def names(**kwargs: Any) -> list[str]:
        return [p.metadata.name for p in (await core.list_pod_for_all_namespaces(**kwargs)).items]

    assert await names(label_selector="app=x") == ["a", "c"]
    assert await names(label_selector="app!=x") == ["b"]
    assert await names(label_selector="tier") == ["a"]
    assert await names(label_selector="app in (x,y),!tier") == ["b", "c"]
    assert await names(field_selector="spec.nodeName=") == ["b", "c"]
    assert await names(field_selector="spec.nodeName=n1,metadata.namespace=default") == ["a"]
    assert await names(field_selector="metadata.name!=a,metadata.namespace!=other") == ["b"]


# -- writes ------------------------------------------------------------------------------------

async def test_merge_patch_and_json_patch(server, core, http):
    server.create("pods", make_pod("p", annotations={"keep": "1", "drop": "1"}))
    # A dict body goes out as application/strategic-merge-patch+json.
    patched = await core.patch_namespaced_pod(
        "p", "default", {"metadata": {"annotations": {"new": "v", "drop": None, "uid": "x"}}})
    assert patched.metadata.annotations == {"keep": "1", "new": "v", "uid": "x"}
    patched = await core.patch_namespaced_pod(
        "p", "default", {"metadata": {"labels": {"a": "b"}}},
        _content_type="application/merge-patch+json")
    assert patched.metadata.labels == {"a": "b"}

    # A list body goes out as application/json-patch+json.
    with pytest.raises(ApiException) as exc:
        await core.patch_namespaced_pod("p", "default", [
            {"op": "test", "path": "/metadata/annotations/keep", "value": "2"},
            {"op": "add", "path": "/metadata/annotations/never", "value": "x"}])
    assert exc.value.status == 422 and orjson.loads(exc.value.body)["reason"] == "Invalid"
    assert "never" not in server.get("pods", "p")["metadata"]["annotations"]
    patched = await core.patch_namespaced_pod("p", "default", [
        {"op": "test", "path": "/metadata/annotations/keep", "value": "1"},
        {"op": "replace", "path": "/metadata/annotations/keep", "value": "2"},
        {"op": "copy", "from": "/metadata/labels/a", "path": "/metadata/annotations/copied"},
        {"op": "move", "from": "/metadata/annotations/new", "path": "/metadata/labels/moved"},
        {"op": "add", "path": "/metadata/annotations/example.com~1gpu", "value": "1"},
        {"op": "remove", "path": "/metadata/annotations/uid"}])
    assert patched.metadata.annotations == {"keep": "2", "copied": "b", "example.com/gpu": "1"}
    assert patched.metadata.labels == {"a": "b", "moved": "v"}

    url = f"{server.url}/api/v1/namespaces/default/pods/p"
    async with http.patch(url, data=b"{}", headers={"Content-Type": "text/plain"}) as resp:
        assert resp.status == 415 and (await resp.json())["reason"] == "UnsupportedMediaType"
    for identity in ({"name": "q"}, {"namespace": "other"}):
        async with http.patch(url, data=orjson.dumps({"metadata": identity}),
                              headers={"Content-Type": "application/merge-patch+json"}) as resp:
            assert resp.status == 400
    async with http.patch(url, data=orjson.dumps({"metadata": {"uid": "forged"}}),
                          headers={"Content-Type": "application/merge-patch+json"}) as resp:
        assert resp.status == 409


async def test_stale_resource_version_is_a_conflict(server, core):
    pod = server.create("pods", make_pod("p"))
    stale = pod["metadata"]["resourceVersion"]
    server.patch("pods", "p", {"metadata": {"labels": {"x": "1"}}})

    with pytest.raises(ApiException) as exc:    # compare-and-set patch, as a node lock does it
        await core.patch_namespaced_pod(
            "p", "default", {"metadata": {"resourceVersion": stale, "labels": {"x": "2"}}})
    body = orjson.loads(exc.value.body)
    assert (exc.value.status, body["reason"]) == (409, "Conflict")
    assert body["message"] == ('Operation cannot be fulfilled on pods "p": the object has been '
                               'modified; please apply your changes to the latest version and '
                               'try again')
    current = server.get("pods", "p")["metadata"]["resourceVersion"]
    ok = await core.patch_namespaced_pod(
        "p", "default", {"metadata": {"resourceVersion": current, "labels": {"x": "2"}}})
    assert int(ok.metadata.resource_version) == int(current) + 1

    pod["metadata"]["labels"] = {"x": "3"}       # PUT with the stale copy
    with pytest.raises(ApiException) as exc:
        await core.replace_namespaced_pod("p", "default", pod)
    assert exc.value.status == 409
    with pytest.raises(ApiError) as err:
        server.update("pods", pod)
    assert err.value.code == 409


async def test_delete_with_preconditions(server, core, http):
    pod = server.create("pods", make_pod("p"))
    url = f"{server.url}/api/v1/namespaces/default/pods/p"
    async with http.delete(url, json={"preconditions": {"uid": "other"}}) as resp:
        assert resp.status == 409
    deleted = await core.delete_namespaced_pod("p", "default")
    assert deleted.metadata.uid == pod["metadata"]["uid"]
    assert server.get("pods", "p") is None
    with pytest.raises(ApiException) as exc:
        await core.delete_namespaced_pod("p", "default")
    assert exc.value.status == 404


async def test_binding(server, http):
    pod = server.create("pods", make_pod("p"))
    url = f"{server.url}/api/v1/namespaces/default/pods/p/binding"

    def binding(uid: str | None = None, name: str = "p") -> dict:
        meta = {"name": name, **({"uid": uid} if uid else {})}
        return {"apiVersion": "v1", "kind": "Binding", "metadata": meta,
                "target": {"apiVersion": "v1", "kind": "Node", "name": "node1"}}

    async with http.post(url, json=binding(uid="wrong")) as resp:
        assert resp.status == 409 and (await resp.json())["reason"] == "Conflict"
    rv = server.resource_version
    async with http.post(url, json=binding(uid=pod["metadata"]["uid"])) as resp:
        assert resp.status == 201
        assert await resp.json() == {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                     "status": "Success", "code": 201}
    bound = server.get("pods", "p")
    assert bound["spec"]["nodeName"] == "node1"
    assert bound["metadata"]["resourceVersion"] == str(rv + 1)
    async with http.post(url, json=binding()) as resp:
        assert resp.status == 409
        assert 'pod p is already assigned to node "node1"' in (await resp.json())["message"]
    async with http.post(f"{server.url}/api/v1/namespaces/default/pods/gone/binding",
                         json=binding(name="gone")) as resp:
        assert resp.status == 404


async def test_leases_and_configmaps_through_kubernetes_client(server, core):
    coordination = client.CoordinationV1Api(core.api_client)
    lease = await coordination.create_namespaced_lease("kube-system", {
        "metadata": {"name": "hami"}, "spec": {"holderIdentity": "a"}})
    assert lease.api_version == "coordination.k8s.io/v1"
    lease.spec.holder_identity = "b"
    replaced = await coordination.replace_namespaced_lease("hami", "kube-system", lease)
    assert replaced.spec.holder_identity == "b"
    with pytest.raises(ApiException) as exc:   # the same (now stale) lease again
        await coordination.replace_namespaced_lease("hami", "kube-system", lease)
    assert exc.value.status == 409
    await core.create_namespaced_config_map("default", {"metadata": {"name": "cm"},
                                                        "data": {"k": "v"}})
    assert server.get("configmaps", "cm")["data"] == {"k": "v"}


def test_in_process_store_without_http():
    fake = FakeApiServer()
    node = fake.create("nodes", {"metadata": {"name": "n1", "namespace": "ignored"}})
    assert node["kind"] == "Node" and "namespace" not in node["metadata"]
    node["metadata"]["labels"] = {"mutating": "my copy"}      # copies never alias the store
    assert "labels" not in fake.get("nodes", "n1")["metadata"]
    fake.patch("nodes", "n1", {"metadata": {"labels": {"a": "1"}}})
    updated = fake.get("nodes", "n1")
    updated["metadata"]["labels"]["b"] = "2"
    assert fake.update("nodes", updated)["metadata"]["labels"] == {"a": "1", "b": "2"}
    assert fake.resource_version == 3
    fake.create("pods", make_pod("p", namespace="ns1"))
    assert [p["metadata"]["name"] for p in fake.list("pods", namespace="ns1")] == ["p"]
    assert fake.list("pods", namespace="ns2") == []
    assert fake.delete("pods", "p", namespace="ns1")["metadata"]["resourceVersion"] == "5"
    with pytest.raises(ApiError) as err:
        fake.delete("pods", "p", namespace="ns1")
    assert err.value.code == 404


# -- watches -----------------------------------------------------------------------------------

async def test_watch_from_resource_version_replays_then_streams(server, http):
    server.create("pods", make_pod("a"))
    since = server.resource_version
    server.create("pods", make_pod("b"))
    server.patch("pods", "b", {"metadata": {"labels": {"v": "2"}}})
    server.delete("pods", "a")
    server.create("pods", make_pod("elsewhere", namespace="other"))
    async with http.get(watch_url(server), params={"watch": "true", "resourceVersion": str(since)}) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"] == "application/json"
        replay = await read_events(resp, 3)
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in replay] == [
            ("ADDED", "b"), ("MODIFIED", "b"), ("DELETED", "a")]
        rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in replay]
        assert rvs == sorted(rvs) and rvs[0] > since
        server.create("pods", make_pod("c"))
        [live] = await read_events(resp, 1)
        assert (live["type"], live["object"]["metadata"]["name"]) == ("ADDED", "c")


async def test_watch_from_zero_lists_first_and_follows_selectors(server, http):
    server.create("pods", make_pod("a", labels={"app": "x"}))
    server.create("pods", make_pod("b", labels={"app": "y"}))
    params = {"watch": "1", "resourceVersion": "0", "labelSelector": "app=x"}
    async with http.get(watch_url(server), params=params) as resp:
        [initial] = await read_events(resp, 1)
        assert (initial["type"], initial["object"]["metadata"]["name"]) == ("ADDED", "a")
        server.patch("pods", "b", {"metadata": {"labels": {"app": "x"}}})   # moves in
        server.patch("pods", "a", {"metadata": {"labels": {"app": "z"}}})   # moves out
        events = await read_events(resp, 2)
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
            ("ADDED", "b"), ("DELETED", "a")]


async def test_watch_through_kubernetes_client(server, core):
    server.create("pods", make_pod("a"))
    stream = watch.Watch()
    seen = []
    async with asyncio.timeout(DEADLINE):
        async for event in stream.stream(core.list_namespaced_pod, "default", resource_version="0",
                                         timeout_seconds=5):
            seen.append((event["type"], event["object"].metadata.name))
            if len(seen) == 1:
                server.patch("pods", "a", {"metadata": {"labels": {"x": "1"}}})
            else:
                stream.stop()
    assert seen == [("ADDED", "a"), ("MODIFIED", "a")]


async def test_held_watch_delivers_nothing_then_a_paced_one_releases_in_order_and_records_when(server, http):
    """The benchmarks commit a long stream while the pod watch is held, then release it at a set
    rate: nothing may leak out while held, order must be kept, and ``marks`` says when each
    paced line went out."""
    async with http.get(watch_url(server), params={"watch": "true", "resourceVersion": "1"}) as resp:
        await wait_for(lambda: server.open_watches == 1, what="watch open")
        [watcher] = server.pace_watches("pods", rate=0)
        for i in range(30):
            server.create("pods", make_pod(f"p{i}"))
        sentinel = server.create("pods", make_pod("last"))
        assert len(watcher.pending) == 31          # all held, none written
        start = time.monotonic()
        server.pace_watches("pods", rate=200)      # 31 lines: about 0.15 s
        events = await read_events(resp, 31)
        assert [e["object"]["metadata"]["name"] for e in events] == [f"p{i}" for i in range(30)] + ["last"]
        assert events[-1]["object"]["metadata"]["resourceVersion"] == sentinel["metadata"]["resourceVersion"]
        assert watcher.sent == 31 and watcher.marks[-1][0] == 31
        assert all(t >= start for _, t in watcher.marks) and len(watcher.marks) > 1   # released in steps
        server.pace_watches("pods", rate=None)
        server.create("pods", make_pod("free"))
        [free] = await read_events(resp, 1)
        assert free["object"]["metadata"]["name"] == "free"


async def test_bookmarks_on_an_interval(http):
    fake = FakeApiServer(bookmark_interval=0.05)
    await fake.start()
    try:
        fake.create("nodes", make_node("n1"))
        params = {"watch": "true", "resourceVersion": "1", "allowWatchBookmarks": "true"}
        async with http.get(f"{fake.url}/api/v1/nodes", params=params) as resp:
            [bookmark] = await read_events(resp, 1)
            assert bookmark == {"type": "BOOKMARK", "object": {
                "kind": "Node", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}}}
    finally:
        await fake.stop()


async def test_bookmarks_on_demand_follow_the_events_before_them(server, http):
    server.create("nodes", make_node("n1"))
    params = {"watch": "true", "resourceVersion": "1", "allowWatchBookmarks": "true"}
    async with http.get(f"{server.url}/api/v1/nodes", params=params) as resp:
        await wait_until(lambda: server.open_watches == 1, "the watch to open")
        server.create("nodes", make_node("n2"))
        server.send_bookmarks()
        added, bookmark = await read_events(resp, 2)
        assert added["type"] == "ADDED"
        assert bookmark["type"] == "BOOKMARK"
        assert bookmark["object"]["metadata"]["resourceVersion"] == "2"


async def test_watch_without_bookmarks_ends_after_timeout(server, http):
    server.send_bookmarks()
    params = {"watch": "true", "resourceVersion": "0", "timeoutSeconds": "1"}
    async with http.get(watch_url(server), params=params) as resp:
        await wait_until(lambda: server.open_watches == 1, "the watch to open")
        server.send_bookmarks()             # not requested: must not be sent
        assert await read_to_end(resp) == []


async def test_too_old_resource_version_is_a_410_error_event(server, core, http):
    server.create("pods", make_pod("a"))
    since = server.resource_version
    server.create("pods", make_pod("b"))
    server.compact()
    async with http.get(watch_url(server), params={"watch": "true", "resourceVersion": "0"}) as resp:
        assert len(await read_events(resp, 2)) == 2       # RV 0 still works after compaction
    params = {"watch": "true", "resourceVersion": str(since)}
    async with http.get(watch_url(server), params=params) as resp:
        assert resp.status == 200
        assert await read_to_end(resp) == [{"type": "ERROR", "object": {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": f"too old resource version: {since} ({since + 1})", "reason": "Expired",
            "code": 410}}]
    with pytest.raises(ApiException) as exc:
        async for _ in watch.Watch().stream(core.list_namespaced_pod, "default",
                                            resource_version=str(since)):
            pass
    assert exc.value.status == 410


async def test_bounded_history_expires_old_versions(http):
    fake = FakeApiServer(history_limit=2)
    await fake.start()
    try:
        for i in range(4):
            fake.create("pods", make_pod(f"p{i}"))
        ok = {"watch": "true", "resourceVersion": "2", "timeoutSeconds": "1"}
        async with http.get(f"{fake.url}/api/v1/pods", params=ok) as resp:
            assert [e["type"] for e in await read_events(resp, 2)] == ["ADDED", "ADDED"]
        old = {"watch": "true", "resourceVersion": "1"}
        async with http.get(f"{fake.url}/api/v1/pods", params=old) as resp:
            assert (await read_to_end(resp))[0]["object"]["code"] == 410
    finally:
        await fake.stop()


async def test_drop_watches_cuts_open_streams(server, http):
    async with http.get(watch_url(server), params={"watch": "true"}) as resp:
        await wait_until(lambda: server.open_watches == 1, "the watch to open")
        server.drop_watches()
        with pytest.raises(aiohttp.ClientPayloadError):
            await read_to_end(resp)
    assert server.open_watches == 0


async def test_large_object_is_one_watch_line(server, http):
    big = "x" * (3 << 20)
    body = io.BytesIO(orjson.dumps(make_pod("big", annotations={"blob": big})))
    async with http.post(watch_url(server), data=body,
                         headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == 201
    params = {"watch": "true", "fieldSelector": "metadata.name=big"}
    received = b""
    async with http.get(watch_url(server), params=params) as resp:
        async with asyncio.timeout(DEADLINE):
            async for chunk in resp.content.iter_any():
                received += chunk
                if b"\n" in received:
                    break
    line, _, rest = received.partition(b"\n")
    assert rest == b""
    event = orjson.loads(line)
    assert event["type"] == "ADDED"
    assert event["object"]["metadata"]["annotations"]["blob"] == big


# -- faults and restarts -----------------------------------------------------------------------

async def test_error_faults(server, core, http):
    fault = server.faults.add(method="GET", path=r"/nodes$", status=500)
    with pytest.raises(ApiException) as exc:
        await core.list_node()
    assert exc.value.status == 500 and orjson.loads(exc.value.body)["reason"] == "InternalError"
    assert fault.hits == 1
    await core.list_node()                                   # times=1: the next one works

    server.faults.add(path="/pods", status=429, retry_after=2, times=None)
    for _ in range(2):
        async with http.get(watch_url(server), params={"watch": "true"}) as resp:
            assert resp.status == 429 and resp.headers["Retry-After"] == "2"
            assert (await resp.json())["reason"] == "TooManyRequests"
    server.faults.clear()
    slow = server.faults.add(path="/nodes", delay=0.01)
    assert (await core.list_node()).items == [] and slow.hits == 1

    server.faults.add(method="POST", path="/nodes$", status=504, after_apply=True)
    with pytest.raises(ApiException) as exc:     # the write lands, the client sees a timeout
        await core.create_node(make_node("n1"))
    assert exc.value.status == 504 and server.get("nodes", "n1") is not None


async def test_hang_fault_until_cleared_or_client_gives_up(server, http):
    server.faults.add(path="/api/v1/nodes", hang=True, times=None)
    with pytest.raises(asyncio.TimeoutError):
        await http.get(f"{server.url}/api/v1/nodes", timeout=aiohttp.ClientTimeout(total=0.1))
    request = asyncio.create_task(http.get(f"{server.url}/api/v1/nodes"))
    await wait_until(lambda: len([r for r in server.requests if r[1] == "/api/v1/nodes"]) == 2, "two node lists")
    assert not request.done()
    server.faults.clear()
    async with asyncio.timeout(DEADLINE):
        resp = await request
    assert resp.status == 200
    resp.release()


async def test_restart_on_the_same_port_keeps_state(server, core, http):
    server.create("pods", make_pod("a"))
    port, since = server.port, server.resource_version
    async with http.get(watch_url(server), params={"watch": "true", "resourceVersion": str(since)}) as resp:
        await wait_until(lambda: server.open_watches == 1, "the watch to open")
        server.faults.add(path="/nodes", hang=True)
        hung = asyncio.create_task(http.get(f"{server.url}/api/v1/nodes"))
        await wait_until(lambda: any(r[1] == "/api/v1/nodes" for r in server.requests), "a node list")
        async with asyncio.timeout(DEADLINE):
            await server.stop()
        with pytest.raises(aiohttp.ClientError):
            await read_to_end(resp)
        with pytest.raises(aiohttp.ClientError):
            async with asyncio.timeout(DEADLINE):
                await hung
    with pytest.raises(aiohttp.ClientConnectionError):
        await http.get(f"http://127.0.0.1:{port}/healthz")

    assert await server.start(port=port) == f"http://127.0.0.1:{port}"
    server.create("pods", make_pod("b"))
    assert (await core.read_namespaced_pod("a", "default")).metadata.name == "a"
    params = {"watch": "true", "resourceVersion": str(since)}
    async with http.get(watch_url(server), params=params) as resp:
        [event] = await read_events(resp, 1)
        assert event["object"]["metadata"]["name"] == "b"
        assert event["object"]["metadata"]["resourceVersion"] == str(since + 1)
