"""One lock per pod, shared by /filter and /bind of that pod.

A pod's decision is made by /filter and consumed by /bind. kube-scheduler normally sends them one
after the other, but a retry after a timeout, a second profile or a second kube-scheduler can
send a filter of a pod while its bind is still in flight. The filter would release the
reservation the bind is about to trust (and reserve elsewhere), so both verbs of one pod run one
at a time. Locks of different pods never wait for each other.
"""
from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager


class PodLocks:
    def __init__(self):
        self._locks: dict[str, asyncio.Lock] = {}
        self._users: dict[str, int] = {}   # holders and waiters of each pod's lock

    @asynccontextmanager
    async def hold(self, key: str):
        """Hold the lock of pod ``key`` (its UID) for the body of the ``async with``."""
        lock = self._locks.setdefault(key, asyncio.Lock())
        self._users[key] = self._users.get(key, 0) + 1
        try:
            async with lock:
                yield
        finally:
            # Dropped with its last user only: a released lock is not locked() while the waiter
            # it wakes has yet to run, and a fresh lock then would let a later one run beside it.
            self._users[key] -= 1
            if not self._users[key]:
                del self._users[key], self._locks[key]

    def waiting(self, key: str) -> int:
        """How many filters or binds of pod ``key`` wait behind the one holding its lock."""
        return max(self._users.get(key, 0) - 1, 0)

    def __len__(self) -> int:
        return len(self._locks)
