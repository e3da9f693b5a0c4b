"""The pod lock's hand-over from a filter to the work it leaves for after its answer.

A filter's follow-up (a stale decision's cleanup, a preemption's evictions) must hold the pod's
lock from the moment the filter hands it on: a filter or bind of the same pod arriving between
the answer and the follow-up's first step would otherwise run beside it.
"""
from __future__ import annotations

import asyncio

import pytest

from hami_py.embedded import wait_for
from hami_py.scheduling.verbs.podlocks import PodBusy, PodLocks


async def test_a_follow_up_claims_the_lock_before_its_filter_lets_go():
    locks = PodLocks()
    ran: list[str] = []
    release = asyncio.Event()

    async def cleanup():
        ran.append("cleanup")
        await release.wait()

    async with locks.try_hold("uid", "filter"):
        task = locks.follow_up("uid", "cleanup", cleanup())
    # The filter has let go, and the follow-up has not run a step yet: the pod is still busy.
    assert ran == []
    with pytest.raises(PodBusy) as busy:
        async with locks.try_hold("uid", "filter"):
            pass
    assert busy.value.holder == "cleanup"
    release.set()
    await asyncio.wait_for(task, timeout=5)
    assert ran == ["cleanup"] and len(locks) == 0
    async with locks.try_hold("uid", "filter"):   # free again
        pass


async def test_a_bind_waiting_for_the_lock_runs_after_the_follow_up():
    locks = PodLocks()
    order: list[str] = []
    release = asyncio.Event()

    async def evictions():
        order.append("evictions begin")
        await release.wait()
        order.append("evictions end")

    async def bind():
        async with locks.hold("uid", "bind"):
            order.append("bind")

    async with locks.try_hold("uid", "filter"):
        follow = locks.follow_up("uid", "preemption", evictions())
    binding = asyncio.ensure_future(bind())
    await wait_for(lambda: order == ["evictions begin"] and locks.waiting("uid") == 1,
                   what="the follow-up running and the bind queued behind it")
    release.set()
    await asyncio.wait_for(asyncio.gather(follow, binding), timeout=5)
    assert order == ["evictions begin", "evictions end", "bind"]
    assert len(locks) == 0


async def test_a_follow_up_cancelled_before_its_first_step_frees_the_lock():
    locks = PodLocks()
    started = []

    async def work():
        started.append(True)

    async with locks.try_hold("uid", "filter"):
        task = locks.follow_up("uid", "cleanup", work())
        task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not started and len(locks) == 0
    async with locks.try_hold("uid", "filter"):
        pass
