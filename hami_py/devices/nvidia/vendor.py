"""The NVIDIA vendor (vendor key ``NVIDIA``): HAMi's vGPU sharing of memory and cores.

Everything here is fixed by what HAMi's NVIDIA device plugin and HAMi-core expect: the
annotation keys, the inventory format, how a container's ``nvidia.com/*`` resources become a
request, and which pod annotations pick or avoid GPUs. The rules follow upstream HAMi's NVIDIA
vendor, with one deliberate difference: a device resource that is present but malformed (a
fractional count, a memory value that is not a whole number of MiB, negative cores) raises
:class:`RequestError` instead of silently turning the container into one without a GPU request
(upstream defect: the pod would be bound without devices and fail later on the node). HAMi
after v2.10 fails closed too (#2994): a count, cores or memory percentage out of range is refused
in its words, never clamped.

Capacity checks, health and NUMA grouping live in the fit code; this module only says what a
container asks for and which devices a pod may consider at all.
"""
from __future__ import annotations

import orjson

from hami_py.devices.nvidia.config import NvidiaConfig, config_problems
from hami_py.devices.base import (
    ContainerRequest, DeviceDecodeError, DeviceInfo, DeviceSelector, DeviceVendor, NodeView, NoDevicesRegistered,
    PodDevices, RequestError,
)
from hami_py.devices.codec import (
    decode_json_devices, decode_legacy_devices, decode_pod_devices,
    encode_pod_devices, go_quote, parse_go_bool,
)
from hami_py.devices.nvidia.mig_preference import preference_ranks, preference_refusal
from hami_py.devices.overwrite_env import overwrite_env
from hami_py.devices.template import append_env, device_count, percentage
from hami_py.devices.webhook_values import checked_integers
from hami_py.quantity import INT32_MAX, INT64_MAX, parse_exact_int, parse_quantity_ceil
from hami_py.devices.gates import make_selector, make_type_gate, non_blank, type_entries, uuid_entries

VENDOR_KEY = "NVIDIA"
REMOTE_MODE = "remote"      # a GPU served over the network (hami_py/devices/remotegpu/)

# Node annotations
REGISTER_ANNOTATION = "hami.io/node-nvidia-register"
PAIR_SCORE_ANNOTATION = "hami.io/node-nvidia-score"
HANDSHAKE_ANNOTATION = "hami.io/node-handshake"
CORDON_ANNOTATION = "hami.io/device-cordon"

# Pod annotations written at filter time
TO_ALLOCATE_ANNOTATION = "hami.io/vgpu-devices-to-allocate"
ALLOCATED_ANNOTATION = "hami.io/vgpu-devices-allocated"

# Pod annotations that steer the choice of GPUs
USE_TYPE_ANNOTATION = "nvidia.com/use-gputype"
NOUSE_TYPE_ANNOTATION = "nvidia.com/nouse-gputype"
USE_UUID_ANNOTATION = "nvidia.com/use-gpuuuid"
NOUSE_UUID_ANNOTATION = "nvidia.com/nouse-gpuuuid"
VGPU_MODE_ANNOTATION = "nvidia.com/vgpu-mode"
NUMA_BIND_ANNOTATION = "nvidia.com/numa-bind"

# Device modes a plugin registers: "hami-core" (shared through HAMi-core), "mps", "mig" (base.MODE_MIG).
MIG_ALLOCATIONS_ANNOTATION = "hami.io/vgpu-mig-allocations"

# Key of DeviceInfo.custom holding {other_uuid: score} from the pair-score annotation.
PAIR_SCORES_KEY = "pair_scores"

# Container environment the admission webhook sets (read by HAMi-core and the NVIDIA runtime).
TASK_PRIORITY_ENV = "CUDA_TASK_PRIORITY"
CORE_POLICY_ENV = "GPU_CORE_UTILIZATION_POLICY"
VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
DEFAULT_CORE_POLICY = "default"

# mempct sentinel: no percentage asked for (memory is given in MiB, or the default applies).
MEMORY_PERCENT_UNSET = 101

_MISSING = object()


def parse_numa_bind(pod_annotations: dict[str, str]) -> bool:
    """Whether the pod asks for all its GPUs on one NUMA node (``nvidia.com/numa-bind``).

    Read with Go's ``ParseBool`` like upstream: ``true``/``1``/``t``... bind; anything
    unparsable counts as false.
    """
    text = pod_annotations.get(NUMA_BIND_ANNOTATION)
    return text is not None and parse_go_bool(text) is True


# ---------------------------------------------------------------------------------------------
# Inventory
# ---------------------------------------------------------------------------------------------

def _looks_like_json(text: str) -> bool:
    """Current plugins write a JSON array; older ones the colon format, which never starts so."""
    head = text.lstrip()[:1]
    return head in ("[", "{") or text.strip() == "null"


def _decode_pair_scores(text: str) -> dict[str, dict[str, int]]:
    """``[{"uuid": "GPU-a", "score": {"GPU-b": 200}}, ...]`` as {uuid: {other: score}}.

    Go's decoding rules (case-insensitive keys, null = nothing); the first entry for a UUID wins,
    as upstream takes the first match. Raises DeviceDecodeError for anything malformed.
    """
    prefix = f"{PAIR_SCORE_ANNOTATION}: "
    try:
        parsed = orjson.loads(text)
    except orjson.JSONDecodeError as err:
        raise DeviceDecodeError(f"{prefix}invalid JSON: {err}") from None
    if parsed is None:
        return {}
    if type(parsed) is not list:
        raise DeviceDecodeError(f"{prefix}expected a JSON array")
    scores: dict[str, dict[str, int]] = {}
    for position, entry in enumerate(parsed):
        if entry is None:
            entry = {}
        if type(entry) is not dict:
            raise DeviceDecodeError(f"{prefix}entry {position}: expected an object")
        uuid, pairs = "", {}
        for key, value in entry.items():
            folded = key.lower()
            if value is None:
                continue
            if folded == "uuid":
                if type(value) is not str:
                    raise DeviceDecodeError(f'{prefix}entry {position}: field "uuid": expected a string')
                uuid = value
            elif folded == "score":
                pairs = _decode_score_map(value, f"{prefix}entry {position}")
        scores.setdefault(uuid, pairs)
    return scores


def _decode_score_map(value: object, where: str) -> dict[str, int]:
    if type(value) is not dict:
        raise DeviceDecodeError(f'{where}: field "score": expected an object of integers')
    for other, score in value.items():
        if type(score) is not int or not -INT64_MAX - 1 <= score <= INT64_MAX:
            raise DeviceDecodeError(
                f'{where}: field "score": {go_quote(other)}: expected an integer, got {orjson.dumps(score).decode()}')
    return dict(value)


def _attach_pair_scores(devices: list[DeviceInfo], text: str) -> None:
    scores = _decode_pair_scores(text)
    for device in devices:
        pairs = scores.get(device.id)
        if pairs is not None:
            device.custom[PAIR_SCORES_KEY] = pairs


def _is_uint32(value) -> bool:
    """A GPU or compute instance id as NVML numbers them (upstream decodes them as uint32)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 32


# ---------------------------------------------------------------------------------------------
# Device selection (type, mode, UUID, cordon)
# ---------------------------------------------------------------------------------------------

# ---------------------------------------------------------------------------------------------
# The vendor
# ---------------------------------------------------------------------------------------------

def _quote_value(raw: object) -> str:
    """A resource value as written in the pod (JSON numbers and null appear as JSON does)."""
    if type(raw) is str:
        return go_quote(raw)
    if raw is None or type(raw) in (int, float, bool):
        return go_quote(orjson.dumps(raw).decode())
    return go_quote(repr(raw))


class NvidiaVendor(DeviceVendor):
    """HAMi's NVIDIA vendor: vGPU sharing of memory (MiB or percent) and cores (percent)."""

    vendor_key = VENDOR_KEY
    register_annotation = REGISTER_ANNOTATION
    companion_annotation = PAIR_SCORE_ANNOTATION  # re-decode the inventory when the pair scores change
    handshake_annotation = HANDSHAKE_ANNOTATION
    to_allocate_annotation = TO_ALLOCATE_ANNOTATION
    allocated_annotation = ALLOCATED_ANNOTATION
    # Upstream's NVIDIA health wrapper: the kubelet's allocatable GPU count falling from above
    # zero to zero means the device plugin is gone, at once (registration upkeep acts on it).
    health_follows_allocatable = True

    def __init__(self, config: NvidiaConfig):
        self.config = config
        self._count_name = config.resource_count_name
        self._memory_name = config.resource_memory_name
        self._percent_name = config.resource_memory_percentage_name
        self._core_name = config.resource_core_name
        self._memory_factor = max(config.memory_factor, 1)
        # Largest memory value whose product with the factor still fits int32.
        self._max_memory = INT32_MAX // self._memory_factor

    # -- resources ------------------------------------------------------------------------------

    @property
    def count_resource_name(self) -> str:
        """The resource whose allocatable count tells whether the plugin is alive (``nvidia.com/gpu``)."""
        return self._count_name

    def quota_resources(self) -> tuple[str, str, int]:
        """(memory resource, core resource, memory factor) as ResourceQuota ``limits.*`` names them."""
        return self._memory_name, self._core_name, self._memory_factor

    def request_resources(self) -> tuple[str, str, str, int]:
        return self._count_name, self._memory_name, self._core_name, self._memory_factor

    def request_resource_names(self) -> frozenset[str]:
        """What :meth:`container_request` reads (the priority is the webhook's alone)."""
        return frozenset(n for n in (self._count_name, self._memory_name, self._percent_name, self._core_name) if n)

    def config_problems(self) -> list[str]:
        return config_problems(self.config)

    def resource_names(self) -> list[str]:
        """Count, memory, memory-percentage, cores and priority names (unset ones left out)."""
        config = self.config
        names = [config.resource_count_name, config.resource_memory_name,
                 config.resource_memory_percentage_name, config.resource_core_name,
                 config.resource_priority_name]
        return [name for name in names if name]

    # -- inventory ------------------------------------------------------------------------------

    def parse_node_devices(self, node: NodeView) -> list[DeviceInfo]:
        """The node's GPUs from ``hami.io/node-nvidia-register`` plus optional pair scores.

        JSON is what current plugins write (and all upstream decodes); the legacy colon format
        is accepted too because older plugins wrote it. No annotation -> []. An empty
        inventory, or any garbled part (pair scores included), rejects the node's whole NVIDIA
        inventory with DeviceDecodeError, as upstream does.
        """
        annotations = node.annotations
        text = annotations.get(REGISTER_ANNOTATION)
        if text is None:
            return []
        try:
            devices = decode_json_devices(text) if _looks_like_json(text) else decode_legacy_devices(text)
        except DeviceDecodeError as err:
            raise DeviceDecodeError(f"{REGISTER_ANNOTATION}: {err}") from None
        if not devices:
            raise NoDevicesRegistered("no gpu found on node")
        score_text = annotations.get(PAIR_SCORE_ANNOTATION)
        if score_text is not None:
            _attach_pair_scores(devices, score_text)
        # GPUs a lupine server serves over the network are the RemoteGPU family's (HAMi #3004,
        # #3013): not this node's to share. None left: the node has no NVIDIA GPU of its own.
        return [d for d in devices if d.mode != REMOTE_MODE]

    # -- requests -------------------------------------------------------------------------------

    def container_request(self, container: dict, *, pod_annotations: dict[str, str]) -> ContainerRequest | None:
        """The container's NVIDIA request, or None when it asks for no GPU.

        Upstream's rules (HAMi after v2.10, which fails closed): every resource is read from
        limits first, then requests; no count (or count 0) means no request; memory is
        multiplied by ``memoryFactor``; the percentage starts at the 101 "unset" sentinel, must
        be an integer in 0..100, and 0 keeps the sentinel; with neither memory nor percentage the
        default memory applies, else the whole card (100 %); cores default to ``defaultCores``
        and must be an integer in 0..100 (no longer clamped).

        Raises RequestError for a present but invalid count, memory, percentage or cores value.
        """
        limits, requests = self._resource_lists(container)
        raw_count = self._lookup(limits, requests, self._count_name)
        if raw_count is _MISSING:
            return None
        name = container.get("name") or ""   # Go reads a null name as ""
        count = device_count(name, self._count_name, raw_count)
        if count == 0:
            return None
        memreq = self._memory(name, limits, requests)
        mempct = self._memory_percent(name, limits, requests)
        if mempct == MEMORY_PERCENT_UNSET and memreq == 0:
            if self.config.default_memory != 0:
                memreq = self.config.default_memory  # already MiB: not multiplied by the factor
            else:
                mempct = 100
        coresreq = self._cores(name, limits, requests)
        return ContainerRequest(vendor=VENDOR_KEY, nums=count, memreq=memreq, mempct=mempct, coresreq=coresreq)

    @staticmethod
    def _lookup(limits: dict, requests: dict, resource: str) -> object:
        if not resource:
            return _MISSING
        value = limits.get(resource, _MISSING)
        if value is _MISSING:
            value = requests.get(resource, _MISSING)
        return value

    @staticmethod
    def _error(container: str, resource: str, raw: object, problem: str) -> RequestError:
        return RequestError(f"container {go_quote(container)}: {resource} {_quote_value(raw)} {problem}")

    def _whole(self, container: str, resource: str, raw: object, what: str) -> int:
        number = parse_exact_int(raw)
        if number is None:
            raise self._error(container, resource, raw, f"is not {what}")
        return number

    def _memory(self, container: str, limits: dict, requests: dict) -> int:
        raw = self._lookup(limits, requests, self._memory_name)
        if raw is _MISSING:
            return 0
        factor = self._memory_factor
        unit = "MiB" if factor == 1 else f"units of {factor} MiB (memoryFactor)"
        memory = self._whole(container, self._memory_name, raw, f"a whole number of {unit}")
        if not 0 <= memory <= self._max_memory:
            raise self._error(container, self._memory_name, raw,
                              f"is out of range: must be between 0 and {self._max_memory} {unit}")
        return memory * factor

    def _memory_percent(self, container: str, limits: dict, requests: dict) -> int:
        raw = self._lookup(limits, requests, self._percent_name)
        if raw is _MISSING:
            return MEMORY_PERCENT_UNSET
        # 0 would mean "no limit" to HAMi-core: the default below applies instead, as upstream.
        return percentage(container, self._percent_name, raw) or MEMORY_PERCENT_UNSET

    def _cores(self, container: str, limits: dict, requests: dict) -> int:
        raw = self._lookup(limits, requests, self._core_name)
        if raw is _MISSING:
            return self.config.default_cores
        return percentage(container, self._core_name, raw)

    # -- admission ------------------------------------------------------------------------------

    def admission_refusal(self, pod_annotations: dict[str, str]) -> str | None:
        """``nvidia.com/mig-profile-preference`` naming nothing, or a profile (or slice key) no
        ``migProfileAllowlist`` entry has (nvidia/mig_preference.py)."""
        return preference_refusal(pod_annotations, self.config.mig_profile_allowlist)

    def mutate_admission(self, container: dict, pod: dict) -> bool:
        """Upstream's admission defaults for one container, applied in place; True when the
        container asks for an NVIDIA GPU (after the defaults).

        In upstream's order: refuse a memory percentage or cores that are not an integer in
        0..100 (in limits or requests); copy the ``priority`` limit into ``CUDA_TASK_PRIORITY``;
        set ``GPU_CORE_UTILIZATION_POLICY`` on every container when ``gpuCorePolicy`` is not
        ``default``; add ``defaultGPUNum`` GPUs to a container that limits memory, percentage or
        cores but not the count; give a container that asks for whole cards (no memory, or
        100 %) all the cores, so no other pod shares them; set the configured
        ``runtimeClassName`` on the pod; and with ``overwriteEnv`` (or the pod's
        ``hami.io/overwrite-env`` annotations: devices/overwrite_env.py) hide every GPU from a
        container that asks for none (``NVIDIA_VISIBLE_DEVICES=none``). Idempotent: the pod it
        returns, reviewed again, is not changed (``reinvocationPolicy: IfNeeded``).

        Raises RequestError for an invalid percentage or cores, or a priority that is no quantity.
        """
        config = self.config
        name = container.get("name") or ""
        limits, requests = self._resource_lists(container)
        self._check_percentages(name, limits, requests)
        if config.resource_priority_name and config.resource_priority_name in limits:
            priority = self._rounded(name, config.resource_priority_name, limits[config.resource_priority_name])
            append_env(container, TASK_PRIORITY_ENV, str(priority))
        if config.gpu_core_policy not in ("", DEFAULT_CORE_POLICY):
            append_env(container, CORE_POLICY_ENV, config.gpu_core_policy)
        has_resource = self._default_gpu_count(container, limits)
        if self._default_exclusive_cores(container, requests):
            has_resource = True
        spec = pod.setdefault("spec", {})
        if has_resource and spec.get("runtimeClassName") is None and config.runtime_class_name:
            spec["runtimeClassName"] = config.runtime_class_name
        if not has_resource and overwrite_env(pod, container, default=config.overwrite_env):
            append_env(container, VISIBLE_DEVICES_ENV, "none")
        return has_resource

    @staticmethod
    def _resource_lists(container: dict) -> tuple[dict, dict]:
        resources = container.get("resources") or {}
        return resources.get("limits") or {}, resources.get("requests") or {}

    def _rounded(self, container: str, resource: str, raw: object) -> int:
        value = parse_quantity_ceil(raw)
        if value is None:
            raise self._error(container, resource, raw, "is not a quantity")
        return value

    def _check_percentages(self, container: str, limits: dict, requests: dict) -> None:
        """Upstream's webhook (#2740, #2789): the memory percentage and the cores, in limits and
        in requests alike, each an integer in 0..100 (``50.5`` is refused, not rounded)."""
        checked_integers(container, ((self._percent_name, 0, 100), (self._core_name, 0, 100)), limits, requests)

    def _default_gpu_count(self, container: dict, limits: dict) -> bool:
        """Whether the count is limited, adding ``defaultGPUNum`` when only memory, percentage
        or cores are (upstream looks at limits only here)."""
        if self._count_name and self._count_name in limits:
            return True
        sharing = (self._core_name, self._memory_name, self._percent_name)
        if not any(resource and resource in limits for resource in sharing):
            return False
        if self.config.default_gpu_num <= 0 or not self._count_name:
            return False
        container["resources"]["limits"][self._count_name] = str(self.config.default_gpu_num)
        return True

    def _default_exclusive_cores(self, container: dict, requests: dict) -> bool:
        """Give all cores (``gpucores: 100``) to a container asking for GPUs with neither
        cores nor a partial share of memory: a whole card should not be time-sliced."""
        limits, _ = self._resource_lists(container)
        if not self._count_name or self._lookup(limits, requests, self._count_name) is _MISSING:
            return False
        if not self._core_name or self._lookup(limits, requests, self._core_name) is not _MISSING:
            return False
        percent = self._lookup(limits, requests, self._percent_name)
        if percent is not _MISSING:
            exclusive = parse_exact_int(percent) == 100     # checked above: an integer in 0..100
        else:
            exclusive = not self._memory_name or self._lookup(limits, requests, self._memory_name) is _MISSING
        if not exclusive:
            return False
        resources = container.get("resources")
        if not isinstance(resources, dict):
            resources = container["resources"] = {}
        if not isinstance(resources.get("limits"), dict):
            resources["limits"] = {}
        resources["limits"][self._core_name] = "100"
        return True

    # -- selection ------------------------------------------------------------------------------

    def device_selector(self, pod_annotations: dict[str, str],
                        node_annotations: dict[str, str]) -> DeviceSelector | None:
        """A per-device gate for pods that pick or avoid GPUs, or None when nothing restricts.

        Gates, in upstream's order: the node's ``hami.io/device-cordon`` UUID list
        (CardCordoned); the pod's ``use-gputype``/``nouse-gputype`` (case-insensitive substring
        of the model) and ``vgpu-mode`` (its text must contain the device's mode)
        (CardTypeMismatch); the pod's ``use-gpuuuid``/``nouse-gpuuuid`` (exact UUIDs)
        (CardUuidMismatch). Blank annotations impose nothing. The comma lists are split here,
        once, not per device.
        """
        cordon = non_blank(node_annotations, CORDON_ANNOTATION)
        use_type = non_blank(pod_annotations, USE_TYPE_ANNOTATION)
        nouse_type = non_blank(pod_annotations, NOUSE_TYPE_ANNOTATION)
        mode = non_blank(pod_annotations, VGPU_MODE_ANNOTATION)
        use_uuid = non_blank(pod_annotations, USE_UUID_ANNOTATION)
        nouse_uuid = non_blank(pod_annotations, NOUSE_UUID_ANNOTATION)
        if cordon is None and use_type is None and nouse_type is None and mode is None \
                and use_uuid is None and nouse_uuid is None:
            return None
        cordoned = None
        if cordon is not None:
            cordoned = frozenset(entry.strip() for entry in cordon.split(",") if entry.strip())
        type_allowed = None
        if use_type is not None or nouse_type is not None or mode is not None:
            type_allowed = make_type_gate(type_entries(use_type), type_entries(nouse_type), mode)
        return make_selector(cordoned, type_allowed, uuid_entries(use_uuid), uuid_entries(nouse_uuid))

    # -- allocation annotations -----------------------------------------------------------------

    def allows_partitions(self, pod_annotations: dict[str, str]) -> bool:
        """``nvidia.com/vgpu-mode`` rules MIG out unless its text names ``mig``."""
        mode = pod_annotations.get(VGPU_MODE_ANNOTATION)
        return mode is None or "mig" in mode

    def partition_ranks(self, pod_annotations: dict[str, str], profile_names: list[str]):
        """``nvidia.com/mig-profile-preference`` (HAMi #3014): nvidia/mig_preference.py."""
        return preference_ranks(pod_annotations, profile_names)

    def numa_bind(self, pod_annotations: dict[str, str]) -> bool:
        return parse_numa_bind(pod_annotations)

    def encode_allocation(self, pod_devices: PodDevices, *, node: str = "", partitions: list[dict] = (),
                          now: float = 0.0, pod_annotations: dict[str, str] | None = None) -> dict[str, str]:
        """Both allocation annotations (identical text), or {} when no container got a GPU; and
        ``hami.io/vgpu-mig-allocations``, the MIG instances this decision reserved, as upstream
        writes them (containerIndex, deviceIndex, gpuUUID, profile, placement{start,size})."""
        if not any(pod_devices):
            return {}
        text = encode_pod_devices(pod_devices)
        out = {TO_ALLOCATE_ANNOTATION: text, ALLOCATED_ANNOTATION: text}
        if partitions:
            out[MIG_ALLOCATIONS_ANNOTATION] = orjson.dumps(partitions).decode()
        return out

    def decision_annotations(self) -> tuple[str, ...]:
        return TO_ALLOCATE_ANNOTATION, ALLOCATED_ANNOTATION, MIG_ALLOCATIONS_ANNOTATION

    def decode_partitions(self, annotations: dict[str, str]) -> list[tuple[str, int, int, tuple | None]]:
        """(gpuUUID, placement start, size, runtime) per instance; [] when absent or invalid, as
        upstream treats an annotation it cannot trust. ``runtime`` is None until the device plugin
        has created the instance and written its identity, then (profile, migUUID,
        gpuInstanceID, computeInstanceID). An identity given in part is invalid."""
        text = annotations.get(MIG_ALLOCATIONS_ANNOTATION)
        if not text:
            return []
        try:
            items = orjson.loads(text)
        except orjson.JSONDecodeError:
            return []
        if not isinstance(items, list):
            return []
        out, seen = [], set()
        for item in items:
            if not isinstance(item, dict):
                return []
            place = item.get("placement")
            ci, di, uuid, profile = (item.get("containerIndex"), item.get("deviceIndex"),
                                     item.get("gpuUUID"), item.get("profile"))
            mig_uuid, gi_id, ci_id = item.get("migUUID"), item.get("gpuInstanceID"), item.get("computeInstanceID")
            runtime = (bool(mig_uuid), gi_id is not None, ci_id is not None)
            if (not isinstance(ci, int) or not isinstance(di, int) or ci < 0 or di < 0
                    or not isinstance(uuid, str) or not uuid or not isinstance(profile, str) or not profile
                    or not isinstance(place, dict) or not isinstance(place.get("start"), int)
                    or not isinstance(place.get("size"), int) or place["start"] < 0 or place["size"] <= 0
                    or (mig_uuid is not None and not isinstance(mig_uuid, str))
                    or (gi_id is not None and not _is_uint32(gi_id))
                    or (ci_id is not None and not _is_uint32(ci_id))
                    or (any(runtime) and not all(runtime)) or (ci, di) in seen):
                return []
            seen.add((ci, di))
            out.append((uuid, place["start"], place["size"],
                        (profile, mig_uuid, gi_id, ci_id) if all(runtime) else None))
        return out

    def decode_allocation(self, annotations: dict[str, str]) -> PodDevices | None:
        """The allocation recorded in ``hami.io/vgpu-devices-allocated``, or None if absent."""
        text = annotations.get(ALLOCATED_ANNOTATION)
        if text is None:
            return None
        return decode_pod_devices(text)

