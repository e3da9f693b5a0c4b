"""Every pod the pod watch shows alive, by UID: who a /filter or /bind is about.

The pod ledger keeps what pods are charged; a verb also needs to know whether the pod a request
names exists at all, under that UID, and whether it is assigned to a node already (HAMi v2.11
checks a request against the live pod before it reserves or binds anything). The whole pod
object is not kept: 40 000 pods would cost hundreds of MiB. Four facts per pod are, from the
same watch events and relists that feed the ledger, so a verb asks no API server in the common
case (a miss, a pod the watch has not shown yet, is read by the verb itself).
"""
from __future__ import annotations

from sys import intern
from typing import Iterable


class LivePod:
    """What a verb checks a request against: the pod's name, and the node it is assigned to."""
    __slots__ = ("namespace", "name", "node", "resource_version")

    def __init__(self, namespace: str, name: str, node: str, resource_version: str):
        self.namespace = namespace
        self.name = name
        self.node = node                            # spec.nodeName, "" while the pod is not assigned
        self.resource_version = resource_version    # of the object these facts were read from

    def __repr__(self) -> str:
        return f"LivePod({self.namespace}/{self.name}, node={self.node!r}, rv={self.resource_version!r})"


def live_pod_of(pod: dict) -> LivePod:
    """The facts of one pod object (the namespace defaulted as the API server defaults it).
    Namespace and node names repeat over thousands of pods: one string each is kept."""
    meta = pod.get("metadata") or {}
    return LivePod(intern(meta.get("namespace") or "default"), meta.get("name") or "",
                   intern((pod.get("spec") or {}).get("nodeName") or ""), str(meta.get("resourceVersion") or ""))


class LivePods:
    """uid → LivePod of every pod the watch shows and has not shown deleted."""

    def __init__(self) -> None:
        self.by_uid: dict[str, LivePod] = {}
        self.by_name: dict[tuple[str, str], str] = {}     # (namespace, name) → the UID living under it

    def __len__(self) -> int:
        return len(self.by_uid)

    def __contains__(self, uid: str) -> bool:
        return uid in self.by_uid

    def get(self, uid: str) -> LivePod | None:
        return self.by_uid.get(uid)

    def named(self, uid: str, namespace: str, name: str) -> LivePod | None:
        """The pod under ``uid``, if it has that name: a request that names one pod and carries
        another's UID finds nothing (its verb then reads the pod it names)."""
        live = self.by_uid.get(uid)
        return live if live is not None and live.name == name and live.namespace == namespace else None

    def observe(self, uid: str, pod: dict) -> None:
        """A watch event or a relist's item (not a delete) showed the pod. Most events change
        neither name nor node (a UID's name never changes): the record is updated in place."""
        live = self.by_uid.get(uid)
        if live is None:
            live = self.by_uid[uid] = live_pod_of(pod)
            self.by_name[(live.namespace, live.name)] = uid
            return
        node = (pod.get("spec") or {}).get("nodeName") or ""
        if node != live.node:
            live.node = intern(node)
        live.resource_version = str((pod.get("metadata") or {}).get("resourceVersion") or "")

    def uid_named(self, namespace: str, name: str) -> str | None:
        """The UID of the live pod of that name, if the watch shows one."""
        return self.by_name.get((namespace, name))

    def forget(self, uid: str) -> None:
        live = self.by_uid.pop(uid, None)
        if live is not None and self.by_name.get((live.namespace, live.name)) == uid:
            del self.by_name[(live.namespace, live.name)]

    def drop_missing(self, listed: Iterable[str]) -> list[str]:
        """A relist listed these UIDs: the pods indexed before it that it lacks were deleted while
        the watch was down (client-go's tombstones). They are dropped; their UIDs returned."""
        listed = listed if isinstance(listed, (set, frozenset)) else set(listed)
        gone = [uid for uid in self.by_uid if uid not in listed]
        for uid in gone:
            self.forget(uid)
        return gone
