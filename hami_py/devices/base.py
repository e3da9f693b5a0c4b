"""The vendor-neutral device interface.

One module (or package) per family under ``hami_py/devices/`` implements :class:`DeviceVendor`,
the way upstream keeps one package per vendor behind its ``Devices`` interface, plus one line in
``registry.py``. Everything outside ``devices/`` talks to vendors only through this class: the
cache, the filter, the binder and the webhook never name a vendor, its annotations or its rules.

Every hook has a default that means "this family has no such thing", so a simple family (whole
cards from node capacity) implements four methods, and a rich one (NVIDIA with MIG, Ascend with
templates and NetworkID groups) overrides what it needs. Nothing is read with ``getattr``.
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Callable

# Re-exported for the families: see "Kernel flags" below.
from hami_py.kernel_codes import (  # noqa: F401
    FLAG_CHARGE, FLAG_CHOOSE, FLAG_EQUAL_SHARE, FLAG_EXCLUSIVE, FLAG_SLOTS_FIRST,
)


class DeviceDecodeError(ValueError):
    """A node's registration cannot be decoded; the message says exactly why."""


class NoDevicesRegistered(DeviceDecodeError):
    """A registration that decodes to no device (``[]``): upstream's error, but nothing garbled
    to report: the node has none of the family, as if it registered nothing."""


class RequestError(ValueError):
    """A pod asks for a device resource in a way we cannot honour (e.g. ``gpumem: 1.5``)."""


class AllocationDecodeError(ValueError):
    """A pod's device allocation annotation is garbled."""


@dataclass(slots=True)
class DeviceInfo:
    """One registered device, as the device plugin announced it (or as its node's capacity
    implies, for the families whose plugins register nothing)."""
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
    # Device slots the container holds (a partition of several slices holds several); not in
    # the annotation's device encoding, which families that need it recover otherwise.
    slots: int = 1
    # Family data of a decision's device (not encoded, not compared).
    custom: dict | None = field(default=None, compare=False, repr=False)


@dataclass(slots=True, frozen=True)
class NodeView:
    """What a vendor may read of a node to build its inventory. Families that register through
    an annotation read ``annotations``; the ones whose plugins only advertise extended resources
    (Cambricon, Enflame, Kunlun whole cards) synthesise devices from ``capacity``."""
    name: str
    annotations: dict[str, str]
    labels: dict[str, str]
    capacity: dict[str, object]
    allocatable: dict[str, object]
    # The node's first InternalIP address ("" when it has none): where a family whose devices
    # are served over the network (remote GPUs) reaches the node.
    internal_ip: str = ""

    @classmethod
    def of(cls, annotations: dict[str, str] | None = None, *, name: str = "", labels: dict | None = None,
           capacity: dict | None = None, allocatable: dict | None = None, internal_ip: str = "") -> NodeView:
        return cls(name=name, annotations=annotations or {}, labels=labels or {},
                   capacity=capacity or {}, allocatable=allocatable if allocatable is not None else capacity or {},
                   internal_ip=internal_ip)

    @classmethod
    def from_node(cls, node: dict) -> NodeView:
        """The view of a Kubernetes Node object (raw dict)."""
        meta = node.get("metadata") or {}
        status = node.get("status") or {}
        return cls(name=meta.get("name") or "", annotations=meta.get("annotations") or {},
                   labels=meta.get("labels") or {}, capacity=status.get("capacity") or {},
                   allocatable=status.get("allocatable") or {}, internal_ip=internal_ip(node))


def internal_ip(node: dict) -> str:
    """The first ``InternalIP`` of a Node object's ``status.addresses`` ("" when it has none)."""
    addresses = (node.get("status") or {}).get("addresses")
    for address in addresses if isinstance(addresses, list) else ():
        if isinstance(address, dict) and address.get("type") == "InternalIP":
            value = address.get("address")
            if isinstance(value, str) and value:
                return value
    return ""


# A pod's allocation for one vendor: one list per container (init containers first), each a list
# of devices. Empty inner lists keep the positions aligned with the containers.
PodDevices = list[list[ContainerDevice]]

# The registered mode of a device split into MIG instances: the cache keeps slice tables for it.
MODE_MIG = "mig"

# Reason code (see hami_py.reasons) for a device a pod may not use, 0 when it may.
# A selector with a true ``per_kind`` attribute answers from the device's type and mode alone,
# so the filter asks it once per kind of device instead of once per device.
DeviceSelector = Callable[[DeviceInfo], int]

# Kernel flags a family sets (``DeviceVendor.kernel_flags``); the kernel applies them per
# request row of that family, so a family's rule never becomes a vendor branch in the filter.
# The numbers are the kernel's own (hami_py.kernel_codes, imported above):
#   FLAG_EXCLUSIVE    a device already hosting a task takes no other (whole cards)
#   FLAG_EQUAL_SHARE  a shared device takes only tasks of the memory size it already hosts
#   FLAG_CHOOSE       collect every fitting device of the node, then the vendor's chooser picks
#   FLAG_CHARGE       what a device of the row costs depends on the node: its Charger says
#   FLAG_SLOTS_FIRST  a device without all the slots one device of the row takes is refused for
#                     its slots (CardTimeSlicingExhausted) before memory and cores are checked

# The vendor's per-node choice among the devices that fit one request row (FLAG_CHOOSE):
#     chooser(node_index, positions, nums) -> (chosen positions, node score adjustment) | reason
# ``positions`` are offsets into the node's device list (``UsageCache.nodes[...].devices``), in
# the order the policy prefers; the answer is ``nums`` of them, or a reason code (hami_py.reasons)
# saying why none of the subsets is acceptable. It must bound its own work per node.
Chooser = Callable[[int, list[int], int], "tuple[list[int], float] | int"]


class Charger:
    """What one device of a FLAG_CHARGE family's request row costs on a node, for families whose
    charge is not the row's (a hardware partition charges its profile, chosen from the node's
    devices). The kernel calls it once per request row of the family and candidate node:

        charger(node_index, row) -> (memory MiB, cores percent, slots[, devices]) | reason code

    and checks and charges each device of the row with those values (``count - used >= slots``);
    ``devices`` (1 up to the row's count) is how many devices the row takes on that node (a family
    whose count depends on the node's devices; without it the row's count); a reason code
    (hami_py.reasons) refuses the node. A node with fewer devices of the family than the row's
    count still reads NodeInsufficientDevice unless ``devices`` fits it
    (``scheduling.kernel.reference._fit_row``). ``describe`` gives what the decision's
    annotations need of a chosen device (stored in ``ContainerDevice.custom``)."""

    def __call__(self, node_index: int, row: int) -> "tuple[int, int, int] | tuple[int, int, int, int] | int":
        raise NotImplementedError

    def describe(self, node_index: int, position: int, container: int) -> dict | None:
        """Custom data of the device at ``position`` of node ``node_index`` given to the pod's
        container ``container`` (init containers first), or None."""
        return None

    def settle(self, node_index: int, position: int, container: int, device: ContainerDevice) -> None:
        """The last word on one device of the winning node's decision, before its annotations are
        encoded and its reservation is charged (both read ``device``). By default its custom data
        is what :meth:`describe` says. A family whose charge is the device's own rather than the
        row's (a core mask that depends on which cores are free, a share of the device's compute
        units) sets ``device.usedmem``/``usedcores``/``type`` here: the annotations and the books
        then carry the same values. The kernel's checks use the charger's row values, so a family
        doing this returns values that never exceed the device's real charge, and refines the
        choice in its chooser."""
        device.custom = self.describe(node_index, position, container)


@dataclass(slots=True, frozen=True)
class ChoiceAsk:
    """What a family's chooser is built from, once per /filter: the pod's annotations, this
    family's request rows of the pod in the order the kernel asks the chooser about them on each
    node (one call per row, the node's rows in order; a node that fails a row is asked nothing
    more), whether each of those rows is an init container's (upstream fits each init container,
    and the app containers together, from the node as it was before the pod), and the names of
    the node and GPU policies the pod is placed with (the pod's, else the scheduler's; as upstream
    reads them: ``binpack``, ``spread``, ``mutex``, a comma chain ...), and the charger the family
    built for the same filter, for a family whose choice and charge are one computation."""
    pod_annotations: dict[str, str]
    rows: tuple[ContainerRequest, ...] = ()
    init_rows: tuple[bool, ...] = ()
    node_policy: str = ""
    gpu_policy: str = ""
    charger: "Charger | None" = None    # the family's charger of the same filter (FLAG_CHARGE)


class DeviceVendor:
    """One device family. Subclasses set the class attributes and override what they have."""

    vendor_key: str = ""                      # "NVIDIA": the key in allocation annotations
    # Node annotations: the inventory (None when it comes from node capacity), a companion that
    # re-decodes the inventory when it changes (NVIDIA's pair scores), and the handshake.
    register_annotation: str | None = None
    companion_annotation: str | None = None
    handshake_annotation: str | None = None
    # Pod annotations: what the device plugin consumes, and what the cache reads back.
    to_allocate_annotation: str | None = None
    allocated_annotation: str = ""
    # The resource whose allocatable count says whether the device plugin is alive.
    count_resource_name: str = ""
    # Upstream's allocatable-aware health: the count falling to 0 means the plugin left, at once.
    health_follows_allocatable: bool = False
    # HAMi's shared node lock (``hami.io/mutex.lock``) is taken at bind for this family's pods;
    # ``extra_lock_annotation`` names the family's own lock, taken as well (Cambricon's).
    uses_node_lock: bool = True
    # Node annotations this family's device selector reads, besides the generic ``hami.io/device-*``
    # ones (e.g. a node-level switch): the cache keeps them for the selector.
    gate_annotations: tuple[str, ...] = ()
    extra_lock_annotation: str | None = None
    extra_lock_expiry_s: float = 120.0
    kernel_flags: int = 0
    # Pod annotations the cache keeps with each pod's charge (``PodUsage.marks``) for this
    # family's chooser, which reads them back of the pods already on a device
    # (``UsageCache.device_marks``): a device whose mode follows the tasks it hosts.
    pod_marks: tuple[str, ...] = ()
    # A pooled family's devices are not the candidate node's own but one pool for the whole
    # cluster (GPUs served over the network by other nodes): its requests are no kernel rows;
    # ``pool_choice`` picks its devices once per /filter, ``pool_refusal`` says which nodes may
    # not host such a pod, and ``charge_node`` which node's books a given device is charged to.
    pooled: bool = False
    # The family checks the namespace quota on its resources in its own chooser, because what
    # its devices are charged is not what a quota counts (see ``quota_cores``): the kernel's quota
    # sum, which adds charges, leaves the family out (``QuotaBook.headroom``).
    quota_in_chooser: bool = False

    # -- resources and config --------------------------------------------------------------

    def resource_names(self) -> list[str]:
        """Every extended resource name this family manages (for managedResources)."""
        return []

    def request_resources(self) -> tuple[str, str, str, int]:
        """(count, memory, core resource name, MiB a memory unit) a container asks with, "" where
        the family has none: how a simple request (n devices, m MiB, c cores) is spelled for
        this family (the simulator's workload shorthand)."""
        names = self.resource_names()
        return (names[0] if names else "", "", "", 1)

    def request_resource_names(self) -> frozenset[str] | None:
        """Every container resource name (a key of ``resources.limits`` or ``resources.requests``)
        whose presence can make :meth:`container_request` answer a request or raise; None when
        something else can (a pod annotation alone, say). The filter asks a family only about the
        containers naming one of these (every container when None), so a name left out here is a
        request silently ignored: a family declares everything its ``container_request`` reads."""
        return None

    def quota_resources(self) -> tuple[str, str, int]:
        """(memory resource, core resource, memory factor) that namespace quotas may limit;
        empty names when upstream checks no quota for the family."""
        return "", "", 1

    def quota_cores(self, cores: int) -> int:
        """What one device charged ``cores`` (the books' value) counts against a core quota: the
        value itself, except for a family whose charge is no count of cores (a core mask)."""
        return cores

    def quota_request(self, container: dict, request: ContainerRequest) -> tuple[int, int]:
        """(memory MiB, cores) one container's request counts against the namespace's quota at
        admission (``request`` is :meth:`container_request`'s answer for it): each device's
        share times the devices, unless the family's request is no per-device share."""
        return request.memreq * request.nums, request.coresreq * request.nums

    def config_problems(self) -> list[str]:
        """What is wrong with this family's configured values, each one phrase starting with the
        family (``nvidia: defaultCores is a percentage ...``); [] when nothing is. The scheduler
        refuses to start on any, naming them all (``registry.build_vendors``)."""
        return []

    # -- inventory -------------------------------------------------------------------------

    def registration_inputs(self, node: NodeView) -> object:
        """Whatever the inventory is decoded from: the cache decodes again only when it changes."""
        annotations = node.annotations
        return (annotations.get(self.register_annotation) if self.register_annotation else None,
                annotations.get(self.companion_annotation) if self.companion_annotation else None)

    def parse_node_devices(self, node: NodeView) -> list[DeviceInfo]:
        """Decode the node's inventory; [] when the node has none of this family.

        Raises DeviceDecodeError with a precise message when the registration is garbled."""
        return []

    def registration_source(self) -> str:
        """Where the inventory comes from, for error messages."""
        return self.register_annotation or f"{self.count_resource_name} capacity"

    # -- requests and admission ------------------------------------------------------------

    def container_request(self, container: dict, *, pod_annotations: dict[str, str]) -> ContainerRequest | None:
        """This family's request of one container (raw Kubernetes container dict), or None.

        Raises RequestError when a resource is present but malformed."""
        return None

    def mutate_admission(self, container: dict, pod: dict) -> bool:
        """Apply this family's admission-time defaults to one container (raw dict, changed in
        place; pod-level fields such as runtimeClassName go into ``pod``). True when the
        container asks for this family's devices after the defaults.

        Raises RequestError when the container's request is invalid (the pod is refused)."""
        return False

    def admission_refusal(self, pod_annotations: dict[str, str]) -> str | None:
        """Why the webhook denies a pod for one of this family's pod annotations (a value no
        fit could honour, such as a MIG profile no GPU may have), or None. Asked of every pod
        the webhook admits for this scheduler, before any mutation."""
        return None

    # -- fit -------------------------------------------------------------------------------

    def device_selector(self, pod_annotations: dict[str, str], node_annotations: dict[str, str]) -> DeviceSelector | None:
        """A per-device gate for pods that pick or avoid devices (type, UUID, cordon, mode), or
        None when nothing restricts the pod on this node (the common case, which costs nothing).
        ``node_annotations`` holds the node's ``hami.io/device-*`` annotations and the family's
        ``gate_annotations`` only."""
        return None

    def allows_partitions(self, pod_annotations: dict[str, str]) -> bool:
        """Whether this pod may be given partitions of a device (MIG instances) at all."""
        return True

    def partition_ranks(self, pod_annotations: dict[str, str], profile_names: list[str]) -> array | None:
        """The partition profiles this pod would rather have, if it says: an ``array("i")`` with
        one rank per name of the partition table's profile list (``profile_names``), 1 for the
        most preferred, 0 for a profile it does not name; the kernel tries ranked profiles first
        on each device. None (the default, and a pod stating nothing): smallest profile first."""
        return None

    def numa_bind(self, pod_annotations: dict[str, str]) -> bool:
        """Whether the pod asks for all of this family's devices on one NUMA node."""
        return False

    def charger(self, cache, pod: dict, row_container: list[int]) -> Charger | None:
        """The per-node charge for FLAG_CHARGE families (see :class:`Charger`): ``row_container``
        gives each request row's container position (init containers first)."""
        return None

    def chooser(self, cache, ask: "ChoiceAsk") -> Chooser | None:
        """The per-node choice for FLAG_CHOOSE families (see :data:`Chooser`), built once per
        /filter from what the pod asks (:class:`ChoiceAsk`); ``cache`` gives the node's devices
        (``cache.devices_at(node_index)``), usage arrays and, for the families that keep them, the
        pods' marks per device (``cache.device_marks(node_index)``, see ``pod_marks``)."""
        return None

    # -- pooled families (``pooled``) -------------------------------------------------------

    def charge_node(self, device_id: str, pod_node: str) -> str:
        """The node whose books hold ``device_id`` when a pod placed on ``pod_node`` is given it:
        the pod's own node, except for a pooled family (the node serving the device)."""
        return pod_node

    def pool_refusal(self, cache, node: str) -> str | None:
        """Why ``node`` may not host a pod asking this pooled family (it serves the pool itself),
        or None. Asked once per candidate node of such a pod's /filter."""
        return None

    def pool_choice(self, cache, asks: list[tuple[int, ContainerRequest]], containers: int,
                    pod_annotations: dict[str, str]) -> "PodDevices | str":
        """The pooled family's devices for a pod, chosen once per /filter from the books
        (synchronously: the same stretch as the reservation): ``asks`` are (container position,
        request) of the containers asking for the family, init containers first; the answer is one
        device list per container (``containers`` of them), or the text of why the pool cannot
        serve the pod (every candidate node fails with it)."""
        return "this family has no pool"

    def background(self, cache) -> list:
        """Coroutines the scheduler runs while it serves (cancelled when it stops): upkeep a
        family needs outside any request, such as polling the servers of a pool."""
        return []

    # -- allocation annotations ------------------------------------------------------------

    def encode_allocation(self, pod_devices: PodDevices, *, node: str = "", partitions: list[dict] = (),
                          now: float = 0.0, pod_annotations: dict[str, str] | None = None) -> dict[str, str]:
        """Every pod annotation a decision writes for this family ({} when no container got one
        of its devices). ``partitions`` lists the MIG-like instances the decision reserved;
        ``pod_annotations`` are the pod's own (a family whose annotations depend on the pod's mode)."""
        return {}

    def decision_annotations(self) -> tuple[str, ...]:
        """Every pod annotation key :meth:`encode_allocation` may write (cleared with a stale
        decision)."""
        return tuple(k for k in (self.to_allocate_annotation, self.allocated_annotation) if k)

    def decode_allocation(self, annotations: dict[str, str]) -> PodDevices | None:
        """Read back an allocation written by a scheduler (ours or upstream's); None if absent.
        It (and :meth:`decode_partitions`) reads only ``allocated_annotation`` and the keys of
        :meth:`decision_annotations`: the cache asks a vendor only for pods carrying one of them.

        Raises AllocationDecodeError when the annotation is garbled."""
        return None

    def decode_partitions(self, annotations: dict[str, str]) -> list[tuple[str, int, int, tuple | None]]:
        """The partitions a pod holds: (device id, slice start, size, runtime identity or None)."""
        return []

    def upstream_refusal(self, counts: dict[int, int], total: int) -> tuple[dict[int, int], int]:
        """How upstream words a node where a pod asking this family alone does not fit, from the
        kernel's per-device reason counts and device total. Most families' upstream Fit counts a
        reason per device as the kernel does (the default, unchanged); one whose Fit answers a
        single summary reason rewrites the counts here (Kunlun vXPU)."""
        return counts, total

    # -- metrics -----------------------------------------------------------------------------

    def core_metrics(self, total_cores: int, used_cores: int) -> tuple[int, int]:
        """(limit, allocated) cores as the ``hami_*`` metrics report them: a family that counts
        compute units rather than percent (AMD) converts here; the legacy names stay raw."""
        return total_cores, used_cores

    def core_share(self, total_cores: int, used_cores: int) -> float:
        """Percent of one device's compute that ``used_cores`` of its ``total_cores`` is, for
        people to read (the simulator's pod table). Most families count cores in percent of a
        device already; AMD counts compute units and AWS Neuron a core mask, and say so here."""
        return round(100.0 * used_cores / total_cores, 1) if total_cores > 0 else 0.0
