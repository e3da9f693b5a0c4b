"""Whether the webhook hides a family's devices from a container that asks for none (HAMi #2966).

A family with ``overwriteEnv`` in its config section sets its ``*_VISIBLE_DEVICES`` variable
(NVIDIA's ``none``, Ascend's empty) on every container that asks for none of its devices, so a
container started with the runtime's default (all devices) sees nothing. Two pod annotations
decide per pod and per container, over the config:

* ``hami.io/overwrite-env``: a boolean as Go's ``strconv.ParseBool`` reads it (``true``, ``1``,
  ``t``, ``false``, ``0``, ``F`` ...), for every container of the pod;
* ``hami.io/overwrite-env-containers``: a JSON object of container name to such a boolean string
  (``{"sidecar": "false"}``), which wins over the pod's for the containers it names.

Neither set (or a value that does not read): the config's ``overwriteEnv``. As upstream, a value
that does not read is logged and ignored, never a refusal: the container falls back a level.
"""
from __future__ import annotations

import functools

import orjson
import structlog

from hami_py.devices.codec import parse_go_bool

log = structlog.get_logger(__name__)

OVERWRITE_ENV_ANNOTATION = "hami.io/overwrite-env"
OVERWRITE_ENV_CONTAINERS_ANNOTATION = "hami.io/overwrite-env-containers"


def overwrite_env(pod: dict, container: dict, *, default: bool) -> bool:
    """Whether to set the family's clearing variable on ``container`` (which asks for none of its
    devices): the container's entry, else the pod's, else ``default`` (the config's)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if not annotations:
        return default
    entries = _container_entries(annotations.get(OVERWRITE_ENV_CONTAINERS_ANNOTATION))
    name = container.get("name") or ""
    if name in entries:
        return entries[name]
    pod_level = _pod_level(annotations.get(OVERWRITE_ENV_ANNOTATION))
    return default if pod_level is None else pod_level


@functools.lru_cache(maxsize=256)
def _pod_level(raw: str | None) -> bool | None:
    # Cached with the entries: several families (every Ascend chip) read the same pod, and a
    # value that does not read is logged once, not once a family.
    if raw is None or raw == "":
        return None
    value = parse_go_bool(raw)
    if value is None:
        log.warning("ignoring a pod annotation that is no boolean: the config's overwriteEnv applies",
                    annotation=OVERWRITE_ENV_ANNOTATION, value=raw)
    return value


@functools.lru_cache(maxsize=256)
def _container_entries(raw: str | None) -> dict[str, bool]:
    if not raw:
        return {}
    try:
        decoded = orjson.loads(raw)
    except orjson.JSONDecodeError:
        decoded = None
    if not isinstance(decoded, dict) or not all(isinstance(text, str) for text in decoded.values()):
        # (Go's decoding into map[string]string fails as a whole on a value that is no string.)
        log.warning("ignoring a pod annotation that is no JSON object of container names to boolean strings",
                    annotation=OVERWRITE_ENV_CONTAINERS_ANNOTATION, value=raw)
        return {}
    entries = {}
    for name, text in decoded.items():
        value = parse_go_bool(text)
        if value is None:
            log.warning("ignoring a container's entry that is no boolean string",
                        annotation=OVERWRITE_ENV_CONTAINERS_ANNOTATION, container=name, value=text)
            continue
        entries[name] = value
    return entries
