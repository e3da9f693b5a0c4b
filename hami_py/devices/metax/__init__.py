"""Metax: whole GPUs (vendor key ``Metax-GPU``) and sGPU shares (vendor key ``Metax-SGPU``).

Whole GPUs register nothing: ``status.capacity[metax-tech.com/gpu]`` says how many cards the node
has (``<node>-metax-<i>``), each given whole to one container; the node score follows the
topology losses/scores the device plugin publishes on the node (:mod:`.gpu`).

sGPUs are shares of the cards listed in the vendor JSON ``metax-tech.com/node-gpu-devices``;
a pod may carry a QoS policy and an app class (online/offline), and a shared card only takes
pods whose class and QoS agree with the pods it already hosts (:mod:`.sgpu`).
See docs/devices/metax.md.
"""
from __future__ import annotations

from dataclasses import dataclass

from hami_py.config import ConfigSection, DeviceConfig, Section

SECTION = "metax"
CONFIG_SECTION = ConfigSection(SECTION, ("resourceCountName", "resourceVCountName", "resourceVMemoryName",
                                          "resourceVCoreName", "sgpuTopologyAware"))


@dataclass(slots=True, frozen=True)
class MetaxConfig:
    """The ``metax`` section (upstream's ``MetaxConfig``); missing keys are Go's zero values."""
    resource_count_name: str = ""
    resource_vcount_name: str = ""
    resource_vmemory_name: str = ""
    resource_vcore_name: str = ""
    topology_aware: bool = False

    @classmethod
    def from_section(cls, section: Section) -> MetaxConfig:
        """Names only as strings (a number or boolean is refused); ``sgpuTopologyAware`` a boolean."""
        return cls(section.str("resourceCountName", only_strings=True),
                   section.str("resourceVCountName", only_strings=True),
                   section.str("resourceVMemoryName", only_strings=True),
                   section.str("resourceVCoreName", only_strings=True),
                   section.bool("sgpuTopologyAware"))


def build_family(config: DeviceConfig, switches) -> list:
    from hami_py.devices.metax.gpu import MetaxGPUVendor
    from hami_py.devices.metax.sgpu import MetaxSGPUVendor
    metax = MetaxConfig.from_section(config.section(SECTION))
    return [MetaxGPUVendor(metax), MetaxSGPUVendor(metax)]
