"""What kube-scheduler does with our extender, in a few lines: POST /filter, then POST /bind.

Used by the demo, the end-to-end tests, the benchmarks and the simulator, so they all exercise
the real HTTP surface exactly as a cluster would.
"""
from __future__ import annotations

from dataclasses import dataclass

import aiohttp
import orjson


@dataclass
class Placement:
    node: str | None
    failed: dict | None
    error: str


class ExtenderClient:
    def __init__(self, base_url: str, *, session: aiohttp.ClientSession | None = None):
        self.base_url = base_url.rstrip("/")
        self._own = session is None
        self.session = session or aiohttp.ClientSession()

    async def close(self) -> None:
        if self._own:
            await self.session.close()

    async def post(self, verb: str, payload) -> tuple[int, dict]:
        data = payload if isinstance(payload, (bytes, str)) else orjson.dumps(payload)
        async with self.session.post(f"{self.base_url}/{verb}", data=data,
                                     headers={"Content-Type": "application/json"}) as r:
            body = await r.read()
            return r.status, (orjson.loads(body) if body else {})

    async def filter(self, pod: dict, node_names: list[str]) -> dict:
        _, result = await self.post("filter", {"Pod": pod, "NodeNames": node_names, "Nodes": None})
        return result

    async def bind(self, pod: dict, node: str) -> dict:
        meta = pod["metadata"]
        _, result = await self.post("bind", {"PodName": meta["name"], "PodNamespace": meta["namespace"],
                                             "PodUID": meta["uid"], "Node": node})
        return result

    async def schedule(self, pod: dict, node_names: list[str]) -> Placement:
        """Filter then bind, as kube-scheduler would for one pod."""
        result = await self.filter(pod, node_names)
        if result.get("Error"):
            return Placement(None, result.get("FailedNodes"), result["Error"])
        names = result.get("NodeNames") or []
        if not names:
            return Placement(None, result.get("FailedNodes"), "")
        bound = await self.bind(pod, names[0])
        return Placement(names[0] if not bound.get("Error") else None, None, bound.get("Error", ""))

    async def prioritize(self, pod: dict, node_names: list[str]) -> list[dict]:
        """POST /prioritize (--filter-mode=all): the HostPriorityList."""
        _, result = await self.post("prioritize", {"Pod": pod, "NodeNames": node_names, "Nodes": None})
        return result
