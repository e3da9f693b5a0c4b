"""Upkeep that a device family needs from the Kubernetes layer while this replica serves.

A family's own background work that only reads (polling a pool's servers) is the family's
``DeviceVendor.background``. Work that writes objects through the API server lives in this layer
(devices never import it): today the remote-GPU family's session stubs, one relay pod per lupine
server, kept by the leader (hami_py/k8s/lupine_sessions.py). The app asks this module once at start
and runs what it returns until it stops; nothing here runs for a family the config leaves off.
"""
from __future__ import annotations

import asyncio
from typing import Callable, Coroutine

from hami_py.devices.base import DeviceVendor
from hami_py.devices.remotegpu import VENDOR_KEY as REMOTE_GPU
from hami_py.k8s.client import KubeClient
from hami_py.k8s.lupine_sessions import keep_session_stubs


def upkeep(*, vendors: dict[str, DeviceVendor], client: KubeClient, namespace: str,
           leading: Callable[[], bool], wake: asyncio.Event) -> list[Coroutine]:
    """The coroutines to run while serving; ``wake`` is set when this replica starts leading."""
    jobs: list[Coroutine] = []
    remote = vendors.get(REMOTE_GPU)      # a RemoteGPUVendor, or None (keep_session_stubs checks the image)
    if remote is not None and remote.pooled:
        config = remote.config
        jobs.append(keep_session_stubs(client=client, namespace=namespace, image=config.session_image,
                                       default_port=config.port, leading=leading, wake=wake))
    return jobs
