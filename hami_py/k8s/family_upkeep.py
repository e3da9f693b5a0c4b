"""Upkeep that a device family needs from the Kubernetes layer while this replica serves.

A family's own background work that only reads (polling a pool's servers) is the family's
``DeviceVendor.background``. Work that writes objects through the API server lives in this layer
(devices never import it): today the remote-GPU family's session stubs, one relay pod per lupine
server, kept by the leader (hami_py/k8s/lupine_sessions.py) from the servers its node watch knows
(the family's server set, confirmed by the books: it lists no nodes of its own). The app asks this
module once at start and runs what it returns until it stops; nothing here runs for a family the
config leaves off.
"""
from __future__ import annotations

import asyncio
from typing import Callable, Coroutine

from hami_py.cache.usage import UsageCache
from hami_py.devices.base import DeviceVendor
from hami_py.devices.remotegpu import VENDOR_KEY as REMOTE_GPU
from hami_py.k8s.client import KubeClient
from hami_py.k8s.lupine_sessions import keep_session_stubs


def upkeep(*, vendors: dict[str, DeviceVendor], cache: UsageCache, client: KubeClient, namespace: str,
           leading: Callable[[], bool], wake: asyncio.Event) -> list[Coroutine]:
    """The coroutines to run while serving; ``wake`` is set when this replica starts leading."""
    jobs: list[Coroutine] = []
    remote = vendors.get(REMOTE_GPU)      # a RemoteGPUVendor, or None (keep_session_stubs checks the image)
    if remote is not None and remote.pooled:
        def servers():
            # Before the node watch's first full list the books would say "no server": no view.
            return remote.server_nodes(cache) if cache.nodes_synced else None

        jobs.append(keep_session_stubs(client=client, namespace=namespace, image=remote.config.session_image,
                                       servers=servers, leading=leading, wake=wake))
    return jobs
