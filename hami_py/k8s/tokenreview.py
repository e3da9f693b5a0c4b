"""Who is calling: a bearer token checked by the API server (TokenReview).

/refit moves a pod's devices, so only the device plugin of the node the pod runs on may ask for
it (HAMi after v2.10 accepts exactly one ServiceAccount, named by --device-plugin-namespace and
--device-plugin-service-account). The token is the plugin pod's own projected ServiceAccount
token: the API server says whose it is and which pod it is bound to (the
``authentication.kubernetes.io/pod-name`` and ``pod-uid`` extras of a bound token), and that pod,
read back, must be the one of that UID and run on the node the refit is for.

A missing or unauthenticated token is 401; an authenticated caller that is not the device
plugin of that node is 403. Needs RBAC ``create`` on ``tokenreviews`` and nothing more (the pod
read uses the scheduler's ``get pods``).
"""
from __future__ import annotations

from dataclasses import dataclass

from hami_py.k8s.client import KubeApiError, KubeClient, pod_path

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
POD_NAME = "authentication.kubernetes.io/pod-name"
POD_UID = "authentication.kubernetes.io/pod-uid"


class CallerRefused(Exception):
    """``status`` 401 (who the caller is is unknown) or 403 (known, and not allowed)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class DevicePluginIdentity:
    namespace: str
    service_account: str

    @property
    def username(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"


def bearer_token(authorization: str | None) -> str:
    """The token of ``Authorization: Bearer <token>`` (the scheme as upstream reads it,
    case-sensitive); "" for anything else."""
    if not authorization or not authorization.startswith("Bearer "):
        return ""
    return authorization[len("Bearer "):].strip()


async def authenticate_device_plugin(client: KubeClient, token: str, *, identity: DevicePluginIdentity,
                                     node: str) -> str:
    """``namespace/name`` of the device plugin pod the token belongs to, which runs on ``node``;
    CallerRefused otherwise."""
    if not token:
        raise CallerRefused(401, "caller authentication failed: no bearer token")
    try:
        review = await client.post(TOKEN_REVIEWS, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                                                   "spec": {"token": token}})
    except KubeApiError as exc:
        raise CallerRefused(401, f"caller authentication failed: TokenReview: {exc}") from None
    status = review.get("status") or {}
    if not status.get("authenticated"):
        why = status.get("error") or "token not authenticated"
        raise CallerRefused(401, f"caller authentication failed: {why}")
    user = status.get("user") or {}
    if user.get("username") != identity.username:
        raise CallerRefused(403, f"caller authentication failed: {user.get('username') or 'the caller'} is not "
                                 f"the device plugin's ServiceAccount {identity.username}")
    extra = user.get("extra") or {}
    pod_name, pod_uid = _first(extra.get(POD_NAME)), _first(extra.get(POD_UID))
    if not pod_name or not pod_uid:
        raise CallerRefused(403, "caller authentication failed: the token is not bound to a pod")
    key = f"{identity.namespace}/{pod_name}"
    try:
        pod = await client.get(pod_path(identity.namespace, pod_name))
    except KubeApiError as exc:
        raise CallerRefused(403, f"caller authentication failed: device plugin pod {key}: {exc}") from None
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    if meta.get("uid") != pod_uid:
        raise CallerRefused(403, f"caller authentication failed: device plugin pod {key} is not the token's "
                                 f"(uid {meta.get('uid')}, token {pod_uid})")
    if spec.get("nodeName") != node:
        raise CallerRefused(403, f"caller authentication failed: device plugin pod {key} runs on node "
                                 f"{spec.get('nodeName')}, not {node}")
    return key


def _first(values) -> str:
    if isinstance(values, list) and values and isinstance(values[0], str):
        return values[0]
    return ""
