"""Who and what a /filter or /bind is about: the live pod a request names, checked first.

A request body is kube-scheduler's copy of a pod, or anything a caller of the extender's port
sends. Before v2.11 upstream trusted it; HAMi v2.11 (#3039/#3040) checks every /filter and /bind
against the live pod (its ``authoritativePod`` and ``verifyBindTarget``), and so does this module,
before anything is reserved, bound or released:

* the request carries a UID, the pod it names exists, and under that UID: a filter of a pod the
  API server no longer has (hand-made, or deleted just before the call) would keep a reservation
  no event ever releases, and a bind that names one pod with another's UID would act on, and on
  failure release, the other pod's devices;
* the pod is not assigned to a node already (a bind to the node it is on is the repeated bind the
  Binder answers with success);
* a bind names the node this scheduler's /filter placed the pod on.

The live pod is the pod watch's (``cache.live_pods``, four facts per pod and its name's UID), so
a /filter asks the API server nothing: kube-scheduler's scheduling cycle waits for its answer, and
every other pod with it. A pod the watch has shown under neither the UID nor the name (its watch
event still in flight) is decided as usual and confirmed after the answer (``confirm_filtered``,
one read under the pod's lock, which its /bind waits for): a reservation for a pod the API server
does not have, or has under another UID, is released then. A /bind may await, and reads the pod
on a miss.
"""
from __future__ import annotations

import structlog

from hami_py.cache.live_pods import LivePod, live_pod_of
from hami_py.cache.pod_ledger import pod_key
from hami_py.cache.usage import UsageCache
from hami_py.k8s.client import KubeApiError, KubeClient, pod_path

log = structlog.get_logger(__name__)


class Refused(Exception):
    """A request about a pod that is not (or not so) the live one. ``reason`` in HAMi's outcome
    words (metrics.OUTCOME_REASONS): identity (no UID, another UID, assigned elsewhere, another
    node than the filter's), lookup (the pod does not exist, or could not be read)."""

    def __init__(self, message: str, *, reason: str = "identity"):
        super().__init__(message)
        self.reason = reason


def require_uid(verb: str, key: str, uid: str) -> None:
    """Refused unless the request carries the pod's UID (``key``: its namespace/name)."""
    if not uid:
        raise Refused(f"{verb} request for pod {key} carries no UID")


class PodIdentity:
    """The checks both verbs make, against the watch's live pods (the API server on a miss)."""

    def __init__(self, *, cache: UsageCache, client: KubeClient):
        self.cache = cache
        self.client = client

    async def live(self, namespace: str, name: str, uid: str) -> tuple[LivePod | None, str, dict | None]:
        """(the pod's facts, its UID, the object when it had to be read): the watch's pod under
        ``uid`` when it has that name, else the pod of that name read from the API server
        ((None, "", None) when there is none). Raises Refused (lookup) when the read fails."""
        hit = self.cache.live_pods.named(uid, namespace, name)
        if hit is not None:
            return hit, uid, None
        try:
            pod = await self.client.get(pod_path(namespace, name))
        except KubeApiError as exc:
            if exc.not_found:
                return None, "", None
            raise Refused(f"get pod {namespace}/{name}: {exc}", reason="lookup") from None
        return live_pod_of(pod), (pod.get("metadata") or {}).get("uid") or "", pod

    def _assigned(self, live: LivePod, uid: str) -> str:
        """The node the pod is assigned to ("" if none): as the watch (or the read) shows it, or
        by our own Binding the watch has not shown yet."""
        return live.node or self.cache.bound_node(uid) or ""

    def for_filter(self, pod: dict) -> bool:
        """Raise Refused unless the request's pod is, as the watch shows it, a live unassigned pod
        under its UID. False when the watch shows neither the UID nor the name: the decision is
        then to be confirmed after the answer (``confirm_filtered``). Synchronous: no read."""
        meta = pod.get("metadata") or {}
        key, uid = pod_key(pod), meta.get("uid") or ""
        namespace, name = key.split("/", 1)
        require_uid("filter", key, uid)
        if uid in self.cache.deleted:
            # kube-scheduler's copy of a pod the watch showed deleted.
            raise Refused(f"pod {key} with uid {uid} was deleted", reason="lookup")
        live_pods = self.cache.live_pods
        live = live_pods.named(uid, namespace, name)
        if live is None:
            live_uid = live_pods.uid_named(namespace, name)
            if live_uid is not None:
                raise Refused(f"pod {key} has UID {live_uid}, filter request carries UID {uid}")
            if uid in live_pods:
                # Another pod's UID: a decision under it would replace that pod's charge.
                raise Refused(f"pod {key} does not carry its own UID: {uid} is another pod's")
            return False
        node = self._assigned(live, uid)
        if node:
            # Its devices are in use there: a new decision would release them.
            raise Refused(f"pod {key} is already assigned to node {node}")
        return True

    async def confirm_filtered(self, *, client: KubeClient, namespace: str, name: str, uid: str,
                               on_refused) -> None:
        """After the answer to a /filter the watch could not vouch for: read the pod, and release
        what the filter reserved or held under ``uid`` unless the API server has that pod, under
        that UID, unassigned (or assigned by our own bind meanwhile). A failed read releases too:
        kube-scheduler filters the pod again, and a reservation nothing would end is never kept.
        ``on_refused(Refused)`` is told why (the outcome counters)."""
        key = f"{namespace}/{name}"
        try:
            pod = await client.get(pod_path(namespace, name))
        except KubeApiError as exc:
            refused = Refused(f"pod {key} does not exist" if exc.not_found else f"get pod {key}: {exc}",
                              reason="lookup")
        else:
            live, live_uid = live_pod_of(pod), (pod.get("metadata") or {}).get("uid") or ""
            if live_uid != uid:
                refused = Refused(f"pod {key} has UID {live_uid}, filter request carries UID {uid}")
            elif live.node and live.node != self.cache.bound_node(uid):
                refused = Refused(f"pod {key} is already assigned to node {live.node}")
            else:
                return
        if self.cache.release_pod(uid, namespace=namespace, name=name) is not None:
            log.info("reservation released: the filtered pod is not the live one", pod=key, reason=str(refused))
        on_refused(refused)

    async def for_bind(self, namespace: str, name: str, uid: str, node: str) -> dict | None:
        """Raise Refused unless the bind names a live pod under its UID, not assigned to another
        node, and the node this scheduler's /filter placed it on (when one did). Returns the pod
        object when it had to be read (the Binder then reads it no more), else None. A pod that
        does not exist has its reservation under ``uid`` released, if that is its own."""
        key = f"{namespace}/{name}"
        require_uid("bind", key, uid)
        live, live_uid, pod = await self.live(namespace, name, uid)
        if live is None:
            self.cache.release_pod(uid, namespace=namespace, name=name)   # a stale reservation
            raise Refused(f'pod "{name}" not found', reason="lookup")
        if live_uid != uid:
            raise Refused(f"pod {key} has UID {live_uid}, bind request carries UID {uid}")
        assigned = self._assigned(live, uid)
        if assigned and assigned != node:
            raise Refused(f"pod {key} is already assigned to node {assigned}")
        scheduled = self.cache.scheduled_node(uid)
        if not assigned and scheduled is not None and scheduled != node:
            raise Refused(f"pod {key} was scheduled to node {scheduled}, bind request names node {node}")
        return pod
