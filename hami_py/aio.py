"""Small asyncio helpers shared by the layers that run background tasks."""
from __future__ import annotations

import asyncio


async def cancel_and_wait(task: asyncio.Task | None) -> None:
    """Cancel a background task and wait until it has finished (its ``finally`` blocks run).
    A cancellation of the caller itself while it waits is passed on, not swallowed."""
    if task is None:
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise


async def run_to_end(awaitable) -> tuple[asyncio.Future, bool]:
    """Run ``awaitable`` to its end even if the caller is cancelled meanwhile (work that must not
    be left half done: a bind's lock and Binding, a preemption's evictions and hold). Returns the
    finished future and whether the caller was cancelled; the caller then raises CancelledError
    itself, after whatever it must still do with the outcome."""
    work = asyncio.ensure_future(awaitable)
    cancelled = False
    while not work.done():
        try:
            await asyncio.wait([work])   # a cancelled wait leaves the task running
        except asyncio.CancelledError:
            cancelled = True
    return work, cancelled
