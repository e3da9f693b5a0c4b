"""The defragmenter's input, loaded into the scheduler's own books.

A plan is only as good as its fit code, so the defragmenter does not model devices: it loads the
cluster (a dump, or a read-only snapshot of a live cluster) exactly as ``simulate`` does
(``hami_py.offline.cluster.load_cluster``, shared by both: registered nodes, bound pods with
their allocations), creates those objects in the in-repo API server and starts the real
scheduler against it (``open_world``). What the planner searches over is then that scheduler's
``UsageCache`` and ``Filterer``: the same kernel fit, policies, quotas and family rules /filter
uses.

Beyond what the simulator keeps, the defragmenter needs:

* pending pods: no ``spec.nodeName``, not terminal, a request for a managed device, and
  ``spec.schedulerName`` equal to this scheduler's (``--scheduler-name``);
* the full objects of bound pods (owner references, labels, annotations, priority, start);
* PodDisruptionBudgets (policy/v1).

``books_world`` builds the same books in-process, without HTTP (the cache fed the same pod
objects through its event handler): the property tests use it, where a scheduler per example
would cost seconds.
"""
from __future__ import annotations

import os
import tempfile
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson

from hami_py.cache.pod_ledger import pod_key
from hami_py.cache.usage import UsageCache
from hami_py.config import DeviceConfig
from hami_py.devices.base import DeviceVendor, RequestError
from hami_py.devices.registry import EVERY_FAMILY
from hami_py.defrag.rules import Budget, budget_from_object
from hami_py.embedded import embedded_options, running_scheduler, wait_for
from hami_py.fakeapi import FakeApiServer
from hami_py.offline.cluster import Cluster, load_cluster
from hami_py.offline.source import InputError, Where, kubernetes_objects, load_documents, plain
from hami_py.scheduling.decision.filter import Filterer
from hami_py.scheduling.admission.owned_annotations import decision_annotations
from hami_py.scheduling.decision.requests import parse_pod_requests

DEFAULT_SCHEDULER_NAME = "hami-scheduler"
_TERMINAL_PHASES = ("Succeeded", "Failed")
_WAIT_S = 60.0     # a scheduler that has not read a few hundred objects by then is broken
_PAGE = 500        # objects per list call against a live cluster


@dataclass
class Snapshot:
    """What the planner plans over, as objects: the simulator's cluster, plus pending pods and
    PodDisruptionBudgets."""
    cluster: Cluster
    pending: list[dict] = field(default_factory=list)
    budgets: list[Budget] = field(default_factory=list)

    @property
    def notes(self) -> list[str]:
        return self.cluster.notes


@dataclass
class World:
    """The scheduler's books over a snapshot, and the objects the planner reads."""
    cache: UsageCache
    filterer: Filterer
    vendors: dict[str, DeviceVendor]
    pods_by_uid: dict[str, dict]           # bound pods charged in the books, as full objects
    pending: list[dict]
    budgets: list[Budget]
    node_names: list[str]


# -- loading ------------------------------------------------------------------------------------

def load_snapshot(path: str, *, vendors: dict[str, DeviceVendor], scheduler_name: str = DEFAULT_SCHEDULER_NAME,
                  documents: list[tuple[Any, Where]] | None = None) -> Snapshot:
    """A dump (``kubectl get nodes,pods,pdb -A -o yaml``, or the simulator's cluster form);
    InputError naming file, line and field when it cannot be used. ``documents``: its YAML
    documents when the caller has parsed them (the file is parsed once either way)."""
    docs = documents if documents is not None else load_documents(path)
    cluster = load_cluster(path, vendors=vendors, documents=docs)
    snapshot = Snapshot(cluster=cluster)
    if all(isinstance(doc, dict) and "kind" in doc for doc, _ in docs):
        _extend(snapshot, kubernetes_objects(docs), vendors=vendors, scheduler_name=scheduler_name)
    return snapshot


def snapshot_from_objects(objects: list[dict], *, source: str, vendors: dict[str, DeviceVendor],
                          scheduler_name: str = DEFAULT_SCHEDULER_NAME) -> Snapshot:
    """Objects listed from a live cluster, through the same loader as a dump: they are written
    to a temporary JSON file (JSON is YAML) and read back, so a node the scheduler would reject
    is reported the same way; the message names ``source`` instead of the file."""
    with tempfile.TemporaryDirectory(prefix="hami-defrag-") as tmp:
        path = os.path.join(tmp, "snapshot.json")
        with open(path, "wb") as handle:
            handle.write(orjson.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
        try:
            snapshot = load_snapshot(path, vendors=vendors, scheduler_name=scheduler_name)
        except InputError as exc:
            raise InputError(source, None, exc.field, exc.problem) from None
    snapshot.cluster.path = source
    return snapshot


def _extend(snapshot: Snapshot, objects, *, vendors: dict[str, DeviceVendor], scheduler_name: str) -> None:
    """Pending pods of this scheduler and PodDisruptionBudgets, from the dump's objects."""
    owned = decision_annotations(vendors)
    vendor_ids = {key: i for i, key in enumerate(vendors)}
    skipped: list[str] = []
    # The cluster loader kept the budgets (the simulator's moves honour them too).
    snapshot.budgets.extend(budget_from_object(obj) for obj in snapshot.cluster.budgets)
    for obj, where in objects:
        kind = obj.get("kind")
        if kind == "Pod":
            pod = _pending_pod(obj, where, owned=owned, scheduler_name=scheduler_name)
            if pod is None:
                continue
            try:
                request = parse_pod_requests(pod, vendors, vendor_ids)
            except RequestError as exc:
                skipped.append(f"{pod_key(pod)} ({exc})")
                continue
            if request is not None:
                snapshot.pending.append(pod)
    _recount_notes(snapshot)
    if snapshot.pending:
        snapshot.cluster.notes.append(f"{len(snapshot.pending)} pending pod(s) of {scheduler_name} ask for devices")
    if skipped:
        snapshot.cluster.notes.append("ignored pending pod(s) whose request the scheduler rejects: "
                                      + ", ".join(skipped[:3]) + (" ..." if len(skipped) > 3 else ""))


def _recount_notes(snapshot: Snapshot) -> None:
    """The simulator's loader ignores pending pods; here they are used, so its note saying so is
    corrected."""
    notes = []
    for note in snapshot.cluster.notes:
        if note.startswith("ignored ") and "pod(s) that hold no HAMi allocation" in note:
            left = int(note.split()[1]) - len(snapshot.pending)
            if left <= 0:
                continue
            note = f"ignored {left} pod(s) that hold no HAMi allocation on a listed node and are not pending for it"
        notes.append(note)
    snapshot.cluster.notes[:] = notes


def _pending_pod(obj: dict, where: Where, *, owned: frozenset[str], scheduler_name: str) -> dict | None:
    """The pod as the planner should decide it, or None when it is not a pending pod of ours.
    A decision left on it (an earlier filter's) is dropped, as scheduling/verbs/stale.py clears it."""
    meta = obj.get("metadata")
    spec = obj.get("spec")
    status = obj.get("status") if isinstance(obj.get("status"), dict) else {}
    if not isinstance(meta, dict) or not isinstance(spec, dict):
        raise where.error("a Pod needs metadata and spec")
    if spec.get("nodeName") or status.get("phase") in _TERMINAL_PHASES:
        return None
    if (spec.get("schedulerName") or "default-scheduler") != scheduler_name:
        return None
    if not isinstance(meta.get("name"), str) or not meta["name"]:
        raise where.at(obj, "metadata").error('missing required field "name"')
    pod = plain(obj)
    pod["metadata"].setdefault("namespace", "default")
    pod["metadata"]["uid"] = pod["metadata"].get("uid") or f"pending-{pod['metadata']['namespace']}-{meta['name']}"
    annotations = pod["metadata"].get("annotations") or {}
    pod["metadata"]["annotations"] = {k: str(v) for k, v in annotations.items() if k not in owned}
    return pod


# -- the books ----------------------------------------------------------------------------------

@asynccontextmanager
async def open_world(snapshot: Snapshot, *, device_config: DeviceConfig, node_policy: str = "binpack",
                     gpu_policy: str = "spread"):
    """The real scheduler over the snapshot, on the in-repo API server: its books once every node
    and every running pod is registered. Nothing outside this process is touched."""
    cluster = snapshot.cluster
    api = FakeApiServer()
    await api.start()
    try:
        for node in cluster.nodes:
            api.create("nodes", node)
        running = [api.create("pods", pod) for pod in cluster.existing_pods]
        options = embedded_options(node_scheduler_policy=node_policy, gpu_scheduler_policy=gpu_policy,
                                   metrics_bind_address="", enable_ascend=EVERY_FAMILY.enable_ascend,
                                   enable_iluvatar=EVERY_FAMILY.enable_iluvatar)
        async with running_scheduler(api, options=options, device_config=device_config,
                                     device_plugin=False) as app:
            uids = [p["metadata"]["uid"] for p in running]
            await wait_for(lambda: all(n in app.cache.nodes for n in cluster.node_names)
                           and all(u in app.cache.pods for u in uids), timeout=_WAIT_S,
                           what="the scheduler to register every node and running pod")
            yield World(cache=app.cache, filterer=app.service.filterer, vendors=app.vendors,
                        pods_by_uid={p["metadata"]["uid"]: p for p in running}, pending=list(snapshot.pending),
                        budgets=list(snapshot.budgets), node_names=cluster.node_names)
    finally:
        await api.stop()


def books_world(*, nodes: list[dict], running: list[dict], vendors: dict[str, DeviceVendor],
                pending: list[dict] | None = None, budgets: list[Budget] | None = None,
                node_policy: str = "binpack", gpu_policy: str = "spread") -> World:
    """The same books built in-process: each node through the cache's node upsert, each running
    pod through its pod event handler (as the informers feed them). Running pods without a
    resourceVersion get one: the books count only pods seen from the API server as bound."""
    cache = UsageCache(vendors)
    for node in nodes:
        cache.upsert_node(node)
    by_uid = {}
    for i, pod in enumerate(running):
        pod["metadata"].setdefault("resourceVersion", str(i + 1))
        cache.on_pod_event("ADDED", pod)
        by_uid[pod["metadata"]["uid"]] = pod
    filterer = Filterer(cache, vendors, default_node_policy=node_policy, default_gpu_policy=gpu_policy)
    return World(cache=cache, filterer=filterer, vendors=vendors, pods_by_uid=by_uid, pending=list(pending or []),
                 budgets=list(budgets or []), node_names=[n["metadata"]["name"] for n in nodes])


# -- a live cluster -----------------------------------------------------------------------------

async def snapshot_live(*, kubeconfig: str, context: str | None, vendors: dict[str, DeviceVendor],
                        scheduler_name: str = DEFAULT_SCHEDULER_NAME) -> Snapshot:
    """Nodes, pods (all namespaces) and PodDisruptionBudgets, listed read-only."""
    objects = await list_live(kubeconfig=kubeconfig, context=context)
    return snapshot_from_objects(objects, source=live_source(kubeconfig, context), vendors=vendors,
                                 scheduler_name=scheduler_name)


async def list_live(*, kubeconfig: str, context: str | None) -> list[dict]:
    """The objects ``snapshot_live`` loads, listed read-only (the remote-GPU decision reads them
    before the families are built: hami_py/offline/remote_gpus.py)."""
    client = await live_client(kubeconfig=kubeconfig, context=context)
    try:
        objects = []
        for path, kind in (("/api/v1/nodes", "Node"), ("/api/v1/pods", "Pod"),
                           ("/apis/policy/v1/poddisruptionbudgets", "PodDisruptionBudget")):
            objects.extend(await _list_all(client, path, kind))
    finally:
        await client.close()
    return objects


def live_source(kubeconfig: str, context: str | None) -> str:
    return kubeconfig + (f" (context {context})" if context else "")


async def live_client(*, kubeconfig: str, context: str | None):
    """A KubeClient for the kubeconfig's context (its current one when None)."""
    from hami_py.k8s.client import KubeClient, load_configuration
    return KubeClient(await load_configuration(kubeconfig, context=context), qps=20, burst=40)


async def _list_all(client, path: str, kind: str) -> list[dict]:
    items: list[dict] = []
    token = ""
    while True:
        query = [("limit", str(_PAGE))] + ([("continue", token)] if token else [])
        page = await client.get(path, query=query)
        for item in page.get("items") or []:
            item.setdefault("kind", kind)
            items.append(item)
        token = (page.get("metadata") or {}).get("continue") or ""
        if not token:
            return items
