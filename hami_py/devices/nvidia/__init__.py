"""NVIDIA GPUs: the vendor HAMi was built for and the one most clusters run.

See :mod:`.vendor` for the annotations, the inventory and the request rules, and :mod:`.config`
for the ``nvidia`` section of the device config. Everything the family offers other modules is
re-exported here, so they import ``hami_py.devices.nvidia`` and not its parts.
"""
from __future__ import annotations

from hami_py.devices.nvidia.config import (
    CONFIG_SECTION, MigProfileAllowlistEntry, NvidiaConfig, nvidia_config, read_nvidia,
)
from hami_py.devices.nvidia.vendor import (
    ALLOCATED_ANNOTATION, CORDON_ANNOTATION, CORE_POLICY_ENV, DEFAULT_CORE_POLICY, HANDSHAKE_ANNOTATION,
    MEMORY_PERCENT_UNSET, MIG_ALLOCATIONS_ANNOTATION, NOUSE_TYPE_ANNOTATION, NOUSE_UUID_ANNOTATION,
    NUMA_BIND_ANNOTATION, PAIR_SCORE_ANNOTATION, PAIR_SCORES_KEY, REGISTER_ANNOTATION, TASK_PRIORITY_ENV,
    TO_ALLOCATE_ANNOTATION, USE_TYPE_ANNOTATION, USE_UUID_ANNOTATION, VENDOR_KEY, VGPU_MODE_ANNOTATION,
    VISIBLE_DEVICES_ENV, NvidiaVendor, parse_numa_bind,
)

__all__ = [
    "CONFIG_SECTION",
    "ALLOCATED_ANNOTATION", "CORDON_ANNOTATION", "CORE_POLICY_ENV", "DEFAULT_CORE_POLICY", "HANDSHAKE_ANNOTATION",
    "MEMORY_PERCENT_UNSET", "MIG_ALLOCATIONS_ANNOTATION", "NOUSE_TYPE_ANNOTATION", "NOUSE_UUID_ANNOTATION",
    "NUMA_BIND_ANNOTATION", "PAIR_SCORE_ANNOTATION", "PAIR_SCORES_KEY", "REGISTER_ANNOTATION", "TASK_PRIORITY_ENV",
    "TO_ALLOCATE_ANNOTATION", "USE_TYPE_ANNOTATION", "USE_UUID_ANNOTATION", "VENDOR_KEY", "VGPU_MODE_ANNOTATION",
    "VISIBLE_DEVICES_ENV", "MigProfileAllowlistEntry", "NvidiaConfig", "NvidiaVendor", "build_family",
    "nvidia_config", "parse_numa_bind", "read_nvidia",
]


def build_family(config, switches) -> list[NvidiaVendor]:
    """NVIDIA is always built (upstream always initialises it), from the ``nvidia`` section;
    without one, with empty resource names, so it matches no container."""
    return [NvidiaVendor(nvidia_config(config))]
