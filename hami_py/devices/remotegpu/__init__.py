"""Remote GPUs served over the network by lupine servers: HAMi's ``RemoteGPU`` family.

See :mod:`.vendor` (inventory, requests, the pool hooks, annotations), :mod:`.pool` (the
whole-server fit), :mod:`.busy` (what the servers report in use), :mod:`.config` (the
``remotegpu`` section) and :mod:`.injection` (what the webhook writes into a client pod).
"""
from __future__ import annotations

from hami_py.devices.remotegpu.config import CONFIG_SECTION, DEFAULT_PORT, SECTION, SERVER_LABEL, RemoteGPUConfig
from hami_py.devices.remotegpu.vendor import (
    ALLOCATED_ANNOTATION, HANDSHAKE_ANNOTATION, TO_ALLOCATE_ANNOTATION, VENDOR_KEY, RemoteGPUVendor,
)

__all__ = [
    "ALLOCATED_ANNOTATION", "CONFIG_SECTION", "DEFAULT_PORT", "HANDSHAKE_ANNOTATION", "SECTION", "SERVER_LABEL",
    "TO_ALLOCATE_ANNOTATION", "VENDOR_KEY", "RemoteGPUConfig", "RemoteGPUVendor", "build_family",
]


def build_family(config, switches) -> list[RemoteGPUVendor]:
    """Always built, as upstream initialises it; without a count name (no section: the chart's
    default) it registers nothing and matches no container."""
    return [RemoteGPUVendor(RemoteGPUConfig.from_section(config.section(SECTION)))]
