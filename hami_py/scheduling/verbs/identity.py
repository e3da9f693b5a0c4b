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

The live pod is the pod watch's (``cache.live_pods``, four facts per pod), so the common case asks
the API server nothing; a pod the watch has not shown yet, or shown under another UID, is read.
"""
from __future__ import annotations

from hami_py.cache.live_pods import LivePod, live_pod_of
from hami_py.cache.pod_ledger import pod_key
from hami_py.cache.usage import UsageCache
from hami_py.k8s.client import KubeApiError, KubeClient, pod_path


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

    async def for_filter(self, pod: dict) -> None:
        """Raise Refused unless the request's pod is a live, unassigned pod under its UID."""
        meta = pod.get("metadata") or {}
        key, uid = pod_key(pod), meta.get("uid") or ""
        namespace, name = key.split("/", 1)
        require_uid("filter", key, uid)
        if uid in self.cache.deleted:
            # kube-scheduler's copy of a pod the watch showed deleted: known without a read.
            raise Refused(f"pod {key} with uid {uid} was deleted", reason="lookup")
        live, live_uid, _ = await self.live(namespace, name, uid)
        if live is None:
            raise Refused(f"pod {key} does not exist", reason="lookup")
        if live_uid != uid:
            raise Refused(f"pod {key} has UID {live_uid}, filter request carries UID {uid}")
        node = self._assigned(live, uid)
        if node:
            # Its devices are in use there: a new decision would release them.
            raise Refused(f"pod {key} is already assigned to node {node}")

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
