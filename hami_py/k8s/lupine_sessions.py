"""Session stubs: one relay pod on each remote-GPU ("lupine") server node, kept by the leader.

Someone reaching the GPU fleet by hand (an interactive session, a notebook) port-forwards to a
stub, never to the server: port-forward rights can then be granted on pods that do nothing but
relay, in the scheduler's namespace, instead of on the namespace the servers run in. A stub lives
as long as its server, so one is always there to forward to and nothing has to be created at the
moment a session starts. This is upstream's ``ReconcileSessionStubs`` (HAMi #3013), as a
coroutine of the Kubernetes layer:

* the servers are the nodes labelled ``hami.io/lupine-server`` (the value is the port: empty,
  unreadable or out of range means the configured default, 14833) that have an InternalIP, as
  the scheduler's node watch knows them: the remote-GPU family's server set
  (``RemoteGPUVendor.server_nodes``, confirmed by the books), so a pass lists only the stubs;
* each gets the pod ``lupine-session-<node>``, assigned to the node (no scheduler places it: a
  server node offers no devices), tolerating every taint, labelled ``hami.io/lupine-session=<node>``,
  relaying its server's port to ``LUPINE_ENDPOINT`` (``<InternalIP>:<port>``) with socat;
* a stub whose server is gone, whose endpoint or image no longer matches, or that has finished
  (evicted) is deleted, and a fresh one is created in its place once the old one has gone;
* a pass before the node watch has listed every node, or that cannot list the stubs, changes
  nothing: acting on half a view would delete the stubs of servers that are still there.

Only the leader reconciles (two replicas would create and delete each other's stubs), and only
when a session image is configured: without one nobody asked for stubs, and none is made.
Deliberate differences from upstream: a stub is also replaced when the image changes or the pod
has finished (upstream keeps an evicted stub forever), a node name too long for a pod name or a
label value is shortened with a hash of it, and the relay runs socat directly with Kubernetes'
``$(LUPINE_ENDPOINT)`` expansion (upstream goes through ``sh -c``, so its image needs a shell).
"""
from __future__ import annotations

import asyncio
import hashlib
import re
from dataclasses import dataclass, field
from typing import Callable, Mapping

import structlog

from hami_py.devices.remotegpu.config import DEFAULT_PORT, SERVER_LABEL
from hami_py.k8s.client import KubeApiError, KubeClient, pod_path

log = structlog.get_logger(__name__)

SESSION_LABEL = "hami.io/lupine-session"
STUB_PREFIX = "lupine-session-"
ENDPOINT_ENV = "LUPINE_ENDPOINT"
RELAY_CONTAINER = "relay"
INTERVAL_S = 15.0       # the pace of the leader's other upkeep (registration sweeps)
UNSYNCED_RETRY_S = 1.0  # how soon a pass skipped for the node watch's first list is tried again

_POD_NAME_MAX = 253     # a DNS subdomain
_LABEL_VALUE_MAX = 63
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


@dataclass
class SessionPass:
    """What one reconcile pass did (pod names), for logs and tests."""
    created: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)    # writes the API server refused
    skipped: bool = False                              # no full view: nothing was touched


# -- what the stubs should be --------------------------------------------------------------------

def _shortened(text: str, limit: int) -> str:
    """``text`` if it fits, else a prefix and a hash of the whole (still unique, still valid)."""
    if len(text) <= limit:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    return text[:limit - len(digest) - 1].rstrip("-.") + "-" + digest


def stub_name(node: str) -> str:
    return _shortened(STUB_PREFIX + node, _POD_NAME_MAX)


def session_label_value(node: str) -> str:
    value = _shortened(node, _LABEL_VALUE_MAX)
    return value if _LABEL_VALUE.fullmatch(value) else hashlib.sha256(node.encode()).hexdigest()[:20]


def session_stub(*, namespace: str, node: str, endpoint: str, image: str) -> dict:
    """The relay pod for one server. It listens on the server's own port, so a user forwards
    the port they would have used against the server itself."""
    port = int(endpoint.rpartition(":")[2])
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": stub_name(node), "namespace": namespace,
            "labels": {SESSION_LABEL: session_label_value(node),
                       "app.kubernetes.io/component": "hami-lupine-session",
                       "app.kubernetes.io/managed-by": "hami-scheduler",
                       "hami.io/webhook": "ignore"},      # nothing for the webhook to do here
        },
        "spec": {
            "nodeName": node,
            # Whatever keeps workloads off a server node must not keep its own relay off it.
            "tolerations": [{"operator": "Exists"}],
            "restartPolicy": "Always",
            "containers": [{
                "name": RELAY_CONTAINER, "image": image,
                "env": [{"name": ENDPOINT_ENV, "value": endpoint}],
                "command": ["socat", f"TCP-LISTEN:{port},fork,reuseaddr", f"TCP:$({ENDPOINT_ENV})"],
                "ports": [{"name": "lupine", "containerPort": port, "protocol": "TCP"}],
            }],
        },
    }


def _stub_node(stub: dict) -> str:
    return (stub.get("spec") or {}).get("nodeName") or ""


def _matches(stub: dict, *, endpoint: str, image: str) -> bool:
    """The stub relays to ``endpoint`` from ``image`` and can still run."""
    if (stub.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return False
    containers = (stub.get("spec") or {}).get("containers") or ()
    relay = next((c for c in containers if c.get("name") == RELAY_CONTAINER), None)
    if relay is None or relay.get("image") != image:
        return False
    return any(var.get("name") == ENDPOINT_ENV and var.get("value") == endpoint for var in relay.get("env") or ())


# -- one pass -------------------------------------------------------------------------------------

async def reconcile_session_stubs(*, client: KubeClient, namespace: str, image: str,
                                  servers: Mapping[str, str] | None) -> SessionPass:
    """Bring the stubs in ``namespace`` in line with ``servers`` (server node → its endpoint,
    "" when it has no InternalIP; None: the node watch has not listed the nodes yet), once."""
    done = SessionPass()
    if servers is None:
        log.debug("session stubs left alone until the node watch has listed the nodes")
        done.skipped = True
        return done
    try:
        stubs = (await client.get(f"/api/v1/namespaces/{namespace}/pods",
                                  query=[("labelSelector", SESSION_LABEL)])).get("items") or []
    except KubeApiError as exc:
        log.warning("session stubs left alone: cannot list them", error=str(exc))
        done.skipped = True
        return done
    wanted = {node: endpoint for node, endpoint in servers.items() if endpoint}
    if len(wanted) < len(servers):
        log.debug("lupine servers without an InternalIP: no session stub",
                  nodes=sorted(set(servers) - set(wanted)))

    settled: set[str] = set()       # nodes whose stub is right, or still terminating under its name
    for stub in stubs:
        meta = stub.get("metadata") or {}
        node = _stub_node(stub)
        if meta.get("deletionTimestamp"):
            settled.add(node)       # a pod of that name is still going: create it again next pass
            continue
        endpoint = wanted.get(node)
        if endpoint is not None and meta.get("name") == stub_name(node) \
                and _matches(stub, endpoint=endpoint, image=image):
            settled.add(node)
            continue
        await _delete(client, namespace, stub, done)

    for node, endpoint in sorted(wanted.items()):
        if node not in settled:
            await _create(client, session_stub(namespace=namespace, node=node, endpoint=endpoint, image=image), done)
    if done.created or done.deleted or done.failed:
        log.info("session stubs reconciled", namespace=namespace, servers=len(wanted), created=done.created,
                 deleted=done.deleted, failed=done.failed)
    return done


async def _delete(client: KubeClient, namespace: str, stub: dict, done: SessionPass) -> None:
    meta = stub["metadata"]
    # Exactly the pod judged here: a stub recreated in between (another leader's) is left alone.
    options = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": meta.get("uid")}}
    try:
        await client.request("DELETE", pod_path(namespace, meta["name"]), body=options)
    except KubeApiError as exc:
        if exc.not_found or exc.conflict:
            return                  # already gone, or replaced: the next pass looks again
        log.warning("session stub not deleted", pod=meta["name"], error=str(exc))
        done.failed.append(meta["name"])
        return
    log.info("session stub deleted", pod=meta["name"], node=_stub_node(stub))
    done.deleted.append(meta["name"])


async def _create(client: KubeClient, stub: dict, done: SessionPass) -> None:
    meta = stub["metadata"]
    try:
        await client.post(f"/api/v1/namespaces/{meta['namespace']}/pods", stub)
    except KubeApiError as exc:
        if exc.conflict:
            return                  # already there (created since our list): judged next pass
        log.warning("session stub not created", pod=meta["name"], error=str(exc))
        done.failed.append(meta["name"])
        return
    endpoint = stub["spec"]["containers"][0]["env"][0]["value"]
    log.info("session stub created", pod=meta["name"], node=stub["spec"]["nodeName"], endpoint=endpoint)
    done.created.append(meta["name"])


# -- the leader's loop ----------------------------------------------------------------------------

async def keep_session_stubs(*, client: KubeClient, namespace: str, image: str, leading: Callable[[], bool],
                             servers: Callable[[], Mapping[str, str] | None], interval_s: float = INTERVAL_S,
                             wake: asyncio.Event | None = None) -> None:
    """Reconcile with ``servers()`` (see ``reconcile_session_stubs``) every ``interval_s`` (or
    when ``wake`` is set, e.g. on winning leadership; within ``UNSYNCED_RETRY_S`` while the
    node watch has not listed the nodes) while ``leading()``; runs until cancelled. Returns at
    once, doing nothing, without a session image or a namespace to run the stubs in."""
    if not image:
        log.debug("no lupine session image configured: no session stubs")
        return
    if not namespace:
        log.warning("no namespace for lupine session stubs (POD_NAMESPACE unset): none are kept")
        return
    wake = wake if wake is not None else asyncio.Event()
    while True:
        pause = interval_s
        if leading():
            known = servers()
            await reconcile_session_stubs(client=client, namespace=namespace, image=image, servers=known)
            if known is None:
                pause = min(interval_s, UNSYNCED_RETRY_S)
        try:
            # Not asyncio.wait_for: see RegistrationKeeper._run (a wake-up can swallow a cancel).
            async with asyncio.timeout(pause):
                await wake.wait()
        except TimeoutError:
            pass
        wake.clear()


__all__ = ["DEFAULT_PORT", "ENDPOINT_ENV", "SERVER_LABEL", "SESSION_LABEL", "STUB_PREFIX", "SessionPass",
           "keep_session_stubs", "reconcile_session_stubs", "session_label_value", "session_stub", "stub_name"]
