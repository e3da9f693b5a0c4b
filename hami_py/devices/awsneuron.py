"""Placeholder: this family is being built (issue 15)."""
from __future__ import annotations

from hami_py.config import DeviceConfig
from hami_py.devices.base import DeviceVendor


def build_family(config: DeviceConfig, switches) -> list[DeviceVendor]:
    return []
