"""Which device vendors this scheduler manages, built from the device config.

The cache, the filter and the webhook iterate over the mapping this module builds and never
name a vendor themselves. NVIDIA is the only vendor so far; Ascend, Cambricon, Hygon, Metax and
the others join here as their modules are written, each from its own config section.
"""
from __future__ import annotations

from hami_py.config import DeviceConfig
from hami_py.devices.base import DeviceVendor
from hami_py.devices.nvidia import NvidiaVendor


def build_vendors(config: DeviceConfig) -> dict[str, DeviceVendor]:
    """Vendor key -> vendor, for every vendor the config enables.

    NVIDIA is always built, even without an ``nvidia`` section (then with empty resource names,
    so it matches no container), as upstream always initialises it.
    """
    vendors: list[DeviceVendor] = [NvidiaVendor(config.nvidia)]
    return {vendor.vendor_key: vendor for vendor in vendors}


def managed_resource_names(vendors: dict[str, DeviceVendor]) -> list[str]:
    """Every extended resource the vendors manage, each once, in vendor then vendor-given order.

    This is what the kube-scheduler extender config lists as ``managedResources``: only pods
    asking for one of these are sent to us.
    """
    seen: dict[str, None] = {}
    for vendor in vendors.values():
        for name in vendor.resource_names():
            seen.setdefault(name, None)
    return list(seen)
