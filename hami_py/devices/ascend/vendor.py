"""One Ascend chip kind (``Ascend910B3``, ``Ascend310P`` ...) as a device vendor.

Everything is keyed by the config entry's ``commonWord`` (``<cw>``), as HAMi's Ascend device
plugin keys it: it registers the node's NPUs in ``hami.io/node-register-<cw>`` (JSON, with a
numeric ``NetworkID`` in ``customInfo`` for 910 kinds), answers the handshake
``hami.io/node-handshake-<cw>``, advertises ``huawei.com/<cw>``-style resources and says in the
node annotation ``hami-vnpu-core`` whether the node runs the soft split (hami-core).

A pod asks for a count, memory (MiB × ``memoryFactor``) and, in soft mode only, cores; the
webhook rounds hard-split memory up to the smallest vNPU template that holds it. The decision
writes the allocation (``hami.io/<cw>-devices-to-allocate`` / ``-allocated``), ``predicate-time``
and the runtime JSON ``huawei.com/<cw>`` the plugin turns into a vNPU (template name, memory,
cores). The fit is upstream's generic template; the chooser (:mod:`.topology`) adds 910C module
pairs and NetworkID grouping, and the node score's NetworkID term.
"""
from __future__ import annotations

from typing import Mapping

import orjson
import structlog

from hami_py.devices.ascend.config import VnpuConfig
from hami_py.devices.ascend import topology
from hami_py.devices.base import (
    FLAG_CHOOSE, Chooser, DeviceDecodeError, DeviceInfo, DeviceSelector, NoDevicesRegistered, PodDevices,
    RequestError,
)
from hami_py.devices.codec import decode_json_devices, encode_pod_devices
from hami_py.devices.overwrite_env import overwrite_env
from hami_py.devices.template import (
    MISSING, TemplateSpec, TemplateVendor, append_env, device_count, ensure_limits, lookup, percentage, request_error,
    resource_lists, rounded_quantity,
)
from hami_py.quantity import INT32_MAX, parse_exact_int
from hami_py.reasons import ALLOCATED_CARDS_INSUFFICIENT_REQUEST, MODE_NOT_FIT, OK

log = structlog.get_logger(__name__)

# Pod annotations
VNPU_MODE_ANNOTATION = "huawei.com/vnpu-mode"
VNPU_MODE_HAMI_CORE = "hami-core"           # soft split: memory and cores enforced by hami-vnpu-core
PREDICATE_TIME_ANNOTATION = "predicate-time"
# Node annotation the device plugin writes ("true"/"false"); it overrides vnpus.hamiVnpuCore.
NODE_HAMI_CORE_ANNOTATION = "hami-vnpu-core"
# Container environment the webhook sets for containers that ask for no NPU (overwriteEnv).
VISIBLE_DEVICES_ENV = "ASCEND_VISIBLE_DEVICES"

# Go's encoding/json escapes these inside strings (HTML safety); the plugin reads either form,
# the text is kept identical to upstream's anyway.
_GO_JSON_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026",
                                  "\u2028": "\\u2028", "\u2029": "\\u2029"})


def _always(reason: int) -> DeviceSelector:
    def select(device: DeviceInfo) -> int:
        return reason
    select.per_kind = True
    return select


def _then(first: DeviceSelector, second: DeviceSelector | None) -> DeviceSelector:
    """``first``'s reason, else ``second``'s (the mode gate comes before the UUID gate)."""
    if second is None:
        return first

    def select(device: DeviceInfo) -> int:
        return first(device) or second(device)
    select.per_kind = getattr(first, "per_kind", False) and getattr(second, "per_kind", False)
    return select


class AscendVendor(TemplateVendor):
    """One ``vnpus.configs`` entry."""

    gate_annotations = (NODE_HAMI_CORE_ANNOTATION,)

    def __init__(self, config: VnpuConfig, *, hami_vnpu_core: bool = False, family_resources: tuple[str, ...] = ()):
        cw = config.common_word
        super().__init__(TemplateSpec(
            vendor_key=cw,
            count_resource=config.resource_name,
            memory_resource=config.resource_memory_name,
            core_resource=config.resource_core_name,
            memory_unit=max(config.memory_factor, 1),
            default_cores=0,
            register_annotation=f"hami.io/node-register-{cw}",
            register_format="json",
            handshake_annotation=f"hami.io/node-handshake-{cw}",
            to_allocate_annotation=f"hami.io/{cw}-devices-to-allocate",
            allocated_annotation=f"hami.io/{cw}-devices-allocated",
            use_uuid=(f"hami.io/use-{cw}-uuid",),
            nouse_uuid=(f"hami.io/no-use-{cw}-uuid",),
            quota=True,
        ))
        self.config = config
        self.hami_vnpu_core = hami_vnpu_core
        # Every chip kind's resource names: a container asking for any Ascend NPU keeps its
        # ASCEND_VISIBLE_DEVICES, whichever chip's vendor looks at it (HAMi #2953).
        self.family_resources = frozenset(family_resources) | {r for r in (
            config.resource_name, config.resource_memory_name, config.resource_core_name) if r}
        self.runtime_annotation = f"huawei.com/{cw}"
        # 910 kinds choose among all fitting NPUs (NetworkID groups, 910C pairs) and score the
        # node by NetworkID; the others (310P) are plain first-fit.
        self.kernel_flags = FLAG_CHOOSE if cw.startswith(topology.ASCEND910_PREFIX) else 0
        # node index -> (the device list read, (indexes, NetworkIDs, topology mode)) for the chooser
        self._node_facts: dict[int, tuple[list, tuple]] = {}

    # -- inventory -------------------------------------------------------------------------

    def registration_inputs(self, node) -> object:
        """The registration, and whether the node runs the soft split (it sets the NPUs' cores)."""
        return (*super().registration_inputs(node), node.annotations.get(NODE_HAMI_CORE_ANNOTATION))

    def parse_node_devices(self, node) -> list[DeviceInfo]:
        """The NPUs of ``hami.io/node-register-<cw>``, exactly as registered: every device of this
        annotation belongs to this kind (never to another kind whose name contains it), its type
        is left as the plugin wrote it. Upstream's Ascend fit reads no device mode, so a ``mode``
        in the registration is dropped (it must not make the cache treat an NPU as MIG).

        Raises DeviceDecodeError for garbled JSON, an empty list, or a ``NetworkID`` that is not
        a number (upstream would silently leave such an NPU out of every topology choice)."""
        text = node.annotations.get(self.spec.register_annotation)
        if text is None:
            return []
        devices = decode_json_devices(text)
        if not devices:
            raise NoDevicesRegistered("no device found on node")
        # On a node running the soft split, hami-vnpu-core enforces an NPU's cores as a percentage,
        # and upstream checks a hami-core pod's cores against 100 whatever ``devcore`` the plugin
        # registered (the only pods that ask for cores: the webhook refuses a core request
        # outside hami-core mode). The NPU's cores are then 100 in the books.
        percent = self.node_supports_hami_core(node.annotations)
        for position, device in enumerate(devices):
            device.mode = ""
            if percent:
                device.devcore = 100
            if topology.NETWORK_ID_KEY in device.custom and topology.network_id_of(device.custom) is None:
                raw = orjson.dumps(device.custom[topology.NETWORK_ID_KEY]).decode()
                raise DeviceDecodeError(
                    f'device {position}: field "customInfo.{topology.NETWORK_ID_KEY}": expected a number, got {raw}')
        return devices

    def config_problems(self) -> list[str]:
        factor = self.config.memory_factor
        return [f"vnpus {self.config.common_word}: memoryFactor must not be negative, got {factor}"] \
            if factor < 0 else []

    # -- requests --------------------------------------------------------------------------

    def request_memory(self, container: str, limits: dict, requests: dict) -> int:
        """MiB asked for, × ``memoryFactor`` when it is above 1 (0 when not asked: the whole NPU)."""
        name = self.spec.memory_resource
        raw = lookup(limits, requests, name)
        if raw is MISSING:
            return 0
        number = parse_exact_int(raw)
        if number is None:
            raise request_error(container, name, raw, "is not a whole number of MiB")
        if number < 0:
            raise request_error(container, name, raw, "must not be negative")
        if number > INT32_MAX:
            raise request_error(container, name, raw, f"is out of range: Ascend memory is in MiB, at most "
                                                      f"{INT32_MAX} (ask for 16384, not 16Gi, for 16 GiB)")
        factor = self.spec.memory_unit
        if factor > 1 and number * factor > INT32_MAX:
            raise request_error(container, name, raw, f"is out of range: × memoryFactor {factor} exceeds "
                                                      f"{INT32_MAX} MiB")
        return number * factor

    def request_cores(self, container: str, limits: dict, requests: dict, nums: int) -> int:
        """Cores (percent of an NPU, hami-core only): an integer in 0..100, as every family's."""
        name = self.spec.core_resource
        raw = lookup(limits, requests, name)
        if raw is MISSING:
            return 0
        return percentage(container, name, raw)

    # -- admission -------------------------------------------------------------------------

    def trim_memory(self, memory: int) -> tuple[int, str]:
        """Upstream's rounding: (memory of the smallest template holding ``memory``, its name);
        else (``memoryAllocatable``, "") when the device holds it; else (0, "")."""
        for template in self.config.templates:
            if memory <= template.memory:
                return template.memory, template.name
        if memory <= self.config.memory_capacity:
            return self.config.memory_allocatable, ""
        return 0, ""

    def mutate_admission(self, container: dict, pod: dict) -> bool:
        """Upstream's webhook for one container, in its order:

        no count in limits → only ``ASCEND_VISIBLE_DEVICES=""`` with ``overwriteEnv`` (or the pod's
        ``hami.io/overwrite-env`` annotations: devices/overwrite_env.py), unless the container asks
        for any chip kind's NPUs; a 910C
        super-pod request of 1 becomes 2 (limits, and requests when present), other odd counts
        are refused; outside hami-core mode a core request is refused; memory (limits only) is
        kept as asked in hami-core mode, else rounded up to the smallest template holding it (or
        ``memoryAllocatable`` when only the whole device holds it), and without a memory limit it
        is ``memoryAllocatable``; several NPUs with less than a whole one each are refused outside
        hami-core mode; the memory goes into limits and requests; ``runtimeClassName`` is set
        when configured and unset.

        Raises RequestError with upstream's message for its refusals, and for a count or memory
        that is no whole non-negative number (upstream lets those through to be dropped later).
        """
        config = self.config
        name = str(container.get("name") or "")
        limits, requests = resource_lists(container)
        count_name = self.spec.count_resource
        if not count_name or count_name not in limits:
            asks_ascend = any(r in self.family_resources for values in (limits, requests) for r in values)
            if not asks_ascend and overwrite_env(pod, container, default=config.overwrite_env):
                append_env(container, VISIBLE_DEVICES_ENV, "")
            return False
        count = device_count(name, count_name, limits[count_name])
        limits = ensure_limits(container)
        units = count       # what a vNPU may not span more than one of: an NPU, a super-pod 910C's module
        if config.common_word == topology.ASCEND910C and config.super_pod:
            units = (count + 1) // 2
            if count == 1:
                # The smallest unit of a super-pod 910C is one module: its two NPUs.
                log.info("Ascend910C request of 1 NPU raised to one module (2 NPUs)", container=name,
                         pod=(pod.get("metadata") or {}).get("name", ""))
                limits[count_name] = "2"
                if count_name in requests:
                    requests[count_name] = "2"
            elif count % 2:
                raise RequestError(f"Ascend910C device request must be 1 or 2*n, got {count}")
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        soft = annotations.get(VNPU_MODE_ANNOTATION) == VNPU_MODE_HAMI_CORE
        core_name = self.spec.core_resource
        if not soft and core_name:
            raw = lookup(limits, requests, core_name)
            if raw is not MISSING and rounded_quantity(name, core_name, raw) > 0:
                raise RequestError(f"{core_name} is only supported in hami-core (soft split) mode")
        memory = config.memory_allocatable
        memory_name = self.spec.memory_resource
        if memory_name and memory_name in limits:
            asked = rounded_quantity(name, memory_name, limits[memory_name])
            if asked < 0:
                raise request_error(name, memory_name, limits[memory_name], "must not be negative")
            if soft:
                memory = asked
            else:
                memory, _ = self.trim_memory(asked)
                if memory <= 0:
                    raise RequestError(f"{memory_name} {asked} is invalid")
        # A module's request (2 NPUs, or 1 raised to 2 above) is one unit either way, so the pod this
        # returns, reviewed again (reinvocationPolicy: IfNeeded), is admitted as the first pass was.
        if units > 1 and not soft and memory != config.memory_allocatable:
            raise RequestError("vNPU not supported for multiple devices")
        if memory_name:
            resources = container["resources"]
            if not isinstance(resources.get("requests"), dict):
                resources["requests"] = {}
            limits[memory_name] = str(memory)
            resources["requests"][memory_name] = str(memory)
        spec = pod.setdefault("spec", {})
        if spec.get("runtimeClassName") is None and config.runtime_class_name:
            spec["runtimeClassName"] = config.runtime_class_name
        return True

    # -- fit -------------------------------------------------------------------------------

    def node_supports_hami_core(self, node_annotations: Mapping[str, str]) -> bool:
        """The node's ``hami-vnpu-core`` annotation (``"true"`` or anything else) when present,
        else the global ``vnpus.hamiVnpuCore``."""
        value = node_annotations.get(NODE_HAMI_CORE_ANNOTATION)
        return self.hami_vnpu_core if value is None else value == "true"

    def device_selector(self, pod_annotations: dict[str, str], node_annotations: dict[str, str]) -> DeviceSelector | None:
        """The UUID gate (``hami.io/use-<cw>-uuid`` / ``hami.io/no-use-<cw>-uuid``), preceded
        for a hami-core pod by the node's soft-split support: a node without it refuses every
        NPU with ModeNotFit. A hami-core pod always gets a selector (OK on a supporting node),
        so a node's own answer replaces the one judged without node annotations."""
        uuids = super().device_selector(pod_annotations, node_annotations)
        if pod_annotations.get(VNPU_MODE_ANNOTATION) != VNPU_MODE_HAMI_CORE:
            return uuids
        if self.node_supports_hami_core(node_annotations):
            return uuids if uuids is not None else _always(OK)
        return _then(_always(MODE_NOT_FIT), uuids)

    def chooser(self, cache, ask) -> Chooser | None:
        """The per-node choice of :mod:`.topology` (910 kinds only). Per node, once per filter:
        each position's registered index and NetworkID, and whether every NPU of this kind on the
        node has one (topology mode)."""
        if not self.kernel_flags & FLAG_CHOOSE:
            return None
        cw = self.vendor_key
        vendor_id = cache.vendor_ids.get(cw)
        # A node's facts change only with its registration, which replaces its device list: they
        # are kept across filters, checked against the list they were read from.
        known = self._node_facts

        def node_facts(node_index: int) -> tuple[list[int], list[int | None], bool]:
            devices = cache.devices_at(node_index)
            found = known.get(node_index)
            if found is not None and found[0] is devices:
                return found[1]
            offset = cache.node_offset[node_index]
            index_of = [d.index for d in devices]
            network_of = [topology.network_id_of(d.custom) for d in devices]
            mine = [k for k in range(len(devices)) if cache.vendor[offset + k] == vendor_id]
            has_networks = bool(mine) and all(network_of[k] is not None for k in mine)
            facts = (index_of, network_of, has_networks)
            known[node_index] = (devices, facts)
            return facts

        scored = cw.startswith(topology.ASCEND910_PREFIX)

        def choose(node_index: int, positions: list[int], nums: int):
            index_of, network_of, has_networks = node_facts(node_index)
            if nums == 1 and positions:
                # One NPU: the first in the policy's order; the score is 10 when it has a network.
                first = positions[0]
                return [first], (float(topology.NETWORK_WEIGHT) if scored and network_of[first] is not None else 0.0)
            chosen = topology.choose(cw, positions, nums, index_of=index_of, network_of=network_of,
                                     topology=has_networks)
            if chosen is None:
                return ALLOCATED_CARDS_INSUFFICIENT_REQUEST
            return chosen, topology.score(cw, chosen, network_of)

        return choose

    # -- allocation annotations ------------------------------------------------------------

    def runtime_info(self, pod_devices: PodDevices, *, soft: bool) -> str:
        """``huawei.com/<cw>``: one object per NPU given, containers in order, Go's field order and
        ``omitempty``: ``UUID``, ``temp`` (the template of the memory, hard split only),
        ``memory``, ``core``."""
        items = []
        for container in pod_devices:
            for device in container:
                item: dict[str, object] = {}
                if device.uuid:
                    item["UUID"] = device.uuid
                if not soft:
                    _, temp = self.trim_memory(device.usedmem)
                    if temp:
                        item["temp"] = temp
                if device.usedmem:
                    item["memory"] = device.usedmem
                if device.usedcores:
                    item["core"] = device.usedcores
                items.append(item)
        return orjson.dumps(items).decode().translate(_GO_JSON_ESCAPES)

    def encode_allocation(self, pod_devices: PodDevices, *, node: str = "", partitions: list[dict] = (),
                          now: float = 0.0, pod_annotations: Mapping[str, str] | None = None) -> dict[str, str]:
        """Both allocation annotations, ``predicate-time`` (Unix seconds) and the runtime JSON.

        ``pod_annotations`` tells hami-core pods (no template name in the runtime JSON); without
        them the hard-split form is written, which the device plugin reads the same way for a
        hami-core pod (it ignores ``temp`` in that mode)."""
        if not any(pod_devices):
            return {}
        text = encode_pod_devices(pod_devices)
        soft = (pod_annotations or {}).get(VNPU_MODE_ANNOTATION) == VNPU_MODE_HAMI_CORE
        return {self.to_allocate_annotation: text, self.allocated_annotation: text,
                PREDICATE_TIME_ANNOTATION: str(int(now)),
                self.runtime_annotation: self.runtime_info(pod_devices, soft=soft)}

    def decision_annotations(self) -> tuple[str, ...]:
        return (self.to_allocate_annotation, self.allocated_annotation, self.runtime_annotation,
                PREDICATE_TIME_ANNOTATION)
