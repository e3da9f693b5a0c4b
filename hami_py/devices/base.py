"""The vendor-neutral device interface.

One module per vendor (``hami_py/devices/<vendor>.py``) implements :class:`DeviceVendor`, the way
upstream keeps one package per vendor behind its ``Devices`` interface. Everything outside
``devices/`` talks to vendors only through this interface, so adding Ascend or Cambricon means
adding one module, not touching the cache or the scheduler.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol


class DeviceDecodeError(ValueError):
    """A node's registration annotation cannot be decoded; the message says exactly why."""


class RequestError(ValueError):
    """A pod asks for a device resource in a way we cannot honour (e.g. ``gpumem: 1.5``)."""


class AllocationDecodeError(ValueError):
    """A pod's device allocation annotation is garbled."""


@dataclass(slots=True)
class DeviceInfo:
    """One registered device, as the device plugin announced it."""
    id: str
    index: int
    count: int          # split count: how many pods may share it
    devmem: int         # MiB
    devcore: int        # normally 100 (percent)
    type: str           # model string, e.g. "NVIDIA H200"
    numa: int = 0
    mode: str = ""
    health: bool = False
    mig_profiles: list = field(default_factory=list)
    custom: dict = field(default_factory=dict)


@dataclass(slots=True)
class ContainerRequest:
    """What one container asks of one vendor."""
    vendor: str         # vendor key, e.g. "NVIDIA"
    nums: int           # number of devices
    memreq: int         # MiB (0 = use mempct)
    mempct: int         # percent of a device's memory; 101 = unset
    coresreq: int       # percent of a device's cores


@dataclass(slots=True)
class ContainerDevice:
    """One device given to one container: the unit of the allocation annotations."""
    uuid: str
    type: str           # vendor key as written into the annotation
    usedmem: int
    usedcores: int


# A pod's allocation for one vendor: one list per container (init containers first), each a list
# of devices. Empty inner lists keep the positions aligned with the containers.
PodDevices = list[list[ContainerDevice]]

# The registered mode of a device split into MIG instances: the cache keeps slice tables for it.
MODE_MIG = "mig"

# Reason code (see hami_py.scheduling.reasons) for a device a pod may not use, 0 when it may.
# A selector with a true ``per_kind`` attribute answers from the device's type and mode alone,
# so the filter asks it once per kind of device instead of once per device.
DeviceSelector = Callable[[DeviceInfo], int]


class DeviceVendor(Protocol):
    vendor_key: str                      # "NVIDIA"
    register_annotation: str             # node annotation carrying the inventory
    handshake_annotation: str | None
    to_allocate_annotation: str | None   # pod annotation the device plugin consumes
    allocated_annotation: str            # pod annotation the scheduler's cache reads back

    def resource_names(self) -> list[str]:
        """Every extended resource name this vendor manages (for managedResources)."""

    def quota_resources(self) -> tuple[str, str, int]:
        """(memory resource, core resource, memory factor) that namespace quotas may limit;
        empty names when the vendor has no such resource."""

    def parse_node_devices(self, annotations: dict[str, str]) -> list[DeviceInfo]:
        """Decode the node's inventory; [] when the node has no registration for this vendor.

        Raises DeviceDecodeError with a precise message when the annotation is garbled."""

    def container_request(self, container: dict, *, pod_annotations: dict[str, str]) -> ContainerRequest | None:
        """This vendor's request of one container (raw Kubernetes container dict), or None.

        Raises RequestError when a resource is present but malformed."""

    def mutate_admission(self, container: dict, pod: dict) -> bool:
        """Apply this vendor's admission-time defaults to one container (raw dict, changed in
        place; pod-level fields such as runtimeClassName go into ``pod``). True when the
        container asks for this vendor's devices after the defaults.

        Raises RequestError when the container's request is invalid (the pod is refused)."""

    def device_selector(self, pod_annotations: dict[str, str], node_annotations: dict[str, str]) -> DeviceSelector | None:
        """A per-device gate for pods that pick or avoid devices (type, UUID, cordon), or None
        when nothing restricts the pod on this node (the common case, which costs nothing)."""

    def encode_allocation(self, pod_devices: PodDevices) -> dict[str, str]:
        """The pod annotations that carry this allocation to the device plugin."""

    def decode_allocation(self, annotations: dict[str, str]) -> PodDevices | None:
        """Read back an allocation written by a scheduler (ours or upstream's); None if absent.

        Raises AllocationDecodeError when the annotation is garbled."""

    def encode_mig_allocations(self, instances: list[dict]) -> dict[str, str]:
        """The annotation listing the MIG instances a decision reserved ({} for none, or for a
        vendor without MIG)."""

    # Optional, read with getattr (absent means "not this vendor's"):
    #   score_annotation: str              node annotation with device pair scores (topology-aware)
    #   count_resource_name: str           the device-count resource (registration upkeep)
    #   health_follows_allocatable: bool   a count falling to 0 in allocatable means the plugin left
    #   decode_mig_allocations(annotations) -> [(GPU uuid, slice start, size, runtime identity | None)]
