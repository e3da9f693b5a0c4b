"""The per-node bind lock HAMi's device plugins expect, taken with compare-and-set.

Between /bind and the device plugin's Allocate, only one pod at a time may be in flight on a node:
the plugin finds "its" pod by the lock. The lock is the node annotation ``hami.io/mutex.lock`` =
``<RFC3339Nano time>,<pod namespace>,<pod name>`` (HAMi #3127; RFC3339 values, as older
schedulers wrote them, still read); the device plugin releases it after allocating. Every write is
a merge patch carrying the node's resourceVersion, so the API server refuses it (409) when anyone
changed the node in between: two schedulers can never both believe they hold it. A lock whose
owner pod no longer exists, or whose allocation is done, is taken over; so is an expired one,
unless its owner is still Pending with ``hami.io/bind-phase: allocating`` (HAMi #3127: the device
plugin finds the pod it allocates for by this lock, and a takeover would hand it another pod's
devices). Only the owner releases.

Some device families' plugins also wait for a lock of their own (Cambricon's
``cambricon.com/dsmlu.lock``, a bare RFC3339 time that expires after 2 minutes). Such a lock is
set in the same compare-and-set patch as HAMi's, so a bind still costs one write, and it is
refused while another bind's copy is younger than its expiry.
"""
from __future__ import annotations

import asyncio
import calendar
import random
import time
from dataclasses import dataclass
from datetime import datetime, timezone

import structlog

from hami_py.cache.records import allocation_finished, awaiting_allocation, parse_lock
from hami_py.k8s.client import KubeApiError, KubeClient, node_path, pod_path

log = structlog.get_logger(__name__)

LOCK_ANNOTATION = "hami.io/mutex.lock"
CAS_ATTEMPTS = 5


@dataclass(slots=True, frozen=True)
class ExtraLock:
    """A family's own node lock: a node annotation holding the time it was taken."""
    annotation: str
    expiry_s: float


class NodeLockError(Exception):
    """The lock could not be taken; ``contention`` says whether another pod holds it, and
    ``uncertain`` whether the lock's write may have landed all the same (the answer was lost)."""

    def __init__(self, message: str, *, contention: bool, uncertain: bool = False):
        super().__init__(message)
        self.contention = contention
        self.uncertain = uncertain


def go_duration(seconds: float) -> str:
    """Render a duration as Go's time.Duration.String() does (``5m0s``, ``28s``, ``300ms``)."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{round(seconds * 1000, 6):g}ms"
    whole_minutes, secs = divmod(seconds, 60)
    h, m = divmod(int(whole_minutes), 60)
    secs_text = f"{round(secs, 9):g}s"
    if h:
        return f"{h}h{m}m{secs_text}"
    if m:
        return f"{m}m{secs_text}"
    return secs_text


def rfc3339_nano(now: datetime | None = None, *, ns: int | None = None) -> str:
    """A UTC time as Go's ``time.RFC3339Nano`` writes it: nanoseconds with their trailing zeros
    trimmed, no fraction at all on a whole second (``2026-10-09T12:00:00.1234Z``). ``ns``:
    nanoseconds since the epoch (the default, ``time.time_ns()``); else ``now``, to the microsecond."""
    if ns is None:
        if now is None:
            ns = time.time_ns()
        else:
            now = now.astimezone(timezone.utc)
            ns = (calendar.timegm(now.timetuple()) * 1_000_000 + now.microsecond) * 1000
    seconds, fraction = divmod(ns, 1_000_000_000)
    text = datetime.fromtimestamp(seconds, timezone.utc).strftime('%Y-%m-%dT%H:%M:%S')
    return f"{text}.{fraction:09d}".rstrip("0") + "Z" if fraction else f"{text}Z"


def lock_value(namespace: str, name: str, now: datetime | None = None) -> str:
    return f"{rfc3339_nano(now)},{namespace},{name}"


def _now_text() -> str:
    return datetime.now(timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')


def _check_extra_locks(node: str, extra: tuple[ExtraLock, ...], held: dict[str, str]) -> None:
    """Refuse while a family's own lock is younger than its expiry (an unreadable time counts as
    expired, as a lock nobody can interpret can never be released by its reader either)."""
    now = datetime.now(timezone.utc)
    for lock in extra:
        text = held.get(lock.annotation)
        if not text:
            continue
        try:
            taken = datetime.fromisoformat(text.strip())
        except ValueError:
            continue
        if taken.tzinfo is None:
            taken = taken.replace(tzinfo=timezone.utc)
        if (now - taken).total_seconds() <= lock.expiry_s:
            raise NodeLockError(f"node {node} has been locked within {go_duration(lock.expiry_s)} "
                                f"({lock.annotation}): node lock contention", contention=True)


class NodeLocker:
    def __init__(self, client: KubeClient, *, timeout_s: float = 300.0, hint=None, allocating=None,
                 holder=None):
        self.client = client
        self.timeout_s = timeout_s
        # hint(node) -> (lock annotation, resourceVersion) from the node watch, or None. When
        # the watch shows the node unlocked, the compare-and-set is tried with that version at
        # once, saving a read; a stale version just gets 409 and the usual read-and-retry.
        self.hint = hint
        # allocating(uid) -> whether the pod watch shows that pod, its device plugin not done
        # with it yet. With it, a lock the watch shows held by a pod this locker locked for, still
        # fresh and its allocation in progress, is contention known without a read of the node
        # or of its owner pod: the common case of two binds in a row onto one node, the second
        # waiting for the plugin to free the first.
        self.allocating = allocating
        # holder(node, namespace, name, locked_at) -> True/False when the books know whether the
        # pod named by an expired lock still waits for its allocation on that node, None when they
        # do not (the pod is then read): UsageCache.lock_holder_waiting.
        self.holder = holder
        self._taken: dict[str, tuple[str, str]] = {}   # node -> (lock value written, its pod's UID)

    async def _read(self, node: str) -> tuple[str | None, str]:
        value, rv, _ = await self._read_all(node, ())
        return value, rv

    async def _read_all(self, node: str, extra: tuple[ExtraLock, ...]) -> tuple[str | None, str, dict[str, str]]:
        obj = await self.client.get(node_path(node))
        meta = obj.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        return (annotations.get(LOCK_ANNOTATION), meta.get("resourceVersion", ""),
                {x.annotation: annotations[x.annotation] for x in extra if annotations.get(x.annotation)})

    async def _cas(self, node: str, value: str | None, rv: str, extra: tuple[ExtraLock, ...] = (), *,
                   shared: bool = True, taking: bool = True) -> None:
        annotations: dict[str, str | None] = {LOCK_ANNOTATION: value} if shared else {}
        for lock in extra:
            annotations[lock.annotation] = _now_text() if taking else None
        body = {"metadata": {"annotations": annotations, "resourceVersion": rv}}
        await self.client.patch(node_path(node), body)

    async def acquire_own(self, node: str, extra: tuple[ExtraLock, ...]) -> None:
        """Take only the families' own locks (a family that does not take HAMi's, as Cambricon):
        refused while another bind's copy is fresh, set by compare-and-set."""
        for attempt in range(CAS_ATTEMPTS):
            _, rv, held = await self._read_all(node, extra)
            _check_extra_locks(node, extra, held)
            try:
                await self._cas(node, None, rv, extra, shared=False)
                return
            except KubeApiError as exc:
                if not exc.conflict:
                    raise NodeLockError(f"failed to set node lock on {node}: {exc}", contention=False,
                                        uncertain=exc.uncertain) from None
            if attempt < CAS_ATTEMPTS - 1:
                await asyncio.sleep(0.1 * (2 ** attempt) * random.uniform(0.5, 1.0))
        raise NodeLockError(f"node {node} is locked: node lock contention", contention=True)

    async def release_own(self, node: str, extra: tuple[ExtraLock, ...]) -> bool:
        """Drop the families' own locks (no owner is recorded in them, as upstream). Never raises."""
        for attempt in range(CAS_ATTEMPTS):
            try:
                _, rv, held = await self._read_all(node, extra)
                if not held:
                    return True
                await self._cas(node, None, rv, extra, shared=False, taking=False)
                return True
            except KubeApiError as exc:
                if exc.not_found:
                    return True
                if not exc.conflict:
                    log.warning("node lock release failed", node=node, error=str(exc), attempt=attempt + 1)
            if attempt < CAS_ATTEMPTS - 1:
                await asyncio.sleep(0.05 * (2 ** attempt) * random.uniform(0.5, 1.0))
        return False

    async def acquire(self, node: str, namespace: str, name: str, *, extra: tuple[ExtraLock, ...] = (),
                      uid: str = "") -> None:
        """Take the lock for pod namespace/name (and the families' own ``extra`` locks, in the
        same patch), or raise NodeLockError."""
        suffix = f",{namespace},{name}"
        if self.hint is not None and not extra and await self._acquire_by_hint(node, namespace, name, uid):
            return
        for attempt in range(CAS_ATTEMPTS):
            current, rv, held = await self._read_all(node, extra)
            _check_extra_locks(node, extra, held)
            if current:
                try:
                    stamp, owner_ns, owner_name = parse_lock(current)
                except ValueError as exc:
                    raise NodeLockError(f"node {node}: {exc}", contention=False) from None
                if current.endswith(suffix):
                    return  # re-entrant: this pod already holds it
                age = (datetime.now(timezone.utc) - stamp).total_seconds()
                if age <= self.timeout_s:
                    if not await self._owner_done(owner_ns, owner_name):
                        raise NodeLockError(f"node {node} has been locked within {go_duration(self.timeout_s)}: "
                                            f"node lock contention", contention=True)
                elif await self._owner_waiting(node, owner_ns, owner_name, stamp):
                    # Expired, but its owner is still to be allocated: the device plugin reads
                    # this lock to learn whom it allocates for (HAMi #3127). Contention: the
                    # owner's allocation releases it.
                    raise NodeLockError(f"node {node} lock expired while {owner_ns}/{owner_name} still waits "
                                        f"to be allocated", contention=True)
                log.info("taking over node lock", node=node, previous=current)
            try:
                await self._take(node, lock_value(namespace, name), rv, uid, extra)
                return
            except KubeApiError as exc:
                if not exc.conflict:
                    raise NodeLockError(f"failed to set node lock on {node}: {exc}", contention=False,
                                        uncertain=exc.uncertain) from None
            if attempt < CAS_ATTEMPTS - 1:   # no wait after the last: the answer is known
                await asyncio.sleep(0.1 * (2 ** attempt) * random.uniform(0.5, 1.0))
        raise NodeLockError(f"node {node} is locked: node lock contention", contention=True)

    async def _acquire_by_hint(self, node: str, namespace: str, name: str, uid: str) -> bool:
        """Take the lock with the node watch's view and no read: True once taken. A view gone
        stale meanwhile (409) is looked at once more, since the watch may have caught up during
        the round trip; False leaves the rest to the read-and-retry path."""
        tried = None
        for _ in range(2):
            seen = self.hint(node)
            if seen is None or seen[1] == tried:
                return False
            if seen[0]:
                if not seen[0].endswith(f",{namespace},{name}"):   # this pod's own: re-entrant, read it
                    self._contention_seen(node, seen[0])
                return False
            try:
                await self._take(node, lock_value(namespace, name), seen[1], uid)
                return True
            except KubeApiError as exc:
                if not exc.conflict:
                    raise NodeLockError(f"failed to set node lock on {node}: {exc}", contention=False,
                                        uncertain=exc.uncertain) from None
                log.debug("node lock compare-and-set met a newer node", node=node, resource_version=seen[1])
            tried = seen[1]
        return False

    def _contention_seen(self, node: str, held: str) -> None:
        """Raise contention when the watch shows ``held``, a lock this locker wrote for a pod the
        pod watch still shows, younger than the expiry; else return (read the node to know)."""
        taken = self._taken.get(node)
        if taken is None or taken[0] != held or self.allocating is None or not self.allocating(taken[1]):
            return
        try:
            stamp = parse_lock(held)[0]
        except ValueError:
            return
        if (datetime.now(timezone.utc) - stamp).total_seconds() <= self.timeout_s:
            raise NodeLockError(f"node {node} has been locked within {go_duration(self.timeout_s)}: "
                                f"node lock contention", contention=True)

    def written(self, node: str, uid: str) -> str | None:
        """The lock value this locker last wrote on ``node`` for the pod with ``uid``, if any."""
        taken = self._taken.get(node)
        return taken[0] if taken is not None and uid and taken[1] == uid else None

    async def _take(self, node: str, value: str, rv: str, uid: str, extra: tuple[ExtraLock, ...] = ()) -> None:
        # Recorded before the write: a write whose answer is lost may have landed, and its
        # release must know the value. A write refused outright did not land: the lock this
        # locker wrote before, still there, stays what the watch shortcut compares with.
        previous = self._taken.get(node)
        if uid:
            self._taken[node] = (value, uid)
        try:
            await self._cas(node, value, rv, extra)
        except KubeApiError as exc:
            if not exc.uncertain:
                if previous is None:
                    self._taken.pop(node, None)
                else:
                    self._taken[node] = previous
            raise
        if not uid:
            self._taken.pop(node, None)

    async def _owner_done(self, namespace: str | None, name: str | None) -> bool:
        """Whether the lock's owner no longer needs it: the pod is gone, or its device plugin has
        finished with it (bind-phase success or failed) and only failed to release the lock
        (the API server was down then): waiting for the expiry would stop the node 5 minutes."""
        if not namespace or not name:
            return False
        owner = await self._read_owner(namespace, name)
        return owner is None or allocation_finished((owner.get("metadata") or {}).get("annotations"))

    async def _read_owner(self, namespace: str, name: str) -> dict | None:
        """The lock's owner pod, None when it is gone."""
        try:
            return await self.client.get(pod_path(namespace, name))
        except KubeApiError as exc:
            if exc.not_found:
                return None
            raise NodeLockError(f"checking node lock owner {namespace}/{name}: {exc}", contention=False) from None

    async def _owner_waiting(self, node: str, namespace: str | None, name: str | None, locked_at: datetime) -> bool:
        """Whether the owner of an expired lock still waits to be allocated: Pending, bind-phase
        ``allocating`` and created no later than the lock (a pod created after it is another pod
        of the same name). The books answer when they know the pod bound to the node; else the pod
        is read (gone: not waiting)."""
        if not namespace or not name:
            return False
        if self.holder is not None and (known := self.holder(node, namespace, name, locked_at)) is not None:
            return known
        owner = await self._read_owner(namespace, name)
        return owner is not None and awaiting_allocation(owner, locked_at)

    async def release(self, node: str, namespace: str, name: str, *, extra: tuple[ExtraLock, ...] = (),
                      value: str | None = None) -> bool:
        """Drop the lock if (and only if) pod namespace/name holds it (with ``value``: exactly
        that lock), with the ``extra`` locks taken alongside it. Best effort, never raises: True
        once the pod holds no such lock on the node (released, or never held), False when every
        attempt failed."""
        suffix = f",{namespace},{name}"
        for attempt in range(CAS_ATTEMPTS):
            try:
                current, rv = await self._read(node)
                if not current or not current.endswith(suffix) or (value is not None and current != value):
                    return True
                await self._cas(node, None, rv, extra, taking=False)
                self._taken.pop(node, None)
                return True
            except KubeApiError as exc:
                if exc.not_found:
                    return True
                if exc.conflict:
                    continue     # the node changed under us (a handshake stamp): read it again
                log.warning("node lock release failed", node=node, error=str(exc), attempt=attempt + 1)
            if attempt < CAS_ATTEMPTS - 1:
                await asyncio.sleep(0.05 * (2 ** attempt) * random.uniform(0.5, 1.0))
        return False
