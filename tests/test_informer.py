"""The informer's watch stream, split into events by hand: big objects and many small ones, in
one chunk or across many, each arrives whole and in order."""
from __future__ import annotations

from hami_py.embedded import wait_for
from hami_py.fakeapi import write_kubeconfig
from hami_py.fakeapi.objects import gpu_pod
from hami_py.k8s.client import KubeClient, load_configuration
from hami_py.k8s.informer import Informer


async def test_watch_events_arrive_whole_and_in_order_whatever_their_size(api, tmp_path):
    """A 3 MiB pod (past aiohttp's and kubernetes-asyncio's line limits) between small ones, and
    bursts of small ones that share a read: every event is handed over once, intact, in order."""
    client = KubeClient(await load_configuration(str(write_kubeconfig(tmp_path / "kubeconfig", api.url))), qps=0)
    seen: list[tuple[str, str, int]] = []

    def handler(kind: str, obj: dict) -> None:
        blob = (obj["metadata"].get("annotations") or {}).get("blob", "")
        seen.append((kind, obj["metadata"]["name"], len(blob)))

    informer = Informer(client=client, path="/api/v1/pods", on_event=handler, on_relist=lambda items, rv: None)
    informer.start()
    try:
        await wait_for(lambda: informer.synced.is_set() and api.open_watches, what="watching")
        sizes = {f"p{i}": 3 << 20 if i in (7, 8, 31) else (i * 997) % 5000 for i in range(50)}
        for name, size in sizes.items():
            api.create("pods", gpu_pod(name, annotations={"blob": "x" * size}))
        deleted = [f"p{i}" for i in range(0, 50, 5)]
        for name in deleted:
            api.delete("pods", name, namespace="default")
        expected = [("ADDED", n, s) for n, s in sizes.items()] + [("DELETED", n, sizes[n]) for n in deleted]
        await wait_for(lambda: len(seen) >= len(expected), what="every event")
        assert seen == expected
        assert informer.resource_version == str(api.resource_version)
    finally:
        await informer.stop()
        await client.close()
