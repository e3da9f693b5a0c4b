"""Shared fixtures: an embedded API server, a real scheduler watching it, and an extender client.

Every end-to-end test talks HTTP: the scheduler to the in-repo API server through
kubernetes-asyncio, and the test (playing kube-scheduler) to the scheduler's extender port.
"""
from __future__ import annotations

import asyncio
import ssl

import aiohttp
import pytest
import structlog
import trustme

from hami_py.embedded import embedded_options, running_scheduler, wait_for
from hami_py.fakeapi import FakeApiServer
from hami_py.fakeapi.kubescheduler import ExtenderClient
from hami_py.fakeapi.objects import gpu_pod


@pytest.fixture(autouse=True)
def _restore_logging():
    """A test that runs a CLI (``hami-scheduler simulate`` configures logging) binds structlog to
    the stderr pytest captured for that test, closed once it ends: later tests would log into a
    closed file (and a log call inside a TLS handshake would abort the handshake)."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


@pytest.fixture
async def api():
    server = FakeApiServer()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


# A pod filtered and never bound gets its FilteringSucceed once this window passes (10 s by
# default): tests that read that Event run with this one.
UNBOUND_WINDOW_S = 0.2


@pytest.fixture
def scheduler_options():
    """Override in a test module to start the scheduler with other flags."""
    return embedded_options()


@pytest.fixture
async def app(api, scheduler_options):
    async with running_scheduler(api, options=scheduler_options) as running:
        yield running


@pytest.fixture
async def extender(app):
    client = ExtenderClient(app.url)
    try:
        yield client
    finally:
        await client.close()


def assert_books_balance(app) -> None:
    """The cache's per-device usage equals a recount from its pod records, and no device is
    charged beyond its capacity."""
    cache = app.cache
    recount = cache.recount()
    for j, dev_id in enumerate(cache.device_ids):
        if not dev_id or cache.vendor[j] < 0:
            continue
        slots, mem, cores = recount.get(dev_id, (0, 0, 0))
        assert (cache.used[j], cache.used_mem[j], cache.used_cores[j]) == (slots, mem, cores), dev_id
        assert cache.used[j] <= cache.count[j], f"{dev_id} slots oversubscribed"
        assert cache.used_mem[j] <= cache.total_mem[j], f"{dev_id} memory oversubscribed"
        assert cache.used_cores[j] <= max(cache.total_cores[j], 100), f"{dev_id} cores oversubscribed"


async def wait_until(predicate, what="condition", timeout=10.0):
    await wait_for(predicate, timeout=timeout, what=what)


# -- scenario helpers shared by the end-to-end modules ------------------------------------------

HANDSHAKE = "hami.io/node-handshake"


async def register_nodes(api, app, *nodes: dict) -> list[str]:
    """Create the nodes and wait until the scheduler has their devices; their names."""
    for node in nodes:
        api.create("nodes", node)
    names = [n["metadata"]["name"] for n in nodes]
    await wait_until(lambda: all(n in app.cache.node_index_of for n in names), f"nodes {names} registered")
    return names


def container(limits: dict | None = None, requests: dict | None = None, name: str = "main", *,
              image: str | None = None, env: list | None = None) -> dict:
    """A pod's container with these resource limits and requests (either may be absent)."""
    resources = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    out = {"name": name, "resources": resources}
    if image is not None:
        out["image"] = image
    if env is not None:
        out["env"] = env
    return out


def device_pod(name: str, limits: dict, annotations: dict | None = None) -> dict:
    """A one-container pod for hami-scheduler asking for ``limits`` (any family's resources)."""
    pod = gpu_pod(name, annotations=annotations)
    pod["spec"]["containers"][0]["resources"] = {"limits": limits}
    return pod


async def place(api, extender, pod: dict, node_names: list[str]) -> tuple[dict, dict]:
    """Create the pod in the API server and filter it: (stored pod, ExtenderFilterResult)."""
    created = api.create("pods", pod)
    return created, await extender.filter(created, node_names)


async def bind_placed(api, app, extender, pod: dict, result: dict) -> dict:
    """Bind a pod /filter placed (``result``) onto the node it chose, as kube-scheduler does next,
    and wait until the scheduler's pod watch has seen the Binding: the stored pod, which from
    then on carries the decision (/filter itself writes nothing)."""
    node = result["NodeNames"][0]
    assert (await extender.bind(pod, node)) == {"Error": ""}
    meta = pod["metadata"]
    stored = api.get("pods", meta["name"], namespace=meta.get("namespace") or "default")
    await pod_events_applied(app, stored)
    return stored


def decision_of(api, name: str, namespace: str = "default") -> dict:
    """The pod's annotations as the API server has them (after its bind: the decision)."""
    return api.get("pods", name, namespace=namespace)["metadata"].get("annotations") or {}


def decision_annotations(api, app, name: str, namespace: str = "default") -> dict:
    """The pod's annotations with its scheduling decision in them, as they are once it is bound.

    A bound pod: as the API server has them (the Binding wrote the decision). A pod /filter
    placed but not bound yet carries no decision (asserted: /filter writes nothing), and what its
    Binding will write is its live reservation's annotations, laid over the pod's own."""
    pod = api.get("pods", name, namespace=namespace)
    annotations = dict(pod["metadata"].get("annotations") or {})
    if pod["spec"].get("nodeName"):
        return annotations
    record = app.cache.pods.get(pod["metadata"]["uid"])
    assert record is not None and record.annotations is not None, f"{namespace}/{name} has no reservation"
    assert not set(record.annotations) & set(annotations), f"{namespace}/{name} carries a decision unbound"
    return {**annotations, **record.annotations}


def node_list(*nodes: dict) -> dict:
    """A NodeList as kube-scheduler sends it on the ``Nodes`` path (``nodeCacheCapable: false``)."""
    return {"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": list(nodes)}


def informer_of(app, resource: str):
    """The running scheduler's (one) informer of ``/api/v1/<resource>``."""
    informers = [i for i in app.informers if i.path == f"/api/v1/{resource}"]
    assert len(informers) == 1, f"expected one {resource} informer, have {len(informers)}"
    return informers[0]


async def watch_applied(app, resource: str, rv) -> None:
    """Wait until the scheduler's ``resource`` informer has handled every event up to the API
    server's resourceVersion ``rv`` (of a write the test made): its handler has run for that write."""
    informer, target = informer_of(app, resource), int(rv)
    await wait_until(lambda: int(informer.resource_version or 0) >= target,
                     f"the {resource} watch to reach resourceVersion {target}")


async def pod_events_applied(app, written: dict) -> None:
    """Wait until the scheduler has handled the pod event of ``written`` (what api.create/patch returned)."""
    await watch_applied(app, "pods", written["metadata"]["resourceVersion"])


async def filtered(app, extender, pod: dict, nodes: list[str]) -> dict:
    """A /filter's answer, once the work it left for after the answer (a preemption's evictions,
    a stale decision's cleanup) has ended too."""
    result = await extender.filter(pod, nodes)
    await asyncio.wait_for(app.service.settled(), timeout=10.0)
    return result


async def create_quota(api, app, hard: dict, *, namespace: str = "team", name: str = "gpu") -> dict:
    """Create a ResourceQuota with ``spec.hard`` and wait until the scheduler's quota book has it."""
    created = api.create("resourcequotas", {"apiVersion": "v1", "kind": "ResourceQuota",
                                            "metadata": {"name": name, "namespace": namespace},
                                            "spec": {"hard": hard}})
    await watch_applied(app, "resourcequotas", created["metadata"]["resourceVersion"])
    return created


def handshake_of(api, node: str = "n1") -> str | None:
    """The node's ``hami.io/node-handshake`` annotation, None when absent."""
    return (api.get("nodes", node)["metadata"].get("annotations") or {}).get(HANDSHAKE)


async def keeper_passes(app, count: int) -> None:
    """Let the registration keeper run ``count`` more passes of its own (proof that time went by for it)."""
    target = app.keeper.stats.passes + count
    await wait_until(lambda: app.keeper.stats.passes >= target, f"{count} keeper passes", timeout=20)


@pytest.fixture(scope="module")
def ca():
    """A throwaway certificate authority for the TLS tests."""
    return trustme.CA()


@pytest.fixture
async def https(ca):
    """A client session that trusts only the test CA (verification on, as the API server does)."""
    context = ssl.create_default_context()
    ca.configure_trust(context)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
        yield session


# -- the real control plane (etcd, kube-apiserver, kube-scheduler): tests/realk8s_fixtures.py --
from tests.realk8s_fixtures import (  # noqa: E402,F401  (fixtures and hooks, found by name)
    _real_k8s_no_forbidden, control_plane, kube_scheduler_binary, pytest_collection_modifyitems,
    pytest_deselected, pytest_runtest_makereport, pytest_terminal_summary, real_extender, real_hami,
    real_k8s_binaries, real_kube, real_namespace, real_nodes, real_options,
)


class Gate:
    """A token bucket held shut until the test opens it (a stand-in for a drained budget)."""

    def __init__(self):
        self.open = asyncio.Event()
        self.waiting = 0

    async def acquire(self):
        self.waiting += 1
        try:
            await self.open.wait()
        finally:
            self.waiting -= 1
