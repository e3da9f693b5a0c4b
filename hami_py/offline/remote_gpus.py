"""Remote GPUs in the offline tools: turning the family on when the cluster they plan has servers.

The remote-GPU family ("lupine", docs/devices/remotegpu.md) is off unless the device config names
its count resource, and the chart's default config names none. Offline, that default would make a
cluster file's lupine servers useless: their cards are registered in ``remote`` mode, which NVIDIA
skips, so the simulator would reject the server nodes (no device) and the defragmenter would drop
them. So when the cluster has a server (a simulator group of ``family: remotegpu``, or a Node
labelled ``hami.io/lupine-server`` in a dump or in the live cluster ``defrag --kubeconfig`` lists)
and the device config names no count resource, the offline tools turn
the section on with upstream's resource names (those of its tests and chart values,
``nvidia.com/remote-gpu`` and ``nvidia.com/remote-gpu-memory``), and say so in the report's notes.
A device config that names its own resources is used as given.

Either way the scheduler offline reads no server's ``/metrics`` (``readServerMetrics: false``): the
simulator's servers are made up, a dump's are a snapshot, and the usage the tools plan with is the
books' (the pods placed or listed), not what a server reports at the moment the tool runs.

The tools parse the cluster file once (``offline.source.load_documents``) and hand the same
documents to this decision and to the cluster loader; a live cluster (``defrag --kubeconfig``) is
decided on the objects listed from it, before they are loaded.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable

from hami_py.config import DeviceConfig
from hami_py.devices.remotegpu import SECTION, SERVER_LABEL
from hami_py.devices.remotegpu.config import READ_METRICS_KEY
from hami_py.offline.source import InputError, Where, kubernetes_objects

FAMILY = "remotegpu"
COUNT_RESOURCE = "nvidia.com/remote-gpu"
MEMORY_RESOURCE = "nvidia.com/remote-gpu-memory"


def with_remote_gpus(documents: list[tuple[Any, Where]] | None, config: DeviceConfig
                     ) -> tuple[DeviceConfig, str | None]:
    """``config``, with the remote-GPU section turned on when the cluster file's ``documents``
    (None: none, nothing looked at) describe a server and the config names no count resource,
    and never polling the servers; and the note saying the section was turned on (None when it
    was not)."""
    return _decided(config, documents is not None and _documents_have_server(documents))


def with_remote_gpus_listed(objects: Iterable[dict], config: DeviceConfig) -> tuple[DeviceConfig, str | None]:
    """The same for the objects listed from a live cluster (a Node labelled as a server)."""
    return _decided(config, any(_is_server(obj) for obj in objects))


def _decided(config: DeviceConfig, has_server: bool) -> tuple[DeviceConfig, str | None]:
    section = config.sections.get(SECTION)
    section = dict(section) if isinstance(section, dict) else {}
    note = None
    if not section.get("resourceCountName"):
        if not has_server:
            return config, None
        section.update(resourceCountName=COUNT_RESOURCE, resourceMemoryName=MEMORY_RESOURCE)
        note = (f"remote-GPU servers in the cluster and no {SECTION} resources in the device config: using "
                f"{COUNT_RESOURCE} and {MEMORY_RESOURCE}")
    section[READ_METRICS_KEY] = False
    return dataclasses.replace(config, sections={**config.sections, SECTION: section}), note


def _documents_have_server(docs: list[tuple[Any, Where]]) -> bool:
    first = docs[0][0] if docs else None
    if isinstance(first, dict) and isinstance(first.get("nodes"), list):
        return any(isinstance(group, dict) and isinstance(group.get("family"), str)
                   and group["family"].strip().lower() == FAMILY for group in first["nodes"])
    try:
        return any(_is_server(obj) for obj, _ in kubernetes_objects(docs))
    except InputError:
        return False            # the cluster loader reports it, with its line


def _is_server(obj: Any) -> bool:
    meta = obj.get("metadata") if isinstance(obj, dict) and obj.get("kind") == "Node" else None
    labels = meta.get("labels") if isinstance(meta, dict) else None
    return isinstance(labels, dict) and SERVER_LABEL in labels
