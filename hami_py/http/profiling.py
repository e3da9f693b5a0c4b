"""``--profiling``: what is the scheduler doing, asked of the running process.

HAMi serves Go's pprof on a listener of its own (``--profiling-bind-address``, loopback by
default), never on the listeners the cluster reaches. This is the same listener with the same
paths, answering in what a Python process can tell, as plain text:

* ``/debug/pprof/``: the index;
* ``/debug/pprof/goroutine``: every asyncio task's stack, and every thread's (what a hang waits on);
* ``/debug/pprof/profile?seconds=N``: the event loop profiled with cProfile for N seconds (30 by
  default, at most 300; one at a time), the functions by cumulative time;
* ``/debug/pprof/heap``: live objects by type, from the garbage collector.

The profile runs in the event loop's thread, which runs all the scheduler's work: it slows every
request while it lasts, so it is for a person investigating, not for a scraper.
"""
from __future__ import annotations

import asyncio
import cProfile
import gc
import io
import pstats
import sys
import threading
import traceback
from collections import Counter

from aiohttp import web

PREFIX = "/debug/pprof"
DEFAULT_SECONDS = 30
MAX_SECONDS = 300
_TEXT = "text/plain"


def build_profiling_app() -> web.Application:
    app = web.Application()
    busy = asyncio.Lock()

    async def index(_: web.Request) -> web.Response:
        return web.Response(text="\n".join([
            f"{PREFIX}/goroutine  every asyncio task's and thread's stack",
            f"{PREFIX}/profile    ?seconds=N: the event loop under cProfile for N seconds (default "
            f"{DEFAULT_SECONDS}, at most {MAX_SECONDS})",
            f"{PREFIX}/heap       live objects by type", ""]), content_type=_TEXT)

    async def goroutine(_: web.Request) -> web.Response:
        return web.Response(text=task_stacks(), content_type=_TEXT)

    async def profile(request: web.Request) -> web.Response:
        try:
            seconds = float(request.query.get("seconds", DEFAULT_SECONDS))
        except ValueError:
            return web.Response(status=400, text="seconds must be a number\n", content_type=_TEXT)
        if not 0 < seconds <= MAX_SECONDS:
            return web.Response(status=400, text=f"seconds must be in (0, {MAX_SECONDS}]\n", content_type=_TEXT)
        if busy.locked():
            return web.Response(status=409, text="a profile is already running\n", content_type=_TEXT)
        async with busy:
            profiler = cProfile.Profile()
            profiler.enable()
            try:
                await asyncio.sleep(seconds)   # the profiled stretch: the loop's work meanwhile
            finally:
                profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(100)
        return web.Response(text=out.getvalue(), content_type=_TEXT)

    async def heap(_: web.Request) -> web.Response:
        counts = Counter(type(o).__qualname__ for o in gc.get_objects())
        lines = [f"{n:>10}  {name}" for name, n in counts.most_common(60)]
        return web.Response(text=f"{sum(counts.values())} objects tracked by the garbage collector\n"
                                 + "\n".join(lines) + "\n", content_type=_TEXT)

    app.router.add_get(f"{PREFIX}/", index)
    app.router.add_get(f"{PREFIX}/goroutine", goroutine)
    app.router.add_get(f"{PREFIX}/profile", profile)
    app.router.add_get(f"{PREFIX}/heap", heap)
    return app


def task_stacks() -> str:
    out = io.StringIO()
    tasks = asyncio.all_tasks()
    out.write(f"{len(tasks)} asyncio tasks\n\n")
    for task in sorted(tasks, key=lambda t: t.get_name()):
        out.write(f"task {task.get_name()} ({task.get_coro()!r})\n")
        for frame in task.get_stack():
            out.write("".join(traceback.format_stack(frame, limit=1)))
        out.write("\n")
    frames = sys._current_frames()
    for thread in threading.enumerate():
        frame = frames.get(thread.ident)
        out.write(f"thread {thread.name}\n")
        if frame is not None:
            out.write("".join(traceback.format_stack(frame)))
        out.write("\n")
    return out.getvalue()
