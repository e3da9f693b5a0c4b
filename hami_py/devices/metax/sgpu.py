"""Metax sGPU shares (upstream's ``Metax-SGPU``).

Inventory: the plugin's vendor JSON in ``metax-tech.com/node-gpu-devices``, an array of cards
(``uuid``, ``totalDevCount``, ``totalCompute``, ``totalVRam`` MiB, ``numa``, ``healthy``,
``qosPolicy``, ``linkZone``, ...). A container asks in **limits only** for ``metax-tech.com/sgpu``
(count), ``metax-tech.com/vcore`` (percent, default 100) and ``metax-tech.com/vmemory``: a plain
number is GiB, a quantity with a unit (``4Gi``, ``1e9``) is bytes.

Pods carry a QoS policy (``metax-tech.com/sgpu-qos-policy``: best-effort, fixed-share,
burst-share; the webhook sets best-effort) and optionally an app class
(``metax-tech.com/sgpu-app-class``: online or offline, one device per container). The fit is the
generic template's, then the family's chooser (FLAG_CHOOSE) keeps the cards whose tasks agree:

* app class: a card in use takes a classed pod only if it hosts classed pods, an unclassed pod
  only if it hosts none, and an offline pod never where an online one runs;
* QoS (pods that are not online, asking less than a whole card): a card in use takes the pod only
  if its tasks' QoS (a whole-card task has none) is the pod's; a card whose only tasks are online
  ones has the QoS its plugin reports.

Upstream reads a card's QoS from the plugin's report and from a process-local cache of what its
own decisions expect; here it is derived from the pods the books charge to the card (their
annotations are kept with their charge: ``DeviceVendor.pod_marks``), which also holds across
restarts and for decisions of other replicas. Online pods get no cores (upstream's allocation).

Preferences when more cards fit than asked: online pods take the cards with the fewest online
(then offline) tasks, cards with only offline tasks last; pods without a class asking whole cards
are packed into the smallest link zone that holds them. Node score (policy neutral, ×10000,
×−10000 under spread): online pods Σ −100·offline on cards with only offline tasks, else
−20·online −2·offline; whole-card pods with topology awareness the link-zone pair score.
"""
from __future__ import annotations

import orjson

from hami_py import reasons as R
from hami_py.devices.base import (
    FLAG_CHOOSE, ContainerRequest, DeviceDecodeError, DeviceInfo, NoDevicesRegistered, PodDevices, RequestError,
)
from hami_py.devices.codec import (
    _FieldError, _describe, _fold, _json_bool, _json_int, _json_str, decode_pod_devices, encode_pod_devices,
    parse_go_bool,
)
from hami_py.devices.gates import uuid_selector
from hami_py.devices.template import (
    TemplateSpec, TemplateVendor, device_count, percentage, request_error, resource_lists, rounded_quantity,
)
from hami_py.quantity import INT32_MAX, INT32_MIN, INT64_MAX, parse_exact_int

SGPU_KEY = "Metax-SGPU"
SGPU_REGISTER = "metax-tech.com/node-gpu-devices"
SGPU_TO_ALLOCATE = "hami.io/metax-sgpu-devices-to-allocate"
SGPU_ALLOCATED = "hami.io/metax-sgpu-devices-allocated"
METAX_ALLOCATED = "metax-tech.com/gpu-devices-allocated"
PREDICATE_TIME = "metax-tech.com/predicate-time"
USE_UUID = "metax-tech.com/use-gpuuuid"
NOUSE_UUID = "metax-tech.com/nouse-gpuuuid"
QOS_POLICY = "metax-tech.com/sgpu-qos-policy"
TOPOLOGY_AWARE = "metax-tech.com/sgpu-topology-aware"
APP_CLASS = "metax-tech.com/sgpu-app-class"

BEST_EFFORT, FIXED_SHARE, BURST_SHARE = "best-effort", "fixed-share", "burst-share"
QOS_POLICIES = (BEST_EFFORT, FIXED_SHARE, BURST_SHARE)
ONLINE, OFFLINE = "online", "offline"
MEMORY_FACTOR = 1024            # MiB per GiB: a plain vmemory number is GiB
DIRECT_LINK_SCORE = 10
NEUTRAL_WEIGHT = 10000.0        # upstream's weight of a policy-neutral score

# -- inventory ------------------------------------------------------------------------------------

_INT32_FIELDS = ("totalDevCount", "totalCompute", "totalVRam", "availableDevCount", "availableCompute",
                 "availableVRam", "numa", "linkZone")
_STR_FIELDS = ("uuid", "bdf", "model", "qosPolicy")
_KEYS = {k.lower(): k for k in (*_INT32_FIELDS, *_STR_FIELDS, "healthy")}


def _decode_card(obj: object) -> dict:
    if type(obj) is not dict:
        raise _FieldError(f"expected an object, got {_describe(obj)}")
    card: dict = {k: 0 for k in _INT32_FIELDS} | {k: "" for k in _STR_FIELDS} | {"healthy": False}
    for key, value in obj.items():
        name = _fold(_KEYS, key)
        if name is None or value is None:
            continue        # unknown keys are ignored, null keeps the zero value (Go's decoder)
        try:
            if name in _INT32_FIELDS:
                card[name] = _json_int(value, INT32_MIN, INT32_MAX, "int32")
            elif name == "healthy":
                card[name] = _json_bool(value)
            else:
                card[name] = _json_str(value)
        except _FieldError as err:
            err.path.append(name)
            raise
    return card


def decode_sgpu_devices(text: str) -> list[DeviceInfo]:
    """The cards of ``metax-tech.com/node-gpu-devices``; DeviceDecodeError naming the card and
    field (upstream's decoder refuses the whole inventory on any error, and an empty one)."""
    try:
        parsed = orjson.loads(text)
    except orjson.JSONDecodeError as err:
        raise DeviceDecodeError(f"invalid JSON: {err}") from None
    if parsed is not None and type(parsed) is not list:
        raise DeviceDecodeError(f"expected a JSON array of devices, got {_describe(parsed)}")
    if not parsed:
        raise NoDevicesRegistered("no sdevice found on node")
    out = []
    for position, obj in enumerate(parsed):
        if obj is None:
            raise DeviceDecodeError(f"device {position}: null is not a device")
        try:
            card = _decode_card(obj)
        except _FieldError as err:
            where = f'field "{err.field_name()}": ' if err.path else ""
            raise DeviceDecodeError(f"device {position}: {where}{err.problem}") from None
        out.append(DeviceInfo(id=card["uuid"], index=position, count=card["totalDevCount"], devmem=card["totalVRam"],
                              devcore=card["totalCompute"], type=SGPU_KEY, numa=card["numa"], health=card["healthy"],
                              custom={"QosPolicy": card["qosPolicy"], "Model": card["model"],
                                      "LinkZone": card["linkZone"]}))
    return out


# -- the rules of a card's tasks -----------------------------------------------------------------

def _classes(tasks) -> tuple[int, int]:
    """(online, offline) tasks among (marks, charge) pairs."""
    online = offline = 0
    for marks, _ in tasks:
        cls = marks.get(APP_CLASS)
        if cls == ONLINE:
            online += 1
        elif cls == OFFLINE:
            offline += 1
    return online, offline


def app_class_fits(request_class: str | None, online: int, offline: int) -> bool:
    """Upstream's ``checkAppClass`` for a card in use hosting ``online``/``offline`` classed tasks."""
    classed = online > 0 or offline > 0
    if classed != (request_class in (ONLINE, OFFLINE)):
        return False
    return not (online > 0 and request_class == OFFLINE)


def task_qos(marks: dict[str, str], cores: int) -> str:
    """The QoS a task sets its card to: none for a whole-card task (upstream's rule)."""
    return "" if cores >= 100 else marks.get(QOS_POLICY, "")


def qos_fits(request_qos: str, task_qos_values: list[str], reported: str) -> bool:
    """A card in use takes a share of QoS ``request_qos`` iff each of its (not online) tasks has
    no QoS or that one; a card hosting none of them has the QoS its plugin reports."""
    if task_qos_values:
        return all(q in ("", request_qos) for q in task_qos_values)
    return reported in ("", request_qos)


def prefer_online(candidates: list[int], counts: dict[int, tuple[int, int]]) -> list[int]:
    """Upstream's ``prioritizeOnlineDevices`` order: fewer online, then fewer offline tasks;
    cards hosting only offline tasks last (fewest first). Stable: ties keep the policy's order."""
    def key(p: int):
        on, off = counts[p]
        return (1, 0, off) if on == 0 and off > 0 else (0, on, off)
    return sorted(candidates, key=key)


def prefer_link_zones(candidates: list[int], zone_of: dict[int, int], nums: int) -> list[int]:
    """Upstream's ``prioritizeExclusiveDevices``: the smallest link zone holding ``nums`` cards,
    else zones filled in ascending size, then cards without a zone. Ties keep the policy's order."""
    zones: dict[int, list[int]] = {}
    others: list[int] = []
    for p in candidates:
        z = zone_of[p]
        (zones.setdefault(z, []) if z > 0 else others).append(p)
    ordered = sorted(zones.values(), key=len)
    for members in ordered:
        if len(members) >= nums:
            return members[:nums]
    flat = [p for members in ordered for p in members] + others
    return flat[:nums]


def link_score(zones: list[tuple[str, int]]) -> int:
    """Σ over pairs of distinct cards sharing a non-zero link zone of DIRECT_LINK_SCORE."""
    total = 0
    for i, (uuid, zone) in enumerate(zones):
        for other, other_zone in zones[i + 1:]:
            if other != uuid and zone != 0 and zone == other_zone:
                total += DIRECT_LINK_SCORE
    return total


# -- the vendor ----------------------------------------------------------------------------------

class MetaxSGPUVendor(TemplateVendor):
    """sGPU shares of the cards in ``metax-tech.com/node-gpu-devices``."""

    kernel_flags = FLAG_CHOOSE
    pod_marks = (APP_CLASS, QOS_POLICY)

    def __init__(self, config):
        self.topology_aware = config.topology_aware
        super().__init__(TemplateSpec(vendor_key=SGPU_KEY, count_resource=config.resource_vcount_name,
                                      memory_resource=config.resource_vmemory_name,
                                      core_resource=config.resource_vcore_name, memory_unit=MEMORY_FACTOR,
                                      default_cores=100, register_annotation=SGPU_REGISTER,
                                      to_allocate_annotation=SGPU_TO_ALLOCATE, allocated_annotation=SGPU_ALLOCATED,
                                      use_uuid=(USE_UUID,), nouse_uuid=(NOUSE_UUID,)))

    # -- inventory ---------------------------------------------------------------------------

    def parse_node_devices(self, node) -> list[DeviceInfo]:
        text = node.annotations.get(SGPU_REGISTER)
        if text is None:
            return []
        return decode_sgpu_devices(text)

    # -- requests ----------------------------------------------------------------------------

    def container_request(self, container: dict, *, pod_annotations: dict[str, str]) -> ContainerRequest | None:
        """Limits only, as upstream. Online pods take no cores and skip the core checks (upstream's fit)."""
        spec = self.spec
        limits, _ = resource_lists(container)
        if not spec.count_resource or spec.count_resource not in limits:
            return None
        name = str(container.get("name") or "")
        nums = device_count(name, spec.count_resource, limits[spec.count_resource])
        if nums == 0:
            return None
        cores = 100
        if spec.core_resource and spec.core_resource in limits:
            cores = percentage(name, spec.core_resource, limits[spec.core_resource])
        memreq = 0
        if spec.memory_resource and spec.memory_resource in limits:
            memreq = self.memory_mib(name, limits[spec.memory_resource])
        if pod_annotations.get(APP_CLASS) == ONLINE:
            cores = -1      # the kernel's "takes no cores": charged none, and no core check applies
        return ContainerRequest(SGPU_KEY, nums, memreq, 100 if memreq == 0 else 0, cores)

    def memory_mib(self, container: str, raw: object) -> int:
        """``vmemory`` in MiB: bytes when the quantity is written with a unit (any letter, as in
        the API server's canonical spelling upstream reads), else GiB."""
        resource = self.spec.memory_resource
        value = parse_exact_int(raw)
        if value is None:
            raise request_error(container, resource, raw, "is not a whole number")
        if type(raw) is str and any(c.isascii() and c.isalpha() for c in raw):
            if not 0 <= value <= INT64_MAX:
                raise request_error(container, resource, raw, "is out of range")
            mib = value // 1024 // 1024
            if mib > INT32_MAX:
                raise request_error(container, resource, raw, f"is out of range: must be at most {INT32_MAX} MiB")
            return mib
        if not 0 <= value <= INT32_MAX // MEMORY_FACTOR:
            raise request_error(container, resource, raw,
                                f"is out of range: must be between 0 and {INT32_MAX // MEMORY_FACTOR} GiB")
        return value * MEMORY_FACTOR

    # -- admission ---------------------------------------------------------------------------

    def mutate_admission(self, container: dict, pod: dict) -> bool:
        """Upstream's webhook: an app class must be online or offline and ask one device; a pod
        that is not online gets the best-effort QoS unless it names one of the three."""
        limits, _ = resource_lists(container)
        count = self.spec.count_resource
        if not count or count not in limits:
            return False
        meta = pod.setdefault("metadata", {})
        annotations = meta.get("annotations")
        if not isinstance(annotations, dict):
            annotations = meta["annotations"] = {}
        app_class = annotations.get(APP_CLASS)
        if app_class is not None:
            if app_class not in (ONLINE, OFFLINE):
                raise RequestError(f"{APP_CLASS} must be set one of [{ONLINE}, {OFFLINE}]")
            name = str(container.get("name") or "")
            if rounded_quantity(name, count, limits[count]) != 1:
                raise RequestError("app-class pod must request single device")
        if app_class != ONLINE:
            qos = annotations.get(QOS_POLICY)
            if qos is None:
                annotations[QOS_POLICY] = BEST_EFFORT
            elif qos not in QOS_POLICIES:
                raise RequestError(f"{QOS_POLICY} must be set one of [{BEST_EFFORT}, {FIXED_SHARE}, {BURST_SHARE}]")
        return True

    # -- fit ---------------------------------------------------------------------------------

    def device_selector(self, pod_annotations, node_annotations):
        return uuid_selector(pod_annotations, (USE_UUID,), (NOUSE_UUID,))

    def chooser(self, cache, ask):
        return SGPUChooser(cache, ask.pod_annotations, ask.rows, ask.node_policy, self.topology_aware)

    # -- allocation annotations --------------------------------------------------------------

    def encode_allocation(self, pod_devices: PodDevices, *, node: str = "", partitions=(), now: float = 0.0,
                          pod_annotations=None) -> dict[str, str]:
        if not any(pod_devices):
            return {}
        text = encode_pod_devices(pod_devices)
        vendor = [[_metax_device(d) for d in container] for container in pod_devices]
        return {SGPU_TO_ALLOCATE: text, SGPU_ALLOCATED: text,
                METAX_ALLOCATED: orjson.dumps(vendor).decode(),
                PREDICATE_TIME: str(int(now * 1_000_000_000))}

    def decision_annotations(self) -> tuple[str, ...]:
        return (SGPU_TO_ALLOCATE, SGPU_ALLOCATED, METAX_ALLOCATED, PREDICATE_TIME)

    def decode_allocation(self, annotations: dict[str, str]) -> PodDevices | None:
        text = annotations.get(SGPU_ALLOCATED)
        return None if text is None else decode_pod_devices(text)


def _metax_device(device) -> dict:
    """One device of ``metax-tech.com/gpu-devices-allocated`` (Go's omitempty: zeros left out)."""
    out: dict = {"uuid": device.uuid}
    if device.usedcores:
        out["compute"] = device.usedcores
    if device.usedmem:
        out["vRam"] = device.usedmem
    return out


class SGPUChooser:
    """The per-filter chooser: keeps the fitting cards whose tasks agree with the pod (app class,
    QoS), applies upstream's preferences, and scores the node."""

    def __init__(self, cache, pod_annotations: dict[str, str], requests: list[ContainerRequest],
                 node_policy: str, topology_aware: bool):
        self.cache = cache
        self.app_class = pod_annotations.get(APP_CLASS)
        self.marks = cache.marks_of(pod_annotations)
        self.qos = pod_annotations.get(QOS_POLICY, "")
        self.requests = requests
        self.sign = -1.0 if node_policy == "spread" else 1.0
        aware = topology_aware
        override = pod_annotations.get(TOPOLOGY_AWARE)
        if override is not None and (parsed := parse_go_bool(override)) is not None:
            aware = parsed
        self.topology_aware = aware
        self.calls: dict[int, int] = {}                     # node -> rows asked so far
        self.picks: dict[int, list[tuple[int, int]]] = {}   # node -> the pod's (position, cores) there
        self.scores: dict[int, float] = {}

    def __call__(self, node_index: int, positions: list[int], nums: int):
        row = self.calls.get(node_index, 0)
        self.calls[node_index] = row + 1
        cores = self.requests[row].coresreq if row < len(self.requests) else 0
        cache = self.cache
        devices = cache.devices_at(node_index)
        offset = cache.node_offset[node_index]
        used = cache.used
        tasks = cache.device_marks(node_index)
        own = self.picks.setdefault(node_index, [])
        own_at: dict[int, list[int]] = {}
        for p, c in own:
            own_at.setdefault(p, []).append(c)
        online_req = self.app_class == ONLINE
        feasible = []
        class_refused = qos_refused = 0
        for p in positions:
            mine = own_at.get(p, ())
            if used[offset + p] == 0 and not mine:
                feasible.append(p)
                continue
            on, off = _classes(tasks[p])
            if mine:
                on += len(mine) if self.app_class == ONLINE else 0
                off += len(mine) if self.app_class == OFFLINE else 0
            if not app_class_fits(self.app_class, on, off):
                class_refused += 1
                continue
            if not online_req and cores != 100:
                values = [task_qos(m, e.cores) for m, e in tasks[p] if m.get(APP_CLASS) != ONLINE]
                values.extend(task_qos(self.marks, c) for c in mine)
                if not qos_fits(self.qos, values, devices[p].custom.get("QosPolicy", "")):
                    qos_refused += 1
                    continue
            feasible.append(p)
        if len(feasible) < nums:
            # Upstream's words for the cards it ruled out (its Fit tests the class, then the QoS).
            if qos_refused:
                return R.CARD_QOS_POLICY_MISMATCH
            if class_refused:
                return R.CARD_APP_CLASS_MISMATCH
            return R.CARD_NOT_FOUND_CUSTOM_FILTER_RULE
        counts = {p: _classes(tasks[p]) for p in feasible} if online_req else {}
        if len(feasible) > nums:
            if self.app_class is not None:
                if online_req:
                    feasible = prefer_online(feasible, counts)
            elif cores == 100:
                feasible = prefer_link_zones(feasible, {p: devices[p].custom.get("LinkZone", 0) for p in feasible},
                                             nums)
        chosen = feasible[:nums]
        own.extend((p, cores) for p in chosen)
        total = self.sign * NEUTRAL_WEIGHT * self._score(node_index, devices, offset, used, tasks, own)
        delta = total - self.scores.get(node_index, 0.0)
        self.scores[node_index] = total
        return chosen, delta

    def _score(self, node_index, devices, offset, used, tasks, own) -> float:
        """Upstream's ``ScoreNode`` of the pod's cards on the node so far."""
        if self.app_class == ONLINE:
            total = 0
            for p in dict.fromkeys(p for p, _ in own):
                on, off = _classes(tasks[p])
                total += -100 * off if off > 0 and on == 0 else -20 * on - 2 * off
            return float(total)
        whole = [p for p, c in own if c == 100]
        if not whole or not self.topology_aware:
            return 0.0
        taken = set(whole)
        idle = [k for k, d in enumerate(devices) if used[offset + k] == 0 and d.type == SGPU_KEY]
        zone = lambda k: (devices[k].id, devices[k].custom.get("LinkZone", 0))  # noqa: E731
        available = link_score([zone(k) for k in idle])
        allocated = link_score([zone(k) for k in whole])
        rest = link_score([zone(k) for k in idle if k not in taken])
        return float(10 * allocated - (available - allocated - rest))
