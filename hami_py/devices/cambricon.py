"""Cambricon MLUs, shared through Cambricon's DSMLU (dynamic sMLU) device plugin.

The plugin registers nothing in annotations: it advertises extended resources, and the scheduler
synthesises the inventory from the node's capacity (upstream's rule, kept exactly):

* ``C`` = capacity of the core resource (``cambricon.com/mlu.smlu.vcore``, 100 per card),
  ``M`` = capacity of the memory resource (``cambricon.com/mlu.smlu.vmemory``, units of 256 MiB);
* devices ``i = 0 .. ceil(C/100) - 1``: id ``<node>-cambricon-mlu-<i>``, 100 slots,
  ``floor(M x 256 x 100 / C)`` MiB, 100 cores, always healthy; their type is the node's ``Model``
  label (Cambricon's device plugin publishes it with ``--node-label``, e.g. ``MLU370-X4``) when it
  names an MLU, else ``MLU`` (HAMi after v2.10, #2780).

Pods pick or avoid models with ``cambricon.com/use-mlutype`` / ``cambricon.com/nouse-mlutype``
(comma lists, matched upper-cased by substring, as every family's type lists); a constraint on a
node without a readable model matches only what ``MLU`` itself contains.

A container asks with ``cambricon.com/vmlu`` (count), the memory resource (256 MiB units) and the
core resource (percent, default 100: a card is exclusive unless the container names its cores).
Namespace quotas are checked at fit (factor 256). The decision writes the allocation keys plus
``CAMBRICON_DSMLU_ASSIGNED=false`` and ``CAMBRICON_DSMLU_PROFILE=<index>_<cores>_<memory/256>`` of
the first device of the first container given one, which is what the DSMLU plugin reads. The
family's own node lock is ``cambricon.com/dsmlu.lock`` (an RFC3339 time, 2 minutes).

Deliberate differences from upstream (see docs/devices/cambricon.md): a malformed request value
is refused with a RequestError instead of dropping the container's request (count, memory) or
silently taking the default (cores); a malformed capacity is a DeviceDecodeError naming the
resource and value instead of a node without MLUs (or a device whose memory wrapped around int32).
"""
from __future__ import annotations

import structlog

from hami_py.config import ConfigSection, DeviceConfig
from hami_py.devices.base import DeviceDecodeError, DeviceInfo, NodeView, PodDevices
from hami_py.devices.codec import encode_pod_devices
from hami_py.devices.template import MAX_CAPACITY_CARDS, ResourceNamesConfig, TemplateSpec, TemplateVendor, quote_value
from hami_py.quantity import INT32_MAX, parse_exact_int

log = structlog.get_logger(__name__)

VENDOR_KEY = "MLU"
SECTION = "cambricon"

TO_ALLOCATE_ANNOTATION = "hami.io/cambricon-mlu-devices-to-allocate"
ALLOCATED_ANNOTATION = "hami.io/cambricon-mlu-devices-allocated"
USE_UUID_ANNOTATION = "cambricon.com/use-gpuuuid"
NOUSE_UUID_ANNOTATION = "cambricon.com/nouse-gpuuuid"
USE_TYPE_ANNOTATION = "cambricon.com/use-mlutype"
NOUSE_TYPE_ANNOTATION = "cambricon.com/nouse-mlutype"
# Published by Cambricon's device plugin (v2.0.20 and later, with --node-label): the cards' model.
MODEL_LABEL = "Model"
# Read by Cambricon's DSMLU device plugin.
DSMLU_ASSIGNED_ANNOTATION = "CAMBRICON_DSMLU_ASSIGNED"
DSMLU_PROFILE_ANNOTATION = "CAMBRICON_DSMLU_PROFILE"
DSMLU_LOCK_ANNOTATION = "cambricon.com/dsmlu.lock"
DSMLU_LOCK_EXPIRY_S = 120.0

MEMORY_UNIT = 256          # MiB per unit of the memory resource
DEVICE_ID_INFIX = "-cambricon-mlu-"
CORES_PER_DEVICE = 100


# ---------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------

CambriconConfig = ResourceNamesConfig     # the ``cambricon`` section: count, memory and core names
CONFIG_SECTION = ConfigSection(SECTION, CambriconConfig.KEYS)

# ---------------------------------------------------------------------------------------------
# The vendor
# ---------------------------------------------------------------------------------------------

def device_id(node: str, index: int) -> str:
    return f"{node}{DEVICE_ID_INFIX}{index}"


def device_index(uuid: str) -> int:
    """The card index of a synthesised device id (``<node>-cambricon-mlu-<i>``)."""
    head, infix, tail = uuid.rpartition(DEVICE_ID_INFIX)
    if not infix or not tail.isdigit() or not tail.isascii():
        raise ValueError(f"device id {uuid!r} is not a Cambricon MLU id (<node>{DEVICE_ID_INFIX}<index>)")
    return int(tail)


def mlu_model(label: object) -> str:
    """The cards' type from the node's ``Model`` label: the label, trimmed, when it names an MLU
    (upper-cased it contains ``MLU``), else ``MLU`` (missing, blank, or another vendor's word)."""
    model = label.strip() if isinstance(label, str) else ""
    return model if VENDOR_KEY in model.upper() else VENDOR_KEY


class CambriconVendor(TemplateVendor):
    """Upstream's ``MLU`` vendor: capacity-synthesised cards, quota at fit, the DSMLU profile."""

    # Upstream takes only the DSMLU lock for MLU pods, never hami.io/mutex.lock: Cambricon's
    # plugin releases the DSMLU lock, and knows nothing of HAMi's shared one.
    uses_node_lock = False
    extra_lock_annotation = DSMLU_LOCK_ANNOTATION
    extra_lock_expiry_s = DSMLU_LOCK_EXPIRY_S

    def __init__(self, config: CambriconConfig):
        super().__init__(TemplateSpec(
            vendor_key=VENDOR_KEY,
            count_resource=config.resource_count_name,
            memory_resource=config.resource_memory_name,
            core_resource=config.resource_core_name,
            memory_unit=MEMORY_UNIT,
            default_cores=100,
            to_allocate_annotation=TO_ALLOCATE_ANNOTATION,
            allocated_annotation=ALLOCATED_ANNOTATION,
            use_uuid=(USE_UUID_ANNOTATION,),
            nouse_uuid=(NOUSE_UUID_ANNOTATION,),
            use_type=USE_TYPE_ANNOTATION,
            nouse_type=NOUSE_TYPE_ANNOTATION,
            quota=True,
        ))
        self.config = config
        # No handshake and always healthy (upstream's CheckHealth is true, true): the count
        # resource must not take part in the generic plugin-liveness judgement.
        self.count_resource_name = ""

    # -- inventory -------------------------------------------------------------------------

    def registration_inputs(self, node: NodeView) -> object:
        """The two capacities and the model label the inventory is computed from: decoded again
        only when they change."""
        capacity = node.capacity
        config = self.config
        return (capacity.get(config.resource_core_name) if config.resource_core_name else None,
                capacity.get(config.resource_memory_name) if config.resource_memory_name else None,
                node.labels.get(MODEL_LABEL))

    def registration_source(self) -> str:
        return f"node capacity {self.config.resource_core_name}/{self.config.resource_memory_name}"

    def parse_node_devices(self, node: NodeView) -> list[DeviceInfo]:
        """The cards the node's capacity implies; [] when it advertises no MLU core.

        A capacity of 0 is what the kubelet leaves behind once the plugin is gone: no devices,
        as upstream. A capacity that is not a whole number, is negative, implies more than
        MAX_CAPACITY_CARDS cards, or gives a card more memory than int32 MiB raises DeviceDecodeError.
        """
        core_name, memory_name = self.config.resource_core_name, self.config.resource_memory_name
        if not core_name:
            return []
        raw_cores = node.capacity.get(core_name)
        if raw_cores is None:
            return []
        cores = parse_exact_int(raw_cores)
        if cores is None:
            raise DeviceDecodeError(f"{core_name} {quote_value(raw_cores)} is not a whole number")
        if cores < 0:
            raise DeviceDecodeError(f"{core_name} {quote_value(raw_cores)} must not be negative")
        if cores == 0:
            return []
        count = -(-cores // CORES_PER_DEVICE)
        if count > MAX_CAPACITY_CARDS:
            raise DeviceDecodeError(f"{core_name} {quote_value(raw_cores)} implies {count} devices, "
                                    f"more than {MAX_CAPACITY_CARDS}")
        memory = 0
        raw_memory = node.capacity.get(memory_name) if memory_name else None
        if raw_memory is not None:
            memory = parse_exact_int(raw_memory)
            if memory is None:
                raise DeviceDecodeError(f"{memory_name} {quote_value(raw_memory)} is not a whole number")
            if memory < 0:
                raise DeviceDecodeError(f"{memory_name} {quote_value(raw_memory)} must not be negative")
        devmem = memory * MEMORY_UNIT * CORES_PER_DEVICE // cores
        if devmem > INT32_MAX:
            raise DeviceDecodeError(f"{memory_name} {quote_value(raw_memory)} over {core_name} "
                                    f"{quote_value(raw_cores)} gives {devmem} MiB per device, more than {INT32_MAX}")
        model = mlu_model(node.labels.get(MODEL_LABEL))
        return [DeviceInfo(id=device_id(node.name, i), index=i, count=CORES_PER_DEVICE, devmem=devmem,
                           devcore=CORES_PER_DEVICE, type=model, numa=0, mode="", health=True)
                for i in range(count)]

    # -- allocation annotations ------------------------------------------------------------

    def encode_allocation(self, pod_devices: PodDevices, *, node: str = "", partitions: list[dict] = (),
                          now: float = 0.0, pod_annotations: dict[str, str] | None = None) -> dict[str, str]:
        if not any(pod_devices):
            return {}
        text = encode_pod_devices(pod_devices)
        first = next(container[0] for container in pod_devices if container)
        return {
            TO_ALLOCATE_ANNOTATION: text,
            ALLOCATED_ANNOTATION: text,
            DSMLU_ASSIGNED_ANNOTATION: "false",
            # Go's int32 division truncates toward zero; usedmem is never negative here.
            DSMLU_PROFILE_ANNOTATION: f"{device_index(first.uuid)}_{first.usedcores}_{first.usedmem // MEMORY_UNIT}",
        }

    def decision_annotations(self) -> tuple[str, ...]:
        return TO_ALLOCATE_ANNOTATION, ALLOCATED_ANNOTATION, DSMLU_ASSIGNED_ANNOTATION, DSMLU_PROFILE_ANNOTATION


def build_family(config: DeviceConfig, switches) -> list[CambriconVendor]:
    """Always built, as upstream always initialises it (without a section, with empty names,
    so it matches no container and synthesises no device)."""
    return [CambriconVendor(CambriconConfig.from_section(config.section(SECTION)))]
