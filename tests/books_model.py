"""One set of books, checked: a scheduler's usage cache driven step by step as a cluster drives it,
and beside it a model rebuilt from nothing but the pods' annotations.

The model is what upstream HAMi does on every /filter: it reads every pod's charge back from the
annotations the pod carries (or, for a pod that is only reserved, the annotations its Binding will
write). ``World`` applies the steps kube-scheduler, the API server and a device plugin take
(filter, bind with the Binding's annotations copied onto the pod, the plugin's ``success``,
delete, a scheduler restart) to a live ``UsageCache``; ``probe`` asks it and the model the same
question and ``answers`` compares them. In-process on purpose: the steps are the informer's own
handlers and ``Filterer.decide``, thousands of them a second, so hypothesis can search sequences.
"""
from __future__ import annotations

import copy
import itertools

from hami_py.cache.pod_states import PodState
from hami_py.cache.records import BIND_PHASE_ANNOTATION
from hami_py.scheduling.verbs.bind import BIND_TIME_ANNOTATION
from hami_py.cache.usage import UsageCache
from hami_py.config import DeviceConfig
from hami_py.devices.registry import FamilySwitches, build_vendors
from hami_py.scheduling.decision.filter import Filterer
from hami_py.scheduling.decision.requests import parse_pod_requests

_CONFIG = DeviceConfig.default()
# Remote GPUs are off in the chart's config; on here, so that their charges (on a server node, for
# a pod placed on another) are checked too, and every family's books run beside a pooled family.
_CONFIG.sections["remotegpu"] = {"resourceCountName": "nvidia.com/remote-gpu",
                                 "resourceMemoryName": "nvidia.com/remote-gpu-memory"}
VENDORS = build_vendors(_CONFIG, FamilySwitches(enable_ascend=True, enable_iluvatar=True))


def books_pod(name: str, containers: list[dict], *, init: list[dict] | None = None,
              annotations: dict | None = None) -> dict:
    """A pending pod for hami-scheduler with these containers (each ``{"name", "resources"}``)."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}",
                         "annotations": dict(annotations or {})},
            "spec": {"schedulerName": "hami-scheduler", "initContainers": list(init or []),
                     "containers": list(containers)},
            "status": {"phase": "Pending"}}


class World:
    """A cluster's API objects and a scheduler's live books over them, moved one step at a time."""

    def __init__(self, nodes: list[dict], vendors=VENDORS):
        self.vendors = vendors
        self.node_objects = nodes
        self.names = [n["metadata"]["name"] for n in nodes]
        self.rv = itertools.count(1)
        self.objects: dict[str, dict] = {}      # the API server's pods by UID
        self.decisions: dict[str, dict] = {}    # a reserved pod's decision annotations (filter → bind)
        self.cache, self.filterer = self._scheduler()

    def _scheduler(self) -> tuple[UsageCache, Filterer]:
        cache = UsageCache(self.vendors)
        cache.replace_nodes(copy.deepcopy(self.node_objects))
        cache.replace_pods([copy.deepcopy(p) for p in self.objects.values()], None)
        return cache, Filterer(cache, self.vendors)

    def _stamp(self, pod: dict) -> dict:
        pod["metadata"]["resourceVersion"] = str(next(self.rv))
        return pod

    def _event(self, kind: str, pod: dict) -> None:
        self.cache.on_pod_event(kind, copy.deepcopy(pod))

    # -- the steps ---------------------------------------------------------------------------------
    def create(self, pod: dict) -> dict:
        stored = self._stamp(copy.deepcopy(pod))
        self.objects[stored["metadata"]["uid"]] = stored
        self._event("ADDED", stored)
        return stored

    def filter(self, uid: str) -> str | None:
        """/filter of a pending pod: its decision is reserved (nothing written); the node or None."""
        pod = self.objects[uid]
        request = parse_pod_requests(pod, self.vendors, self.cache.vendor_ids)
        decision = self.filterer.decide(pod, self.names, request)
        if decision.node is None:
            self.decisions.pop(uid, None)
            return None
        decision.keep_for_bind(pod)
        self.decisions[uid] = decision.annotations
        return decision.node

    def _binding(self, uid: str) -> dict[str, str]:
        """The annotations the Binding of a reserved pod carries: the decision's, bind-phase
        ``allocating`` and the bind time (scheduling/verbs/bind.py)."""
        return {**self.decisions[uid], BIND_PHASE_ANNOTATION: "allocating", BIND_TIME_ANNOTATION: "1767225600"}

    def bind(self, uid: str) -> None:
        """/bind of a reserved pod: the API server copies the Binding's annotations onto the pod
        and sets its node; the Binder marks its reservation bound first, as it does."""
        annotations = self._binding(uid)
        del self.decisions[uid]
        record = self.cache.pods.get(uid)
        if record is not None:
            self.cache.mark_bound(record)
        pod = self.objects[uid]
        pod["metadata"]["annotations"].update(annotations)
        pod["spec"]["nodeName"] = annotations["hami.io/vgpu-node"]
        self._event("MODIFIED", self._stamp(pod))

    def allocated(self, uid: str) -> None:
        """The device plugin's answer: bind-phase ``success``, the pod running."""
        pod = self.objects[uid]
        pod["metadata"]["annotations"][BIND_PHASE_ANNOTATION] = "success"
        pod["status"]["phase"] = "Running"
        self._event("MODIFIED", self._stamp(pod))

    def init_finished(self, uid: str) -> None:
        """The kubelet's report that every ordinary init container succeeded (a native sidecar
        among them keeps running)."""
        pod = self.objects[uid]
        statuses = []
        for container in pod["spec"].get("initContainers") or []:
            state = ({"running": {}} if container.get("restartPolicy") == "Always"
                     else {"terminated": {"exitCode": 0}})
            statuses.append({"name": container["name"], "state": state})
        pod["status"]["initContainerStatuses"] = statuses
        self._event("MODIFIED", self._stamp(pod))

    def delete(self, uid: str) -> None:
        pod = self.objects.pop(uid)
        self.decisions.pop(uid, None)
        self._event("DELETED", self._stamp(pod))

    def restart(self) -> None:
        """A new scheduler process: the books rebuilt from the API server's objects alone
        (reservations not bound yet are gone with the old process)."""
        self.decisions.clear()
        self.cache, self.filterer = self._scheduler()

    # -- the questions ---------------------------------------------------------------------------
    def model(self) -> "World":
        """The same cluster as upstream sees it: every pod charged from its annotations, a reserved
        one from the annotations its Binding will carry."""
        model = World.__new__(World)
        model.vendors, model.node_objects, model.names = self.vendors, self.node_objects, self.names
        model.rv, model.decisions = self.rv, {}
        model.objects = {}
        for uid, pod in self.objects.items():
            pod = copy.deepcopy(pod)
            if uid in self.decisions:
                pod["metadata"]["annotations"].update(self._binding(uid))
                pod["spec"]["nodeName"] = self.decisions[uid]["hami.io/vgpu-node"]
            model.objects[uid] = pod
        model.cache, model.filterer = model._scheduler()
        return model

    def probe(self, pod: dict) -> tuple[str | None, dict[str, str]]:
        """Where a /filter would place ``pod`` and why the other nodes fail, reserving nothing."""
        request = parse_pod_requests(pod, self.vendors, self.cache.vendor_ids)
        decision = self.filterer.decide(pod, self.names, request, reserve=False)
        return decision.node, decision.failed

    def pending(self) -> list[str]:
        return [u for u, p in self.objects.items() if not p["spec"].get("nodeName") and u not in self.decisions]

    def reserved(self) -> list[str]:
        return list(self.decisions)

    def bound(self) -> list[str]:
        return [u for u, p in self.objects.items() if p["spec"].get("nodeName")]

    def expected_states(self) -> dict[str, PodState]:
        """Each charged pod's state as the API server's objects and the steps taken say it must be
        (cache/pod_states.py): reserved while only our /filter's, bound once the object shows the
        Binding, allocated once the device plugin answered. A pod without a decision has none."""
        states = {uid: PodState.RESERVED for uid in self.decisions}
        for uid, pod in self.objects.items():
            if pod["spec"].get("nodeName") and "hami.io/vgpu-node" in pod["metadata"]["annotations"]:
                done = pod["metadata"]["annotations"].get(BIND_PHASE_ANNOTATION) in ("success", "failed")
                states[uid] = PodState.ALLOCATED if done else PodState.BOUND
        return states
