"""Where a pod's ``FilteringSucceed`` waits for its bind (``--filtering-succeed-events=unbound``).

Upstream HAMi writes two Events for every pod it schedules, ``FilteringSucceed`` at /filter and
``BindingSucceed`` at /bind. kube-scheduler itself writes one (``Scheduled``), and every Event is
an API request: issue 13 asks for at most four requests a scheduled pod in all, of which the node
lock and the Binding are two. A successful filter says nothing a successful bind does not say
better (the node is in ``BindingSucceed``), so its Event waits here, keyed by the pod's UID, and is
dropped when the pod's bind succeeds. It is only worth reading when no successful bind follows:

* the bind fails (then it comes first, so ``kubectl describe`` still reads filter, then bind);
* the pod is filtered again (a new decision replaces the old, and the old one is written);
* nothing follows within the window (a pod held in kube-scheduler's Permit, a bind that never
  came): the sweeper writes it, stamped with the filter's time, not the time it was written.

Nothing parked is ever lost silently: the lot is bounded (the event queue's size) and hands back
its oldest when full, and the recorder writes everything parked when it stops. This module keeps
the book and its sweep (no I/O); ``events.EventRecorder`` runs the sweep and does the writing.
"""
from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from typing import Callable, Generic, TypeVar

UNBOUND = "unbound"      # a FilteringSucceed is written only for a pod no successful bind follows
ALWAYS = "always"        # upstream's: every successful filter writes its FilteringSucceed at once
FILTERING_SUCCEED_MODES = (UNBOUND, ALWAYS)
DEFAULT_WINDOW_S = 10.0
SWEEP_INTERVAL_S = 0.5   # how often expired entries are written: one timer for all, none per pod

Job = TypeVar("Job")


class ParkingLot(Generic[Job]):
    """Parked jobs by pod UID, oldest first. Every call is synchronous and O(what it returns):
    entries are kept in parking order, which is also their order of expiry (one window for all,
    a monotonic clock), so the sweep stops at the first entry still within its window."""

    def __init__(self, *, window_s: float, limit: int, clock: Callable[[], float] = time.monotonic):
        if limit < 1:
            raise ValueError(f"the parking limit must be at least 1, got {limit}")
        self.window_s = window_s
        self.limit = limit
        self.clock = clock
        self._parked: OrderedDict[str, tuple[float, Job]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._parked)

    def __contains__(self, uid: str) -> bool:
        return uid in self._parked

    def park(self, uid: str, job: Job) -> list[Job]:
        """Park ``job`` for ``uid``; what must be written now, oldest first: the pod's previous
        parked job (it is filtered again) and, over the limit, the oldest of the others."""
        out = []
        previous = self._parked.pop(uid, None)
        if previous is not None:
            out.append(previous[1])
        self._parked[uid] = (self.clock() + self.window_s, job)
        while len(self._parked) > self.limit:
            out.append(self._parked.popitem(last=False)[1][1])
        return out

    def take(self, uid: str) -> Job | None:
        """The job parked for ``uid``, no longer parked; None if there is none."""
        entry = self._parked.pop(uid, None)
        return None if entry is None else entry[1]

    def expired(self) -> list[Job]:
        """The jobs whose window has passed, no longer parked, oldest first."""
        now = self.clock()
        out = []
        while self._parked:
            deadline, job = next(iter(self._parked.values()))
            if deadline > now:
                break
            self._parked.popitem(last=False)
            out.append(job)
        return out

    def drain(self) -> list[Job]:
        """Every parked job, oldest first; the lot is empty after."""
        out = [job for _, job in self._parked.values()]
        self._parked.clear()
        return out

    async def sweep(self, write: Callable[[Job], object]) -> None:
        """Hand ``write`` the jobs whose window passed, every SWEEP_INTERVAL_S, until cancelled.
        One task for all of them, not a timer a pod: a thousand waiting pods cost one wake-up a tick."""
        interval = min(SWEEP_INTERVAL_S, self.window_s) if self.window_s > 0 else SWEEP_INTERVAL_S
        while True:
            await asyncio.sleep(interval)
            for job in self.expired():
                write(job)
