"""The floor under /filter: what any extender in Python pays before it decides anything.

A /filter's latency has two parts we cannot make smaller than they are: the HTTP exchange with
kube-scheduler (read the body, decode thousands of node names, write an answer) and the decision
itself. This module measures the first as a process of its own (``python -m bench.floor PORT``):
an aiohttp server run as the scheduler runs its own (no access log, handler cancellation), whose
/filter reads the same body, decodes it, and answers the same ExtenderFilterResult a placed pod
gets (the first candidate's name, so the same size). The second is ``Filterer.decide`` alone, in
process, on the same seeded cluster (bench/kernel.py ``decide_by_family``). Their sum is the
floor the /filter table is set against (bench/phases.py, docs/BENCHMARKS.md).
"""
from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson
from aiohttp import web

from bench.procs import REPO_ROOT, BenchError, free_port

_JSON = "application/json"


def floor_app() -> web.Application:
    async def filter_handler(request: web.Request) -> web.Response:
        args = orjson.loads(await request.read())
        names = args.get("NodeNames") or []
        answer = {"Nodes": None, "NodeNames": names[:1], "FailedNodes": None, "FailedAndUnresolvableNodes": None,
                  "Error": ""}
        return web.Response(body=orjson.dumps(answer), content_type=_JSON)

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(status=200)

    app = web.Application(client_max_size=1 << 20)
    app.router.add_post("/filter", filter_handler)
    app.router.add_get("/healthz", healthz)
    return app


async def _serve(port: int) -> None:
    runner = web.AppRunner(floor_app(), access_log=None, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


@dataclass
class FloorProcess:
    """The floor server, started and stopped around a measurement."""
    log_path: Path
    port: int = 0
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, session: aiohttp.ClientSession, *, timeout_s: float = 30.0) -> None:
        self.port = free_port()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "bench.floor", str(self.port)], cwd=REPO_ROOT,
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                async with session.get(f"{self.url}/healthz") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"the floor server did not start (log: {self.log_path})")
            await asyncio.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None


if __name__ == "__main__":
    asyncio.run(_serve(int(sys.argv[1])))
