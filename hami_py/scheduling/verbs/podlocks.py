"""One lock per pod, shared by /filter and /bind of that pod.

A pod's decision is made by /filter and consumed by /bind. kube-scheduler normally sends them one
after the other, but a retry after a timeout, a second profile or a second kube-scheduler can
send a filter of a pod while its bind is still in flight. The filter would release the
reservation the bind is about to trust (and reserve elsewhere), so both verbs of one pod run one
at a time. Locks of different pods never wait for each other.

A bind waits for the pod's lock; a filter never does (``try_hold``): kube-scheduler's scheduling
cycle is serial and waits for our /filter, so a filter queued behind a bind that waits for a node
lock (up to --node-lock-wait) would stall every pod of the cluster. It answers at once that the
pod is busy, and kube-scheduler retries the pod.

Work a filter leaves for after its answer (clearing a stale decision, a preemption's evictions)
runs under the pod's lock too (``follow_up``), claimed before the filter lets go of it: the pod's
next filter or bind cannot slip in between and sees the follow-up as the lock's holder.
"""
from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import Coroutine


class PodBusy(Exception):
    """The pod's lock is held: ``holder`` says by what ("bind", "filter")."""

    def __init__(self, holder: str):
        super().__init__(holder)
        self.holder = holder


class PodLocks:
    def __init__(self):
        self._locks: dict[str, asyncio.Lock] = {}
        self._users: dict[str, int] = {}   # holders and waiters of each pod's lock
        self._holders: dict[str, str] = {}   # what holds each pod's lock now
        self._pending: dict[str, str] = {}   # a follow-up waiting for the lock its filter hands on

    def busy(self, key: str) -> bool:
        """Whether anything holds or waits for pod ``key``'s lock (a bind in flight, a follow-up)."""
        return bool(self._users.get(key))

    def try_hold(self, key: str, what: str) -> "_TryHold":
        """Hold the lock of pod ``key`` without waiting (``async with``): raises PodBusy when
        anything holds it or waits for it (the lock is not taken then)."""
        return _TryHold(self, key, what)

    @asynccontextmanager
    async def hold(self, key: str, what: str = "bind"):
        """Hold the lock of pod ``key`` (its UID) for the body of the ``async with``, waiting for
        it if need be; ``what`` names the holder to a filter that finds it busy."""
        lock = self._join(key)
        async with self._held(key, lock, what):
            yield

    def follow_up(self, key: str, what: str, work: Coroutine) -> asyncio.Task:
        """Run ``work`` under pod ``key``'s lock in a task of its own, after whatever holds the
        lock now (the filter that hands it on). It counts as a user of the lock from this call:
        a ``try_hold`` made before the task runs finds the pod busy with ``what``."""
        lock = self._join(key)
        self._pending[key] = what
        started = False

        async def run():
            nonlocal started
            started = True
            async with self._held(key, lock, what):
                await work

        def ended(_task: asyncio.Task) -> None:
            if not started:   # cancelled before its first step: leave the lock as if it had run
                work.close()
                self._leave(key)
        task = asyncio.ensure_future(run())
        task.add_done_callback(ended)
        return task

    def _join(self, key: str) -> asyncio.Lock:
        lock = self._locks.setdefault(key, asyncio.Lock())
        self._users[key] = self._users.get(key, 0) + 1
        return lock

    @asynccontextmanager
    async def _held(self, key: str, lock: asyncio.Lock, what: str):
        """The lock held by one user who has already joined (``_join``)."""
        try:
            async with lock:
                self._holders[key] = what
                if self._pending.get(key) == what:
                    del self._pending[key]
                try:
                    yield
                finally:
                    self._holders.pop(key, None)
        finally:
            self._leave(key)

    def _leave(self, key: str) -> None:
        # Dropped with its last user only: a released lock is not locked() while the waiter it
        # wakes has yet to run, and a fresh lock then would let a later one run beside it.
        self._users[key] -= 1
        if not self._users[key]:
            del self._users[key], self._locks[key]
            self._pending.pop(key, None)

    def waiting(self, key: str) -> int:
        """How many filters or binds of pod ``key`` wait behind the one holding its lock."""
        return max(self._users.get(key, 0) - 1, 0)

    def __len__(self) -> int:
        return len(self._locks)


class _TryHold:
    """``PodLocks.try_hold``: what ``hold`` does for a lock nobody holds or waits for, as a plain
    context manager. Every /filter takes one, and three nested generator-based managers cost it
    more than the lock itself."""

    __slots__ = ("locks", "key", "what", "lock")

    def __init__(self, locks: PodLocks, key: str, what: str):
        self.locks, self.key, self.what = locks, key, what
        self.lock: asyncio.Lock | None = None

    async def __aenter__(self) -> None:
        locks, key = self.locks, self.key
        if locks._users.get(key):
            raise PodBusy(locks._holders.get(key) or locks._pending.get(key) or "another request")
        lock = self.lock = locks._join(key)
        try:
            await lock.acquire()     # free (nobody holds or waits for it): taken without waiting
        except BaseException:
            locks._leave(key)
            raise
        locks._holders[key] = self.what
        if locks._pending.get(key) == self.what:
            del locks._pending[key]

    async def __aexit__(self, *exc) -> None:
        locks, key = self.locks, self.key
        locks._holders.pop(key, None)
        self.lock.release()
        locks._leave(key)
