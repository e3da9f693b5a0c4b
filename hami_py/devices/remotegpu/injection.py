"""What the webhook writes into a pod that asks for remote GPUs ("lupine"), and why it must.

A remote-GPU client runs on a node that owns no GPU, so no device plugin ever sees the pod: there
is no Allocate call to hand the container its server or HAMi-core. Whatever the container needs
has to be in its spec before it starts, written at admission:

* ``LUPINE_SERVER`` comes from the pod annotation ``hami.io/lupine-endpoint`` through the downward
  API. The server is chosen only at /filter, after admission, so a literal value in the spec can
  only be wrong and is replaced. ``LUPINE_WORKLOAD_ID`` is the pod's uid: the identity the
  server's usage metrics group a workload's connections by.
* With a library image configured and a memory request above 0, HAMi-core has to arrive with
  the pod: an ``emptyDir`` volume, an init container that copies ``libvgpu.so`` into it (first
  among the init containers, HAMi #3201, so no other init container starts without it), the
  volume mounted in the container, ``LD_PRELOAD`` naming the library ahead of whatever the
  container preloads itself, and HAMi-core's memory limit and cache file. The limit then holds
  before any CUDA call leaves the client for the network.

Every write is checked before the first one is made: a pod refused here (``RequestError``) is
refused whole, never half-mutated. Applying it a second time (``reinvocationPolicy: IfNeeded``,
on a pod the API server has since defaulted) changes nothing, so the second review answers no
patch. Only raw Kubernetes dicts are read and written, as every family's ``mutate_admission``.
"""
from __future__ import annotations

import re

from hami_py.devices.base import RequestError
from hami_py.devices.codec import go_quote
from hami_py.devices.template import MISSING, device_count, lookup, resource_lists, whole_number
from hami_py.quantity import INT32_MAX

ENDPOINT_ANNOTATION = "hami.io/lupine-endpoint"
SERVER_ENV = "LUPINE_SERVER"
WORKLOAD_ID_ENV = "LUPINE_WORKLOAD_ID"

# One name for the volume and the init container that fills it: easy to spot in a mutated pod,
# and how a second container of the same pod (or a second review) finds what is already there.
LIB_NAME = "hami-remote-gpu-lib"
LIB_DIR = "/hami-remote-gpu"
LIB_FILE = f"{LIB_DIR}/libvgpu.so"
# The image ships the library under a version suffix; the glob spares us tracking its tag.
COPY_COMMAND = ("sh", "-c", f"cp /k8s-vgpu/lib/nvidia/libvgpu.so.* {LIB_FILE}")

PRELOAD_ENV = "LD_PRELOAD"
MEMORY_LIMIT_ENV = "CUDA_DEVICE_MEMORY_LIMIT"
SHARED_CACHE_ENV = "CUDA_DEVICE_MEMORY_SHARED_CACHE"
# A cache of the pod's own: it holds its cards whole, so there are no peers to account with.
SHARED_CACHE = f"{LIB_DIR}/vgpu.cache"

# ld.so splits LD_PRELOAD on spaces and colons alike; upstream joins with a space, as we do.
_PRELOAD_SEPARATORS = re.compile(r"[:\s]+")


def inject(container: dict, pod: dict, *, count_resource: str, memory_resource: str, lib_image: str) -> bool:
    """Write the remote-GPU client settings into ``container`` (and the library delivery into
    ``pod``), in place. True when the container asks for remote GPUs (a count above 0), False
    (nothing written) otherwise, or when the family is off (no count resource).

    Raises RequestError, before anything is written, for a count or memory that is not a whole
    number in range, an ``LD_PRELOAD`` taken from a source when the library must be preloaded,
    or a name or path of the pod's own that the library delivery would collide with.
    """
    if not count_resource:
        return False
    name = container.get("name") or ""
    limits, requests = resource_lists(container)
    raw_count = lookup(limits, requests, count_resource)
    if raw_count is MISSING or device_count(name, count_resource, raw_count) == 0:
        return False
    memory = 0
    raw_memory = lookup(limits, requests, memory_resource)
    if raw_memory is not MISSING:
        memory = whole_number(name, memory_resource, raw_memory, low=0, high=INT32_MAX, unit="MiB")
    spec = pod.setdefault("spec", {})
    preload = None
    if lib_image and memory > 0:
        preload = _preload_value(container, name, memory_resource)
        _check_delivery(container, spec, name)

    _set_env(container, {"name": SERVER_ENV, "valueFrom": {"fieldRef": {
        "apiVersion": "v1", "fieldPath": f"metadata.annotations['{ENDPOINT_ANNOTATION}']"}}})
    _set_env(container, {"name": WORKLOAD_ID_ENV, "valueFrom": {"fieldRef": {
        "apiVersion": "v1", "fieldPath": "metadata.uid"}}})
    if preload is not None:
        _mount(container)
        _set_env(container, {"name": PRELOAD_ENV, "value": preload})
        # No index: HAMi-core applies the bare limit to every device the client sees.
        _set_env(container, {"name": MEMORY_LIMIT_ENV, "value": f"{memory}m"})
        # No core limit: the cards are the pod's whole, and HAMi-core defaults to all of a card.
        _set_env(container, {"name": SHARED_CACHE_ENV, "value": SHARED_CACHE})
        _deliver(spec, lib_image)
    return True


# -- checks (nothing is written until they all pass) ------------------------------------------

def _preload_value(container: dict, name: str, memory_resource: str) -> str:
    """``LD_PRELOAD`` with the library first. The container's own literal value is kept after it
    (the last entry of that name is the one the kubelet uses); a value from a source cannot be
    combined with ours, and dropping it would break the workload, so the pod is refused."""
    env = container.get("env")
    entries = [var for var in env if var.get("name") == PRELOAD_ENV] if isinstance(env, list) else []
    if any("valueFrom" in var for var in entries):
        raise RequestError(f"container {go_quote(name)} takes {PRELOAD_ENV} from a source, which cannot be "
                           f"combined with the RemoteGPU memory limit: set {PRELOAD_ENV} literally, or drop "
                           f"the {memory_resource} request")
    current = (entries[-1].get("value") or "") if entries else ""
    parts = [part for part in _PRELOAD_SEPARATORS.split(current) if part]
    if not parts:
        return LIB_FILE
    if parts[0] == LIB_FILE:
        return current                               # ours already leads: a second review
    if LIB_FILE not in parts:
        return f"{LIB_FILE} {current}"                # the container's text kept as written
    return " ".join([LIB_FILE] + [part for part in parts if part != LIB_FILE])


def _check_delivery(container: dict, spec: dict, name: str) -> None:
    """The pod's own volumes, containers and mounts must leave room for the library's."""
    for volume in spec.get("volumes") or ():
        if volume.get("name") == LIB_NAME and set(volume) != {"name", "emptyDir"}:
            raise RequestError(f"container {go_quote(name)} asks for a RemoteGPU memory limit, but the pod's "
                               f"volume {go_quote(LIB_NAME)} is not the emptyDir the library is copied into: "
                               f"rename the volume")
    for group in ("initContainers", "containers", "ephemeralContainers"):
        for other in spec.get(group) or ():
            if other.get("name") == LIB_NAME and (group != "initContainers" or not _is_copy_step(other)):
                raise RequestError(f"container {go_quote(name)} asks for a RemoteGPU memory limit, but the pod "
                                   f"already has a container named {go_quote(LIB_NAME)}, the name of the init "
                                   f"container that copies the library: rename it")
    for mount in container.get("volumeMounts") or ():
        if _same_path(mount.get("mountPath"), LIB_DIR) and mount.get("name") != LIB_NAME:
            raise RequestError(f"container {go_quote(name)} mounts volume {go_quote(str(mount.get('name')))} "
                               f"at {LIB_DIR}, where the RemoteGPU library goes: mount it elsewhere")


def _is_copy_step(container: dict) -> bool:
    return container.get("name") == LIB_NAME and tuple(container.get("command") or ()) == COPY_COMMAND


def _same_path(path: object, wanted: str) -> bool:
    return isinstance(path, str) and path.rstrip("/") == wanted


# -- writes ------------------------------------------------------------------------------------

def _env(container: dict) -> list[dict]:
    env = container.get("env")
    if not isinstance(env, list):
        env = container["env"] = []
    return env


def _set_env(container: dict, entry: dict) -> None:
    """Exactly one variable of that name, holding ``entry``: the first is overwritten in place
    (variables after it may refer to it as ``$(NAME)``), later ones are dropped, since the
    kubelet would let the last one win over ours. Unchanged when it already reads so."""
    env = _env(container)
    positions = [i for i, var in enumerate(env) if var.get("name") == entry["name"]]
    if not positions:
        env.append(entry)
        return
    if env[positions[0]] != entry:
        env[positions[0]] = entry
    for i in reversed(positions[1:]):
        del env[i]


def _mount(container: dict) -> None:
    mounts = container.get("volumeMounts")
    if not isinstance(mounts, list):
        mounts = container["volumeMounts"] = []
    if not any(m.get("name") == LIB_NAME and _same_path(m.get("mountPath"), LIB_DIR) for m in mounts):
        # Writable: HAMi-core keeps its cache file beside the library.
        mounts.append({"name": LIB_NAME, "mountPath": LIB_DIR})


def _deliver(spec: dict, lib_image: str) -> None:
    """The volume, and the init container that fills it, placed first among the init containers."""
    volumes = spec.get("volumes")
    if not isinstance(volumes, list):
        volumes = spec["volumes"] = []
    if not any(v.get("name") == LIB_NAME for v in volumes):
        volumes.append({"name": LIB_NAME, "emptyDir": {}})
    inits = spec.get("initContainers") or []
    copier = next((c for c in inits if _is_copy_step(c)), None)
    if copier is None:
        copier = {"name": LIB_NAME, "image": lib_image, "command": list(COPY_COMMAND),
                  "volumeMounts": [{"name": LIB_NAME, "mountPath": LIB_DIR}]}
    else:
        # Ours by name and command (a pod copied from an older release): the configured image wins.
        if copier.get("image") != lib_image:
            copier["image"] = lib_image
        _mount(copier)
    if not inits or inits[0] is not copier:
        # A new list rather than an insert: the webhook may be walking the old one right now (an
        # init container asking for remote GPUs), and must neither skip nor revisit a container.
        spec["initContainers"] = [copier] + [c for c in inits if c is not copier]


__all__ = ["COPY_COMMAND", "ENDPOINT_ANNOTATION", "LIB_DIR", "LIB_FILE", "LIB_NAME", "MEMORY_LIMIT_ENV",
           "PRELOAD_ENV", "SERVER_ENV", "SHARED_CACHE", "SHARED_CACHE_ENV", "WORKLOAD_ID_ENV", "inject"]
