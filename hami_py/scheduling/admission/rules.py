"""Pod admission: upstream HAMi's mutating webhook as pure functions (review in, review out).

kube-scheduler only sends us pods whose ``spec.schedulerName`` names our scheduler profile, so a
GPU pod created with the default scheduler would never reach the extender. The webhook closes
that gap: it rewrites the scheduler name of every pod asking for a managed device, applies each
vendor's container defaults (GPU count, exclusive cores, environment), refuses what can never
work (privileged device pods, pods without containers, device pods already pinned to a node)
and checks the namespace's device quota before the pod exists.

Everything here is a function of the review, the settings, the vendors and an injected quota
check, so the rules are tested without HTTP and the HTTP layer cannot change them. The answer
is the AdmissionReview a kube-apiserver expects, in the version it asked in, carrying a JSON
Patch of exactly the fields we changed. Nothing a client sends can make this module raise:
a malformed review or pod is answered with an error response that names what is wrong.

Deliberate differences from upstream (docs/COMPATIBILITY.md):

* The patch lists only the fields the webhook changed. Upstream diffs the submitted JSON with
  its Go re-encoding of the pod, so it can also rewrite fields it does not touch (canonical
  quantities, dropped unknown fields).
* A device request that is present but malformed (a device count of ``"1.5"``) is refused at
  admission with the reason. Upstream admits the pod, which is later bound without devices.
* A request a family's admission refuses (a memory percentage of ``-1``) is denied (403), as
  every other refusal; upstream answers it as a webhook fault (``Errored``, 500).
* The quota check falls back to the review's namespace when the pod object carries none.
* A denial for scheduler-owned annotations (HAMi's later rule, ``admit_update``) names every key
  concerned; upstream's names one (its wording is kept for one key).

The UPDATE rule needs one fact from outside: whether the request's author may write Nodes (a
SubjectAccessReview, hami_py/k8s/accessreview.py). ``review`` takes its answer as an input
(``may_write_nodes``); ``review_asking``, the webhook's entry, asks it first when the rule needs it.
"""
from __future__ import annotations

import base64
import copy
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Mapping

import orjson
import structlog

from hami_py.devices.base import DeviceVendor, RequestError
from hami_py.k8s.accessreview import Subject
from hami_py.podshape import is_sidecar
from hami_py.scheduling.admission.numa_alignment import numa_alignment
from hami_py.scheduling.admission.owned_annotations import (  # noqa: F401  (GENERIC_OWNED_ANNOTATIONS: re-exported)
    GENERIC_OWNED_ANNOTATIONS, owned_phrase, scheduler_owned_annotations,
)

log = structlog.get_logger(__name__)

ADMISSION_V1 = "admission.k8s.io/v1"
ADMISSION_V1BETA1 = "admission.k8s.io/v1beta1"
SUPPORTED_VERSIONS = (ADMISSION_V1, ADMISSION_V1BETA1)
DEFAULT_SCHEDULER_NAME = "default-scheduler"

# Messages upstream answers with (kept word for word: users and alerts match on them).
NO_CONTAINERS = "pod has no containers"
OTHER_SCHEDULER = "pod already has different scheduler assigned"
NODE_ASSIGNED = "pod has node assigned"
QUOTA_EXCEEDED = "exceeding resource quota"

# fit_quota(namespace, vendor_key, memory MiB (memoryFactor applied), cores percent) -> fits
FitQuota = Callable[[str, str, int, int], bool]
# may_write_nodes(subject): the API server's answer, True or False, or a str saying why it could
# not be had (the UPDATE rule then refuses: fail closed).
NodeWriters = Callable[[Subject], "bool | str"]


def no_node_writers(subject: Subject) -> bool:
    """The UPDATE rule's answer where nobody is asked: nobody may write Nodes."""
    return False


def always_fits(namespace: str, vendor_key: str, memory: int, cores: int) -> bool:
    """The quota check while no ResourceQuota cache is wired in: every request fits."""
    return True


@dataclass(frozen=True, slots=True)
class AdmissionSettings:
    """The flags the webhook obeys (upstream's names)."""
    scheduler_name: str = ""                        # --scheduler-name
    force_overwrite_default_scheduler: bool = True  # --force-overwrite-default-scheduler


@dataclass(slots=True)
class Verdict:
    """One admission answer; ``code`` and ``reason`` become the response's ``status``."""
    allowed: bool
    code: int
    message: str = ""
    reason: str = ""
    patch: list[dict] = field(default_factory=list)

    @classmethod
    def allow(cls, message: str = "", patch: list[dict] | None = None) -> Verdict:
        return cls(True, 200, message, "", patch or [])

    @classmethod
    def deny(cls, message: str) -> Verdict:
        return cls(False, 403, message, "Forbidden")

    @classmethod
    def error(cls, code: int, message: str) -> Verdict:
        return cls(False, code, message)


class MalformedReview(ValueError):
    """The review or the pod in it cannot be read; the message names the offending field."""


# ---------------------------------------------------------------------------------------------
# The review envelope
# ---------------------------------------------------------------------------------------------

def review(body: object, *, settings: AdmissionSettings, vendors: Mapping[str, DeviceVendor],
           fit_quota: FitQuota = always_fits, may_write_nodes: NodeWriters = no_node_writers) -> dict:
    """Answer one decoded AdmissionReview with the response review (never raises).

    The answer uses the request's version (``v1`` or ``v1beta1``); a review that cannot be read
    at all is answered in ``v1`` with status 400 and a message naming the problem, and a fault
    of ours with status 500, so the API server shows the reason instead of a dropped call.
    """
    version = ADMISSION_V1
    uid = ""
    try:
        version, uid, request = _read_envelope(body)
        if _optional_str(request, "operation", "request.operation") == "UPDATE":
            verdict = admit_update(_pod_of(request, "object"), _pod_of(request, "oldObject"), user=_subject(request),
                                   settings=settings, vendors=vendors, may_write_nodes=may_write_nodes)
        else:   # CREATE (the only other operation the manifests register)
            verdict = admit_pod(_pod_of(request, "object"), settings=settings, vendors=vendors, fit_quota=fit_quota,
                                request_namespace=_optional_str(request, "namespace", "request.namespace"))
    except MalformedReview as exc:
        verdict = Verdict.error(400, str(exc))
    except Exception as exc:  # noqa: BLE001 - a bug of ours must still produce an answer
        log.exception("admission failed unexpectedly", uid=uid)
        verdict = Verdict.error(500, f"internal error in the admission webhook: {exc}")
    return review_response(version=version, uid=uid, verdict=verdict)


async def review_asking(body: object, *, settings: AdmissionSettings, vendors: Mapping[str, DeviceVendor],
                        ask: Callable[[Subject], Awaitable["bool | str"]], fit_quota: FitQuota = always_fits) -> dict:
    """``review`` as the webhook runs it: when the UPDATE rule needs to know whether the request's
    author may write Nodes, ``ask`` is awaited for the answer first (never raises)."""
    subject = node_write_question(body, settings=settings, vendors=vendors)
    if subject is None:
        return review(body, settings=settings, vendors=vendors, fit_quota=fit_quota)
    try:
        answer = await ask(subject)
    except Exception as exc:  # noqa: BLE001 - a bug of ours must refuse, not open the guard
        log.exception("asking whether a user may write nodes failed unexpectedly", user=subject.user)
        answer = f"internal error: {exc}"
    return review(body, settings=settings, vendors=vendors, fit_quota=fit_quota, may_write_nodes=lambda _: answer)


def node_write_question(body: object, *, settings: AdmissionSettings,
                        vendors: Mapping[str, DeviceVendor]) -> Subject | None:
    """Whose right to write Nodes the answer to ``body`` depends on: an UPDATE changing a
    scheduler-owned annotation of a pod of this scheduler; None for anything else (a malformed
    review too: ``review`` says what is wrong with it)."""
    try:
        _, _, request = _read_envelope(body)
        if _optional_str(request, "operation", "request.operation") != "UPDATE":
            return None
        pod, old_pod = _pod_of(request, "object"), _pod_of(request, "oldObject")
        if not owned_changes(pod, old_pod, vendors=vendors) or not _ours(old_pod, settings):
            return None
        return _subject(request)
    except MalformedReview:
        return None


def review_response(*, version: str, uid: str, verdict: Verdict) -> dict:
    """The AdmissionReview answer for ``verdict``; the patch is base64 JSON, as the API wants."""
    status: dict = {"code": verdict.code}
    if verdict.reason:
        status["reason"] = verdict.reason
    if verdict.message:
        status["message"] = verdict.message
    response: dict = {"uid": uid, "allowed": verdict.allowed, "status": status}
    if verdict.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(orjson.dumps(verdict.patch)).decode("ascii")
    return {"apiVersion": version, "kind": "AdmissionReview", "response": response}


def _read_envelope(body: object) -> tuple[str, str, dict]:
    if not isinstance(body, dict):
        raise MalformedReview(f"expected an AdmissionReview object, got {_json_type(body)}")
    version, kind = body.get("apiVersion"), body.get("kind")
    if kind != "AdmissionReview" or version not in SUPPORTED_VERSIONS:
        raise MalformedReview(
            f"expected kind AdmissionReview in {' or '.join(SUPPORTED_VERSIONS)}, "
            f"got kind {_shown(kind)} in apiVersion {_shown(version)}")
    request = body.get("request")
    if not isinstance(request, dict):
        raise MalformedReview(f"AdmissionReview has no request object (request is {_json_type(request)})")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise MalformedReview("request.uid: expected a non-empty string")
    return version, uid, request


def _pod_of(request: dict, key: str) -> dict:
    pod = request.get(key)
    if not isinstance(pod, dict):
        raise MalformedReview(f"request.{key}: expected a Pod object, got {_json_type(pod)}")
    kind = pod.get("kind")
    if kind is not None and kind != "Pod":
        raise MalformedReview(f"request.{key} is a {_shown(kind)}, not a Pod")
    return pod      # its shape is the rules' first check


def _subject(request: dict) -> Subject:
    """The request's author as its ``userInfo`` says (name, uid, groups, extra)."""
    info = _optional_dict(request, "userInfo", "request.userInfo") or {}
    groups = info.get("groups") or []
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        raise MalformedReview(f"request.userInfo.groups: expected a list of strings, got {_json_type(groups)}")
    extra = _optional_dict(info, "extra", "request.userInfo.extra") or {}
    for key, values in extra.items():
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise MalformedReview(f"request.userInfo.extra[{key}]: expected a list of strings, got {_json_type(values)}")
    return Subject.of(user=_optional_str(info, "username", "request.userInfo.username") or "", groups=groups,
                      uid=_optional_str(info, "uid", "request.userInfo.uid") or "", extra=extra)


# ---------------------------------------------------------------------------------------------
# The rules
# ---------------------------------------------------------------------------------------------

def admit_pod(pod: dict, *, settings: AdmissionSettings, vendors: Mapping[str, DeviceVendor],
              fit_quota: FitQuota = always_fits, request_namespace: str | None = None) -> Verdict:
    """Upstream's webhook rules, in upstream's order, on one pod (not modified).

    Raises MalformedReview when the pod does not have a Pod's shape.
    """
    _check_pod_shape(pod)
    spec = pod.get("spec") or {}
    meta = pod.get("metadata") or {}
    namespace = meta.get("namespace") or request_namespace or ""
    where = f"{namespace}/{meta.get('name') or meta.get('generateName') or ''}"
    if not spec.get("containers"):
        log.info("admission denied", pod=where, reason=NO_CONTAINERS)
        return Verdict.deny(NO_CONTAINERS)
    # Before the other-scheduler exit below, which admits a pod as it is: a decision preset at
    # create was not made by a scheduler (written by hand, or copied from a scheduled pod), and
    # the device plugin would serve it all the same.
    owned = scheduler_owned_annotations(vendors)
    preset = sorted(k for k in meta.get("annotations") or () if k in owned)
    if preset:
        message = f"{owned_phrase(preset)} cannot be set when creating a pod"
        log.warning("admission denied: scheduler-owned annotations preset", pod=where, annotations=preset)
        return Verdict.deny(message)
    if not scheduler_applies(spec.get("schedulerName") or "", settings=settings):
        return Verdict.allow(OTHER_SCHEDULER)
    try:
        numa_alignment(meta.get("annotations"))
    except ValueError as exc:
        log.info("admission denied", pod=where, reason=str(exc))
        return Verdict.deny(str(exc))
    for vendor in vendors.values():     # a family's own pod annotations (a MIG profile preference)
        if (refusal := vendor.admission_refusal(meta.get("annotations") or {})) is not None:
            log.info("admission denied", pod=where, reason=refusal)
            return Verdict.deny(refusal)

    mutated = copy.deepcopy(pod)
    mutated_spec = mutated.setdefault("spec", {})
    try:
        has_resource = _mutate_containers(mutated, vendors)
    except RequestError as exc:
        # An invalid request is the pod's fault, not ours: denied (403) like every other refusal,
        # never a 500 (upstream answers Errored 500 here).
        log.info("admission denied an invalid device request", pod=where, error=str(exc))
        return Verdict.deny(str(exc))
    privileged = privileged_container(spec)
    if privileged is not None and has_resource:
        message = f"container {privileged} is privileged"
        log.info("admission denied", pod=where, reason=message)
        return Verdict.deny(message)
    if has_resource and settings.scheduler_name:
        mutated_spec["schedulerName"] = settings.scheduler_name
        if spec.get("nodeName"):
            log.info("admission denied", pod=where, reason=NODE_ASSIGNED)
            return Verdict.deny(NODE_ASSIGNED)
    try:
        fits = quota_fits(mutated, namespace=namespace, vendors=vendors, fit_quota=fit_quota)
    except RequestError as exc:
        log.info("admission denied a malformed device request", pod=where, error=str(exc))
        return Verdict.deny(str(exc))
    if not fits:
        log.info("admission denied", pod=where, reason=QUOTA_EXCEEDED)
        return Verdict.deny(QUOTA_EXCEEDED)
    patch = json_patch(pod, mutated)
    log.debug("admission allowed", pod=where, devices=has_resource, patch_ops=len(patch))
    return Verdict.allow(patch=patch)


def admit_update(pod: dict, old_pod: dict, *, user: Subject, settings: AdmissionSettings,
                 vendors: Mapping[str, DeviceVendor], may_write_nodes: NodeWriters = no_node_writers) -> Verdict:
    """An UPDATE of a pod: refused when it adds, changes or removes a scheduler-owned annotation,
    unless the pod is this scheduler's and the API server says ``user`` may write Nodes
    (``may_write_nodes``: HAMi's rule, #3074); otherwise allowed without a patch (the create
    rules never run on an existing pod, whose scheduler name and containers the API server would
    not let us change anyway).

    Device plugins hand out devices from a pod's decision, so a decision written by a namespace's
    editor would be served outside the books and the quota. Whoever may write Nodes (the
    scheduler, each family's device plugin, an operator running the defragmenter) is trusted
    with the whole cluster's devices already; a ServiceAccount as such is not (a namespace admin
    can grant one pod patches). An answer that could not be had refuses (fail closed, 500).
    Raises MalformedReview when either object does not have a Pod's shape.
    """
    changed = owned_changes(pod, old_pod, vendors=vendors)
    if not changed:
        return Verdict.allow()
    meta = old_pod.get("metadata") or {}
    where = f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"
    name = user.user or "an unauthenticated user"
    message = f"{owned_phrase(changed)} cannot be set by {name}"
    if not _ours(old_pod, settings):
        # Our components act on our pods only; a write on another scheduler's pod is not theirs.
        pod_scheduler = (old_pod.get("spec") or {}).get("schedulerName") or ""
        log.warning("admission denied an update of scheduler-owned annotations on another scheduler's pod",
                    pod=where, user=user.user, annotations=changed, scheduler=pod_scheduler)
        return Verdict.deny(f"{message} on a pod of scheduler {_shown(pod_scheduler)}")
    answer = may_write_nodes(user)
    if answer is True:
        log.debug("admission allowed an update of scheduler-owned annotations", pod=where, user=user.user,
                  annotations=changed)
        return Verdict.allow()
    if answer is False:
        log.warning("admission denied an update of scheduler-owned annotations", pod=where, user=user.user,
                    annotations=changed)
        return Verdict.deny(message)
    log.warning("admission refused an update of scheduler-owned annotations: cannot tell whether its author "
                "may write nodes", pod=where, user=user.user, annotations=changed, error=answer)
    return Verdict.error(500, f"{message}: cannot tell whether {name} may write nodes ({answer})")


def owned_changes(pod: dict, old_pod: dict, *, vendors: Mapping[str, DeviceVendor]) -> list[str]:
    """The scheduler-owned annotations an UPDATE adds, changes or removes, sorted. Raises
    MalformedReview when either object does not have a Pod's shape."""
    _check_pod_shape(pod)
    _check_pod_shape(old_pod)
    new = (pod.get("metadata") or {}).get("annotations") or {}
    old = (old_pod.get("metadata") or {}).get("annotations") or {}
    owned = scheduler_owned_annotations(vendors)
    return sorted(k for k in new.keys() | old.keys() if k in owned and new.get(k) != old.get(k))


def _ours(old_pod: dict, settings: AdmissionSettings) -> bool:
    # Without --scheduler-name there is no "ours" to compare with: upstream lets the rule decide.
    scheduler = (old_pod.get("spec") or {}).get("schedulerName") or ""
    return not settings.scheduler_name or scheduler == settings.scheduler_name


def scheduler_applies(pod_scheduler: str, *, settings: AdmissionSettings) -> bool:
    """Whether the webhook processes a pod with this ``spec.schedulerName``: none set, the
    default scheduler while force-overwrite is on, or already ours. Any other scheduler's pods
    are left alone."""
    if not pod_scheduler:
        return True
    if pod_scheduler == DEFAULT_SCHEDULER_NAME and settings.force_overwrite_default_scheduler:
        return True
    return bool(settings.scheduler_name) and pod_scheduler == settings.scheduler_name


def _mutate_containers(pod: dict, vendors: Mapping[str, DeviceVendor]) -> bool:
    """Every vendor on every init container, then every container; whether any asks for a device."""
    spec = pod["spec"]
    has_resource = False
    for group in ("initContainers", "containers"):
        for container in spec.get(group) or ():
            for vendor in vendors.values():
                # Every vendor sees every container: mutations (env) happen even without devices.
                if vendor.mutate_admission(container, pod):
                    has_resource = True
    return has_resource


def privileged_container(spec: dict) -> str | None:
    """The first privileged container's name (init containers first), or None."""
    for group in ("initContainers", "containers"):
        for container in spec.get(group) or ():
            context = container.get("securityContext") or {}
            if context.get("privileged") is True:
                return container.get("name") or ""
    return None


def quota_fits(pod: dict, *, namespace: str, vendors: Mapping[str, DeviceVendor], fit_quota: FitQuota) -> bool:
    """Upstream's admission quota pre-check, per vendor, with Kubernetes' effective request.

    The pod's device memory and cores are the larger of (the app containers plus every native
    sidecar) and (each ordinary init container plus the sidecars started before it), each
    container's ``request x count`` as the vendor parses it after the webhook's own defaults
    (``DeviceVendor.quota_request``; a percentage or whole-card request counts 0 MiB here: the
    filter checks those), the same rule the filter's quota check and the books follow
    (hami_py/podshape.py). Vendors whose pod asks for neither are skipped. Raises RequestError for
    a malformed request.
    """
    spec = pod.get("spec") or {}
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    for key, vendor in vendors.items():
        side_memory = side_cores = init_memory = init_cores = 0
        for container in spec.get("initContainers") or ():
            request = vendor.container_request(container, pod_annotations=annotations)
            memory, cores = vendor.quota_request(container, request) if request is not None and request.nums else (0, 0)
            if is_sidecar(container):
                side_memory, side_cores = side_memory + memory, side_cores + cores
            else:
                init_memory = max(init_memory, side_memory + memory)
                init_cores = max(init_cores, side_cores + cores)
        app_memory, app_cores = side_memory, side_cores
        for container in spec.get("containers") or ():
            request = vendor.container_request(container, pod_annotations=annotations)
            if request is not None and request.nums:
                memory, cores = vendor.quota_request(container, request)
                app_memory, app_cores = app_memory + memory, app_cores + cores
        memory, cores = max(app_memory, init_memory), max(app_cores, init_cores)
        if memory == 0 and cores == 0:
            continue
        if not fit_quota(namespace, key, memory, cores):
            return False
    return True


# ---------------------------------------------------------------------------------------------
# Pod shape: what a Go decoder would refuse, found before any rule reads it
# ---------------------------------------------------------------------------------------------

def _check_pod_shape(pod: dict) -> None:
    meta = _optional_dict(pod, "metadata", "metadata")
    if meta is not None:
        for key in ("name", "namespace", "generateName"):
            _optional_str(meta, key, f"metadata.{key}")
        annotations = _optional_dict(meta, "annotations", "metadata.annotations")
        for key, value in (annotations or {}).items():
            if not isinstance(value, str):
                raise MalformedReview(f"metadata.annotations[{key}]: expected a string, got {_json_type(value)}")
    spec = _optional_dict(pod, "spec", "spec")
    if spec is None:
        return
    for key in ("schedulerName", "nodeName", "runtimeClassName"):
        _optional_str(spec, key, f"spec.{key}")
    for group in ("initContainers", "containers"):
        containers = spec.get(group)
        if containers is None:
            continue
        if not isinstance(containers, list):
            raise MalformedReview(f"spec.{group}: expected a list, got {_json_type(containers)}")
        for position, container in enumerate(containers):
            _check_container_shape(container, f"spec.{group}[{position}]")


def _check_container_shape(container: object, where: str) -> None:
    if not isinstance(container, dict):
        raise MalformedReview(f"{where}: expected a container object, got {_json_type(container)}")
    _optional_str(container, "name", f"{where}.name")
    resources = _optional_dict(container, "resources", f"{where}.resources")
    for kind in ("limits", "requests"):
        values = _optional_dict(resources or {}, kind, f"{where}.resources.{kind}")
        for name, value in (values or {}).items():
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise MalformedReview(f"{where}.resources.{kind}[{name}]: expected a quantity, "
                                      f"got {_json_type(value)}")
    env = container.get("env")
    if env is not None and not isinstance(env, list):
        raise MalformedReview(f"{where}.env: expected a list, got {_json_type(env)}")
    context = _optional_dict(container, "securityContext", f"{where}.securityContext")
    privileged = (context or {}).get("privileged")
    if privileged is not None and not isinstance(privileged, bool):
        raise MalformedReview(f"{where}.securityContext.privileged: expected a boolean, got {_json_type(privileged)}")


def _optional_dict(parent: dict, key: str, where: str) -> dict | None:
    value = parent.get(key)
    if value is not None and not isinstance(value, dict):
        raise MalformedReview(f"{where}: expected an object, got {_json_type(value)}")
    return value


def _optional_str(parent: dict, key: str, where: str) -> str | None:
    value = parent.get(key)
    if value is not None and not isinstance(value, str):
        raise MalformedReview(f"{where}: expected a string, got {_json_type(value)}")
    return value


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _shown(value: object) -> str:
    return orjson.dumps(value).decode() if isinstance(value, (str, int, float, bool, type(None))) \
        else _json_type(value)


# ---------------------------------------------------------------------------------------------
# JSON Patch (RFC 6902) of what changed
# ---------------------------------------------------------------------------------------------

def json_patch(before: object, after: object) -> list[dict]:
    """The operations that turn ``before`` into ``after``.

    Objects are compared key by key; a list that only grew at its end gets one ``add`` per new
    element (so an appended env var does not rewrite the others), a list of the same length is
    compared element by element, any other list change replaces the list.
    """
    ops: list[dict] = []
    _diff(before, after, "", ops)
    return ops


def _escape(token: str) -> str:
    # RFC 6901: "~" first, then "/" ("example.com/gpu" becomes "example.com~1gpu").
    return token.replace("~", "~0").replace("/", "~1")


def _diff(before: object, after: object, path: str, ops: list[dict]) -> None:
    if type(before) is dict and type(after) is dict:
        for key in before:
            if key not in after:
                ops.append({"op": "remove", "path": f"{path}/{_escape(key)}"})
        for key, value in after.items():
            if key not in before:
                ops.append({"op": "add", "path": f"{path}/{_escape(key)}", "value": value})
            else:
                _diff(before[key], value, f"{path}/{_escape(key)}", ops)
        return
    if type(before) is list and type(after) is list:
        if len(before) == len(after):
            for position, (old, new) in enumerate(zip(before, after)):
                _diff(old, new, f"{path}/{position}", ops)
            return
        if len(after) > len(before) and after[:len(before)] == before:
            for position in range(len(before), len(after)):
                ops.append({"op": "add", "path": f"{path}/{position}", "value": after[position]})
            return
    if type(before) is not type(after) or before != after:
        ops.append({"op": "replace", "path": path, "value": after})
