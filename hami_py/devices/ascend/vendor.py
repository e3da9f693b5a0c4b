"""One Ascend chip kind (``Ascend910B3``, ``Ascend310P`` ...) as a device vendor.

Everything is keyed by the config entry's ``commonWord`` (``<cw>``), as HAMi's Ascend device
plugin keys it: it registers the node's NPUs in ``hami.io/node-register-<cw>`` (JSON, with a
numeric ``NetworkID`` in ``customInfo`` for 910 kinds), answers the handshake
``hami.io/node-handshake-<cw>``, advertises ``huawei.com/<cw>``-style resources and says in the
node annotations ``hami-vnpu-core`` and ``hami.io/enpu`` which soft splits the node runs.

A pod asks for a count, memory (MiB × ``memoryFactor``) and, in the soft modes only, cores; its
mode (``huawei.com/vnpu-mode``: template, hami-core, enpu) decides how it is admitted and where it
may go (:mod:`.modes`). Hard-split memory is rounded up to the smallest vNPU template that holds
it: by the webhook for a template pod, per candidate node for a pod naming no mode (HAMi #3107,
:mod:`.charger`: rounded on template nodes, as asked on hami-core ones). The decision writes the
allocation (``hami.io/<cw>-devices-to-allocate`` / ``-allocated``), ``predicate-time``, the runtime
JSON ``huawei.com/<cw>`` the plugin turns into a vNPU (template name, memory, cores) and the mode
the pod resolved to on the node (``hami.io/effective-vnpu-mode``). The fit is upstream's generic
template with the charger's per-node charge; the node-wide mode rules are the device selector's,
and the chooser (:mod:`.chooser`) keeps the pod off NPUs it may not share and chooses among the
rest (910C module pairs, NetworkID groups, the node score).
"""
from __future__ import annotations

from typing import Mapping

import orjson
import structlog

from hami_py.devices.ascend.charger import AscendCharger, settled_mode
from hami_py.devices.ascend.chooser import AscendChooser
from hami_py.devices.ascend.config import VnpuConfig
from hami_py.devices.ascend import topology
from hami_py.devices.ascend.modes import (
    EFFECTIVE_MODE_ANNOTATION, ENPU_POLICY_ANNOTATION, NODE_ENPU_ANNOTATION, NODE_HAMI_CORE_ANNOTATION,
    PERCENT_BASE, POLICY_CHOICES, VNPU_MODE_ANNOTATION, VNPU_MODE_HAMI_CORE, VNPU_MODE_TEMPLATE, NodeModes,
    PolicyChoice, is_enpu, is_soft, node_refuses, pod_policy,
)
from hami_py.devices.base import (
    FLAG_CHARGE, FLAG_CHOOSE, Chooser, ContainerRequest, DeviceDecodeError, DeviceInfo, DeviceSelector,
    NoDevicesRegistered, PodDevices, RequestError,
)
from hami_py.devices.codec import decode_json_devices, encode_pod_devices, go_quote
from hami_py.devices.overwrite_env import overwrite_env
from hami_py.devices.template import (
    MISSING, TemplateSpec, TemplateVendor, append_env, device_count, ensure_limits, lookup, percentage, request_error,
    resource_lists, rounded_quantity,
)
from hami_py.quantity import INT32_MAX, parse_exact_int
from hami_py.reasons import MODE_NOT_FIT, OK

log = structlog.get_logger(__name__)

PREDICATE_TIME_ANNOTATION = "predicate-time"
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

    gate_annotations = (NODE_HAMI_CORE_ANNOTATION, NODE_ENPU_ANNOTATION)
    # Which pods may share an NPU depends on the modes (and ENPU policies) of those already on it.
    pod_marks = (VNPU_MODE_ANNOTATION, ENPU_POLICY_ANNOTATION)
    # Every kind chooses among all fitting NPUs (the mode rules per NPU; 910 kinds add NetworkID
    # groups, 910C pairs and the node score), and charges per node: a pod naming no mode is
    # charged a template's memory on a template node, its request on a hami-core one (HAMi #3107).
    kernel_flags = FLAG_CHOOSE | FLAG_CHARGE

    def __init__(self, config: VnpuConfig, *, mode: str = VNPU_MODE_TEMPLATE, enpu_policy: str = "",
                 family_resources: tuple[str, ...] = ()):
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
        self.mode = mode                    # the mode of nodes that do not say theirs (vnpus.hamiVnpuMode)
        self.enpu_policy = enpu_policy      # ENPU pods' policy when they name none (vnpus.enpuPolicy)
        # Every chip kind's resource names: a container asking for any Ascend NPU keeps its
        # ASCEND_VISIBLE_DEVICES, whichever chip's vendor looks at it (HAMi #2953).
        self.family_resources = frozenset(family_resources) | {r for r in (
            config.resource_name, config.resource_memory_name, config.resource_core_name) if r}
        self.runtime_annotation = f"huawei.com/{cw}"
        # node index -> (the device list read, (indexes, NetworkIDs, topology mode)) for the chooser
        self.node_facts: dict[int, tuple[list, tuple]] = {}

    # -- modes -----------------------------------------------------------------------------

    def node_modes(self, node_annotations: Mapping[str, str]) -> NodeModes:
        """What the node runs: its ``hami-vnpu-core`` / ``hami.io/enpu`` annotations where present
        (``"true"`` exactly), else the config's default mode."""
        return NodeModes.of(node_annotations, self.mode)

    def node_supports_hami_core(self, node_annotations: Mapping[str, str]) -> bool:
        return self.node_modes(node_annotations).hami_core

    def policy_of(self, pod_annotations: Mapping[str, str], labels: Mapping[str, str] | None = None) -> PolicyChoice:
        """An ENPU pod's policy (modes.py: its annotations, its label, then ``vnpus.enpuPolicy``)."""
        return pod_policy(pod_annotations, labels, self.enpu_policy)

    # -- inventory -------------------------------------------------------------------------

    def registration_inputs(self, node) -> object:
        """The registration, and what the node runs (it sets the NPUs' cores and mode)."""
        return (*super().registration_inputs(node), node.annotations.get(NODE_HAMI_CORE_ANNOTATION),
                node.annotations.get(NODE_ENPU_ANNOTATION))

    def parse_node_devices(self, node) -> list[DeviceInfo]:
        """The NPUs of ``hami.io/node-register-<cw>``, exactly as registered: every device of this
        annotation belongs to this kind (never to another kind whose name contains it), its type
        is left as the plugin wrote it. A ``mode`` in the registration is dropped (it must not
        make the cache treat an NPU as MIG); an NPU's mode is what its node runs
        (``NodeModes.tag``: "" on a template node), which the chooser reads.

        On a node running a soft split an NPU's cores are a percentage budget (HAMi #2952): what
        the plugin registers up to 100 (an older plugin writes the AI core count, 8 to 30) is
        100, more is a deliberate oversell and kept.

        Raises DeviceDecodeError for garbled JSON, an empty list, or a ``NetworkID`` that is not
        a number (upstream would silently leave such an NPU out of every topology choice)."""
        text = node.annotations.get(self.spec.register_annotation)
        if text is None:
            return []
        devices = decode_json_devices(text)
        if not devices:
            raise NoDevicesRegistered("no device found on node")
        modes = self.node_modes(node.annotations)
        tag = modes.tag()
        for position, device in enumerate(devices):
            device.mode = tag
            if modes.soft and device.devcore <= PERCENT_BASE:
                device.devcore = PERCENT_BASE
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

    def finish_request(self, request: ContainerRequest, *, pod_annotations: dict[str, str]) -> ContainerRequest:
        """An ENPU container naming no cores takes the whole NPU's compute (100), as upstream
        charges it; it then shares its NPU with no one."""
        if request.coresreq == 0 and is_enpu(pod_annotations.get(VNPU_MODE_ANNOTATION)):
            request.coresreq = PERCENT_BASE
        return request

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
        """Upstream's webhook for one container, in its order.

        An ENPU pod (``huawei.com/vnpu-mode: enpu``, ``ubs-virt`` or ``vcann-rt``):
        :meth:`_admit_enpu`. Any other:

        no count in limits → only ``ASCEND_VISIBLE_DEVICES=""`` with ``overwriteEnv`` (or the pod's
        ``hami.io/overwrite-env`` annotations: devices/overwrite_env.py), unless the container asks
        for any chip kind's NPUs; a 910C super-pod request of 1 becomes 2 (limits, and requests
        when present), other odd counts are refused; a core request above 0 is refused in
        template mode, and makes a pod naming no mode a hami-core one (the webhook writes
        ``huawei.com/vnpu-mode: hami-core``, HAMi #2975); memory (limits only) is kept as asked in
        hami-core mode, rounded up to the smallest template holding it (or ``memoryAllocatable``
        when only the whole device holds it) in template mode (or a mode no rule knows), and kept
        as asked for a pod naming no mode, whose candidate node rounds it or not (HAMi #3107) but
        which is refused all the same when no template nor the device holds it; without a memory
        limit it is ``memoryAllocatable``; several NPUs with less than a whole one each (after
        that rounding) are refused outside hami-core mode; the memory goes into limits and
        requests; ``runtimeClassName`` is set when configured and unset.

        Raises RequestError with upstream's message for its refusals, and for a count or memory
        that is no whole non-negative number (upstream lets those through to be dropped later),
        or a core request beside a mode no rule knows (upstream would overwrite that mode).
        Nothing is changed when it raises.
        """
        config = self.config
        name = str(container.get("name") or "")
        limits, requests = resource_lists(container)
        count_name = self.spec.count_resource
        meta = pod.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        mode = annotations.get(VNPU_MODE_ANNOTATION)
        if is_enpu(mode) and count_name and lookup(limits, requests, count_name) is not MISSING:
            return self._admit_enpu(container, pod, name)
        if not count_name or count_name not in limits:
            asks_ascend = any(r in self.family_resources for values in (limits, requests) for r in values)
            if not asks_ascend and overwrite_env(pod, container, default=config.overwrite_env):
                append_env(container, VISIBLE_DEVICES_ENV, "")
            return False
        count = device_count(name, count_name, limits[count_name])
        units = count       # what a vNPU may not span more than one of: an NPU, a super-pod 910C's module
        pair = config.common_word == topology.ASCEND910C and config.super_pod
        if pair:
            units = (count + 1) // 2
            if count != 1 and count % 2:
                raise RequestError(f"Ascend910C device request must be 1 or 2*n, got {count}")
        soft = is_soft(mode)
        core_name = self.spec.core_resource
        infer_hami_core = False
        if not soft and core_name:
            raw = lookup(limits, requests, core_name)
            if raw is not MISSING and rounded_quantity(name, core_name, raw) > 0:
                if mode == VNPU_MODE_TEMPLATE:
                    raise RequestError(f"{core_name} is only supported in hami-core (soft split) mode")
                if mode:
                    raise RequestError(f"{VNPU_MODE_ANNOTATION} {go_quote(mode)} takes no {core_name}: cores are only "
                                       f"supported in hami-core (soft split) or enpu mode")
                infer_hami_core = soft = True
        memory = hard = config.memory_allocatable      # written; charged on a template node
        memory_name = self.spec.memory_resource
        if memory_name and memory_name in limits:
            asked = rounded_quantity(name, memory_name, limits[memory_name])
            if asked < 0:
                raise request_error(name, memory_name, limits[memory_name], "must not be negative")
            if soft:
                memory = hard = asked
            else:
                hard, _ = self.trim_memory(asked)
                if hard <= 0:
                    raise RequestError(f"{memory_name} {asked} is invalid")
                # HAMi #3107: a pod naming no mode keeps its memory as asked; the candidate node's
                # mode rounds it, or not, at fit time (charger.py).
                memory = hard if mode else asked
        # A module's request (2 NPUs, or 1 raised to 2 below) is one unit either way, so the pod this
        # returns, reviewed again (reinvocationPolicy: IfNeeded), is admitted as the first pass was.
        if units > 1 and not soft and hard != config.memory_allocatable:
            raise RequestError("vNPU not supported for multiple devices")
        # Every check passed: the changes.
        limits = ensure_limits(container)
        if pair and count == 1:
            # The smallest unit of a super-pod 910C is one module: its two NPUs.
            log.info("Ascend910C request of 1 NPU raised to one module (2 NPUs)", container=name,
                     pod=meta.get("name", ""))
            limits[count_name] = "2"
            if count_name in requests:
                container["resources"]["requests"][count_name] = "2"
        if infer_hami_core:
            log.info("Ascend core request makes the pod a hami-core one", container=name, pod=meta.get("name", ""))
            self._annotations(pod)[VNPU_MODE_ANNOTATION] = VNPU_MODE_HAMI_CORE
        self._write_memory(container, memory)
        self._set_runtime_class(pod)
        return True

    def _admit_enpu(self, container: dict, pod: dict, name: str) -> bool:
        """An ENPU pod's container asking for this kind's NPUs (in limits, or in requests only):
        exactly one NPU (no 910C module: an ENPU vNPU lives on one DIE), memory as asked (limits,
        then requests; else ``memoryAllocatable``), both written into limits and requests; the
        pod's policy checked and written into ``huawei.com/enpu-policy``; ``runtimeClassName``
        as for any pod. Raises RequestError, changing nothing, for another count or an invalid
        policy."""
        limits, requests = resource_lists(container)
        count_name, memory_name = self.spec.count_resource, self.spec.memory_resource
        count = device_count(name, count_name, lookup(limits, requests, count_name))
        if count != 1:
            raise RequestError(f"ENPU mode supports exactly one Ascend device per container, got {count}")
        meta = pod.get("metadata") or {}
        labels = meta.get("labels")
        choice = self.policy_of(meta.get("annotations") or {}, labels if isinstance(labels, dict) else {})
        if choice.policy is None:
            raise RequestError(f"invalid ENPU scheduling policy {go_quote(choice.raw)} in {choice.source}: "
                               f"must be {POLICY_CHOICES}")
        memory = self.config.memory_allocatable
        raw = lookup(limits, requests, memory_name)
        if raw is not MISSING:
            memory = rounded_quantity(name, memory_name, raw)
            if memory < 0:
                raise request_error(name, memory_name, raw, "must not be negative")
        ensure_limits(container)[count_name] = "1"
        self._requests(container)[count_name] = "1"
        self._write_memory(container, memory)
        self._annotations(pod)[ENPU_POLICY_ANNOTATION] = choice.policy
        self._set_runtime_class(pod)
        return True

    @staticmethod
    def _annotations(pod: dict) -> dict:
        meta = pod.setdefault("metadata", {})
        if not isinstance(meta.get("annotations"), dict):
            meta["annotations"] = {}
        return meta["annotations"]

    @staticmethod
    def _requests(container: dict) -> dict:
        resources = container.setdefault("resources", {})
        if not isinstance(resources.get("requests"), dict):
            resources["requests"] = {}
        return resources["requests"]

    def _write_memory(self, container: dict, memory: int) -> None:
        memory_name = self.spec.memory_resource
        if memory_name:
            ensure_limits(container)[memory_name] = str(memory)
            self._requests(container)[memory_name] = str(memory)

    def _set_runtime_class(self, pod: dict) -> None:
        spec = pod.setdefault("spec", {})
        if spec.get("runtimeClassName") is None and self.config.runtime_class_name:
            spec["runtimeClassName"] = self.config.runtime_class_name

    # -- fit -------------------------------------------------------------------------------

    def device_selector(self, pod_annotations: dict[str, str], node_annotations: dict[str, str]) -> DeviceSelector | None:
        """The UUID gate (``hami.io/use-<cw>-uuid`` / ``hami.io/no-use-<cw>-uuid``), preceded by
        the node-wide mode rules (modes.py): a node the pod's mode may not use refuses every NPU
        with ModeNotFit, as does any node for an ENPU pod whose policy is none of the three. A
        pod naming a mode always gets a selector (OK where it may go), so a node's own answer
        replaces the one judged without node annotations."""
        uuids = super().device_selector(pod_annotations, node_annotations)
        mode = pod_annotations.get(VNPU_MODE_ANNOTATION)
        refused = node_refuses(mode, self.node_modes(node_annotations))
        if not refused and is_enpu(mode):
            refused = self.policy_of(pod_annotations).policy is None
        if refused:
            return _then(_always(MODE_NOT_FIT), uuids)
        if mode and uuids is None:
            return _always(OK)
        return uuids

    def charger(self, cache, pod: dict, row_container: list[int]) -> AscendCharger:
        """Each row's charge per candidate node (:mod:`.charger`): memory rounded to a template
        where the pod resolves to template mode, as asked where it resolves to a soft split."""
        return AscendCharger(self, cache, pod, row_container)

    def chooser(self, cache, ask) -> Chooser | None:
        """The per-node choice of :mod:`.chooser`: the NPUs the pod may share, then which."""
        mode = ask.pod_annotations.get(VNPU_MODE_ANNOTATION)
        policy = self.policy_of(ask.pod_annotations).policy if is_enpu(mode) else None
        return AscendChooser(self, cache, ask, mode=mode, policy=policy)

    # -- allocation annotations ------------------------------------------------------------

    def runtime_info(self, pod_devices: PodDevices, *, soft: bool) -> str:
        """``huawei.com/<cw>``: one object per NPU given, containers in order, Go's field order and
        ``omitempty``: ``UUID``, ``temp`` (the template of the memory, hard split only),
        ``memory``, ``core``. ``soft``: the pod is hami-core or ENPU (memory as asked)."""
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
        """Both allocation annotations, ``predicate-time`` (Unix seconds), the runtime JSON and,
        for a filter's decision, ``hami.io/effective-vnpu-mode``: the mode the pod resolves to on
        the chosen node (template, hami-core or enpu; the charger's ``settle`` records it).

        The runtime JSON has no template name for a pod soft split there (hami-core, ENPU). The
        mode is the decision's, else the pod's ``hami.io/effective-vnpu-mode`` (a decision
        encoded again), else its ``huawei.com/vnpu-mode``; with none of them the hard-split form
        is written, which the device plugin reads the same way for a soft-split pod (it ignores
        ``temp`` in those modes)."""
        if not any(pod_devices):
            return {}
        text = encode_pod_devices(pod_devices)
        annotations = pod_annotations or {}
        settled = settled_mode(pod_devices)
        mode = settled or annotations.get(EFFECTIVE_MODE_ANNOTATION) or annotations.get(VNPU_MODE_ANNOTATION)
        out = {self.to_allocate_annotation: text, self.allocated_annotation: text,
               PREDICATE_TIME_ANNOTATION: str(int(now)),
               self.runtime_annotation: self.runtime_info(pod_devices, soft=is_soft(mode))}
        if settled:
            out[EFFECTIVE_MODE_ANNOTATION] = settled
        return out

    def decision_annotations(self) -> tuple[str, ...]:
        return (self.to_allocate_annotation, self.allocated_annotation, self.runtime_annotation,
                PREDICATE_TIME_ANNOTATION, EFFECTIVE_MODE_ANNOTATION)
