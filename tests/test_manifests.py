"""manifests/ against Kubernetes and against the code.

* Every object is validated offline against the Kubernetes 1.32 OpenAPI schemas that
  kubernetes-validate ships (strict: unknown fields fail).
* Names, ports, paths, flags, managed resources and the kube-scheduler configuration agree
  with what the CLI parses and the server serves.
* The ClusterRole and Role grant exactly the verbs hami-py was seen to use in a real run
  against the in-repo API server (filter, bind, leadership, registration, events, quotas),
  plus the lease verbs of the kube-scheduler sidecar.
* The Dockerfile, the Makefile targets and the kind scripts fit together (the fake GPU node
  annotations the script writes decode as HAMi's device plugin's would).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from urllib.parse import parse_qs

import aiohttp
import kubernetes_validate
import pytest
import yaml
from aiohttp import web

from hami_py.cli import _duration, build_parser, options_from_args
from hami_py.config import DeviceConfig, parse_device_config
from hami_py.devices.base import NodeView
from hami_py.devices.nvidia import NvidiaVendor, nvidia_config
from hami_py.devices.registry import FamilySwitches, build_vendors, managed_resource_names
from hami_py.embedded import embedded_options, running_scheduler, wait_for
from hami_py.k8s.nodelock import LOCK_ANNOTATION, lock_value
from hami_py.fakeapi.kubescheduler import ExtenderClient
from hami_py.fakeapi.objects import gpu_node, gpu_pod, gpu_uuid
from hami_py.http.server import build_app
from hami_py.http.server import build_cluster_app
from hami_py.http.refit import REFIT_PATH
from hami_py.http.webhook import WEBHOOK_PATH
from hami_py.k8s.budget import REQUESTS_PER_POD, pods_per_second_cap
from hami_py.fakeapi import write_kubeconfig
from hami_py.k8s.client import KubeClient, load_configuration
from hami_py.k8s.lupine_sessions import reconcile_session_stubs
from hami_py.metrics import Metrics
from hami_py.scheduling.admission.rules import SUPPORTED_VERSIONS

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = ROOT / "manifests"
KUBERNETES_VERSION = "1.32.0"   # the version the manifests target (kind node image v1.32)
NAMESPACE = "hami-system"


def load_manifests() -> list[dict]:
    """What `kubectl apply -k manifests/` applies: every document of every listed resource file."""
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    docs = []
    for name in kustomization["resources"]:
        docs.extend(d for d in yaml.safe_load_all((MANIFESTS / name).read_text()) if d)
    return docs


DOCS = load_manifests()
# Bindings to built-in Roles of kube-system (the kube-scheduler sidecar's delegated authentication).
KUBE_SYSTEM_BINDINGS = {("RoleBinding", "extension-apiserver-authentication-reader")}


def find(kind: str, name: str) -> dict:
    matches = [d for d in DOCS if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


def container_of(deployment: dict, name: str) -> dict:
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def port_of(container: dict, name: str) -> int:
    return next(p["containerPort"] for p in container["ports"] if p["name"] == name)


def container_port(container: dict, target) -> int:
    """The port number a Service targetPort or a probe port (a name or a number) leads to."""
    return port_of(container, target) if isinstance(target, str) else int(target)


def bind_port(address: str) -> int:
    return int(address.rpartition(":")[2])


def mount_of(container: dict, path: str) -> tuple[dict, str]:
    """(volume, file name inside it) for a file path under one of the container's mounts."""
    for mount in container.get("volumeMounts", []):
        prefix = mount["mountPath"].rstrip("/") + "/"
        if path.startswith(prefix):
            volumes = find("Deployment", "hami-scheduler")["spec"]["template"]["spec"]["volumes"]
            return next(v for v in volumes if v["name"] == mount["name"]), path[len(prefix):]
    raise AssertionError(f"{path} is not under any volume mount of {container['name']}")


DEPLOYMENT = find("Deployment", "hami-scheduler")
HAMI = container_of(DEPLOYMENT, "hami-py")
KUBE_SCHEDULER = container_of(DEPLOYMENT, "kube-scheduler")
OPTIONS = options_from_args(build_parser().parse_args(HAMI["args"]))
SCHEDULER_CONFIG = yaml.safe_load(find("ConfigMap", "hami-scheduler")["data"]["config.yaml"])
DEVICE_CONFIG_TEXT = find("ConfigMap", "hami-scheduler-device")["data"]["device-config.yaml"]


# ---------------------------------------------------------------------------------------------
# Kubernetes validity
# ---------------------------------------------------------------------------------------------

def test_kustomization_lists_every_manifest():
    listed = set(yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())["resources"])
    on_disk = {p.name for p in MANIFESTS.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk


@pytest.mark.parametrize("doc", DOCS, ids=[f"{d['kind']}/{d['metadata']['name']}" for d in DOCS])
def test_manifest_is_valid_kubernetes(doc):
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    if doc["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration",
                           "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
        # One exception: the sidecar's binding to a built-in Role of kube-system lives there.
        expected = "kube-system" if (doc["kind"], doc.get("roleRef", {}).get("name")) in KUBE_SYSTEM_BINDINGS \
            else NAMESPACE
        assert doc["metadata"].get("namespace") == expected


def test_offline_validation_catches_mistakes():
    """The shipped schemas are really consulted: a typo and a wrong type both fail."""
    typo = json.loads(json.dumps(DEPLOYMENT))
    typo["spec"]["replica"] = typo["spec"].pop("replicas")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(typo, KUBERNETES_VERSION, strict=True)
    wrong = json.loads(json.dumps(find("MutatingWebhookConfiguration", "hami-webhook")))
    wrong["webhooks"][0]["timeoutSeconds"] = "5s"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong, KUBERNETES_VERSION, strict=True)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_kubectl_kustomize_builds_the_same_objects():
    built = subprocess.run(["kubectl", "kustomize", str(MANIFESTS)], check=True, capture_output=True,
                           text=True, timeout=60).stdout
    key = lambda d: (d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"])  # noqa: E731
    assert sorted(map(key, (d for d in yaml.safe_load_all(built) if d))) == sorted(map(key, DOCS))


# ---------------------------------------------------------------------------------------------
# the pod: flags, ports, mounts, probes, hardening
# ---------------------------------------------------------------------------------------------

def test_hami_flags_are_what_the_cli_accepts_and_expects():
    assert OPTIONS.cert_file and OPTIONS.key_file                   # HTTPS: the webhook needs it
    assert OPTIONS.extender_bind                                      # HAMi's layout after v2.10
    assert not OPTIONS.webhook_bind_address                          # /webhook on the cluster listener
    # /refit's caller: the ServiceAccount HAMi's chart gives its device plugin.
    assert (OPTIONS.device_plugin_namespace, OPTIONS.device_plugin_service_account) == (NAMESPACE,
                                                                                         "hami-device-plugin")
    assert OPTIONS.scheduler_name == "hami-scheduler"
    assert OPTIONS.force_overwrite_default_scheduler is True
    assert OPTIONS.leader_elect is True
    assert OPTIONS.leader_elect_resource_namespace == NAMESPACE
    names = {e["name"] for e in HAMI["env"]}
    assert {"POD_NAME", "POD_NAMESPACE"} <= names                    # role labels, leadership
    assert "command" not in HAMI                                      # the image's entrypoint runs


def test_the_api_budget_places_100_pods_a_second_with_room_for_the_handshakes():
    """README's arithmetic: pods/s x 3 requests per pod (lock, Binding, label), plus one handshake stamp per node every
    30 s (nodes / 30 a second), must fit in --kube-qps; the burst covers two seconds of it."""
    assert OPTIONS.kube_qps > 0                                       # limited, as upstream's client is
    assert pods_per_second_cap(OPTIONS.kube_qps) >= 100
    assert OPTIONS.kube_qps - 100 * REQUESTS_PER_POD >= 6000 / 30   # stamps of 6 000 nodes
    assert OPTIONS.kube_burst >= 2 * OPTIONS.kube_qps
    defaults = options_from_args(build_parser().parse_args([]))
    # Without the flags (HAMi's chart) the budget is the same as the manifests'.
    assert (defaults.kube_qps, defaults.kube_burst) == (OPTIONS.kube_qps, OPTIONS.kube_burst)


def test_server_ports_match_container_ports_and_service():
    # The extender's listener is loopback only: no pod port and no Service port lead to it.
    extender_port = bind_port(OPTIONS.extender_bind)
    assert OPTIONS.extender_bind.rpartition(":")[0] == "127.0.0.1"
    assert extender_port not in {p["containerPort"] for p in HAMI["ports"]}
    # The cluster listener (webhook, refit, probes) takes every address of the pod, on the port
    # the Service targets.
    assert OPTIONS.http_bind.rpartition(":")[0] in ("0.0.0.0", "")
    assert bind_port(OPTIONS.http_bind) == port_of(HAMI, "webhook") != extender_port
    assert bind_port(OPTIONS.metrics_bind_address) == port_of(HAMI, "metrics")
    service = find("Service", "hami-scheduler")
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert ports["webhook"]["targetPort"] == "webhook" and ports["metrics"]["targetPort"] == "metrics"
    assert all(container_port(HAMI, p["targetPort"]) != extender_port for p in service["spec"]["ports"])
    labels = DEPLOYMENT["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert DEPLOYMENT["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_tls_files_come_from_the_certgen_secret():
    volume, cert_name = mount_of(HAMI, OPTIONS.cert_file)
    key_volume, key_name = mount_of(HAMI, OPTIONS.key_file)
    assert volume is key_volume and volume["secret"]["secretName"] == "hami-scheduler-tls"
    args = dict(a.split("=", 1) for a in _certgen("create")["args"][1:])
    assert (args["--secret-name"], args["--namespace"]) == ("hami-scheduler-tls", NAMESPACE)
    assert (args["--cert-name"], args["--key-name"]) == (cert_name, key_name)
    service = find("Service", "hami-scheduler")
    assert f"{service['metadata']['name']}.{NAMESPACE}.svc" in args["--host"].split(",")


def test_device_config_is_mounted_and_is_the_chart_default():
    volume, file_name = mount_of(HAMI, OPTIONS.device_config_file)
    configmap = find("ConfigMap", volume["configMap"]["name"])
    assert file_name in configmap["data"]
    assert parse_device_config(configmap["data"][file_name]) == DeviceConfig.default()


def routes_of(app: web.Application) -> set[tuple[str, str]]:
    return {(r.method, r.resource.canonical) for r in app.router.routes()}


async def _never(_: web.Request) -> web.Response:
    raise AssertionError


EXTENDER_ROUTES = routes_of(build_app(service=None, metrics=Metrics(), ready=lambda: True))
WEBHOOK_ROUTES = routes_of(build_cluster_app([("POST", WEBHOOK_PATH, _never), ("POST", REFIT_PATH, _never)],
                                             ready=lambda: True))


def test_probes_reach_the_webhook_listener_and_routes_it_has():
    """The kubelet probes the pod IP: the loopback extender listener is out of its reach, so the
    probes go to the webhook listener, over HTTPS, on routes that listener serves."""
    for probe in ("livenessProbe", "readinessProbe"):
        get = HAMI[probe]["httpGet"]
        assert ("GET", get["path"]) in WEBHOOK_ROUTES
        assert get["scheme"] == "HTTPS"
        assert container_port(HAMI, get["port"]) == bind_port(OPTIONS.http_bind)
    assert KUBE_SCHEDULER["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"


def test_containers_are_hardened():
    pod = DEPLOYMENT["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    for c in pod["containers"]:
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
        assert c["resources"]["limits"]["memory"]
        assert "livenessProbe" in c
        assert any(m["mountPath"] == "/tmp" for m in c["volumeMounts"])


# ---------------------------------------------------------------------------------------------
# kube-scheduler configuration
# ---------------------------------------------------------------------------------------------

EXTENDER_FIELDS = {"urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight", "bindVerb",
                   "enableHTTPS", "tlsConfig", "httpTimeout", "nodeCacheCapable", "managedResources",
                   "ignorable"}


def test_kube_scheduler_reads_the_mounted_config():
    flag = next(a for a in KUBE_SCHEDULER["command"] if a.startswith("--config="))
    path = flag.split("=", 1)[1]
    mount = next(m for m in KUBE_SCHEDULER["volumeMounts"] if path.startswith(m["mountPath"] + "/"))
    volume = next(v for v in DEPLOYMENT["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == "hami-scheduler"
    assert path[len(mount["mountPath"]) + 1:] in find("ConfigMap", "hami-scheduler")["data"]


def test_scheduler_profile_and_leader_election_match_hami():
    config = SCHEDULER_CONFIG
    assert (config["apiVersion"], config["kind"]) == ("kubescheduler.config.k8s.io/v1", "KubeSchedulerConfiguration")
    assert set(config) <= {"apiVersion", "kind", "leaderElection", "profiles", "extenders"}
    assert [p["schedulerName"] for p in config["profiles"]] == [OPTIONS.scheduler_name]
    election = config["leaderElection"]
    assert election["leaderElect"] is OPTIONS.leader_elect
    assert election["resourceName"] == OPTIONS.leader_elect_resource_name
    assert election["resourceNamespace"] == OPTIONS.leader_elect_resource_namespace == NAMESPACE


def test_extender_points_at_hami_on_loopback():
    [extender] = SCHEDULER_CONFIG["extenders"]
    assert set(extender) <= EXTENDER_FIELDS
    assert extender["urlPrefix"] == f"https://127.0.0.1:{OPTIONS.extender_bind.rpartition(':')[2]}"
    assert extender["enableHTTPS"] is True and set(extender["tlsConfig"]) == {"insecure"}
    for verb in (extender["filterVerb"], extender["bindVerb"]):
        assert ("POST", "/" + verb) in EXTENDER_ROUTES and ("POST", "/" + verb) not in WEBHOOK_ROUTES
    assert extender["nodeCacheCapable"] is True
    # A bind may wait --node-lock-retry-timeout for a node lock; kube-scheduler must wait longer.
    assert OPTIONS.node_lock_retry_timeout_s < _duration(extender["httpTimeout"]) <= 60


def test_managed_resources_are_exactly_the_vendors_resources():
    [extender] = SCHEDULER_CONFIG["extenders"]
    switches = FamilySwitches(enable_ascend=OPTIONS.enable_ascend, enable_iluvatar=OPTIONS.enable_iluvatar)
    vendors = build_vendors(parse_device_config(DEVICE_CONFIG_TEXT), switches)
    assert [r["name"] for r in extender["managedResources"]] == managed_resource_names(vendors)
    assert all(r["ignoredByScheduler"] is True and set(r) == {"name", "ignoredByScheduler"}
               for r in extender["managedResources"])


# ---------------------------------------------------------------------------------------------
# admission webhook
# ---------------------------------------------------------------------------------------------

WEBHOOKS = {h["name"]: h for h in find("MutatingWebhookConfiguration", "hami-webhook")["webhooks"]}
MUTATION, GUARD = WEBHOOKS["vgpu.hami.io"], WEBHOOKS["owned-annotations.vgpu.hami.io"]


def _pod_rules(*operations: str) -> list[dict]:
    return [{"apiGroups": [""], "apiVersions": ["v1"], "operations": list(operations), "resources": ["pods"],
             "scope": "Namespaced"}]


@pytest.mark.parametrize("name", sorted(WEBHOOKS))
def test_webhook_reaches_the_server_route(name):
    hook = WEBHOOKS[name]
    service = find("Service", "hami-scheduler")
    target = hook["clientConfig"]["service"]
    assert (target["name"], target["namespace"]) == (service["metadata"]["name"], NAMESPACE)
    assert target["path"] == WEBHOOK_PATH
    # API server -> Service port -> container port -> the webhook listener's port, which serves
    # the path; the extender's listener does not, once the webhook has its own.
    [port] = [p for p in service["spec"]["ports"] if p["port"] == target["port"]]
    assert container_port(HAMI, port["targetPort"]) == bind_port(OPTIONS.http_bind)
    assert ("POST", WEBHOOK_PATH) in WEBHOOK_ROUTES
    assert set(hook["admissionReviewVersions"]) <= {v.rsplit("/", 1)[1] for v in SUPPORTED_VERSIONS}


def test_webhooks_and_their_operations():
    """The guard first (a forged pod is refused before any mutation is computed), on CREATE and
    UPDATE; the mutation on CREATE only, for every pod it selects (no matchConditions)."""
    assert list(WEBHOOKS) == ["owned-annotations.vgpu.hami.io", "vgpu.hami.io"]
    assert GUARD["rules"] == _pod_rules("CREATE", "UPDATE")
    assert MUTATION["rules"] == _pod_rules("CREATE") and "matchConditions" not in MUTATION
    # The guard's conditions and the keys they name: tests/test_webhook_owned_annotations.py.
    assert [c["name"] for c in GUARD["matchConditions"]] == ["scheduler-owned-annotation-changed"]


@pytest.mark.parametrize("name", sorted(WEBHOOKS))
def test_webhook_failure_handling_is_deliberate(name):
    hook = WEBHOOKS[name]
    assert hook["sideEffects"] == "None"
    assert hook["failurePolicy"] == "Ignore"   # see the comment in manifests/webhook.yaml
    assert 1 <= hook["timeoutSeconds"] <= 10
    # Called again when a later webhook changes the pod; the mutation is idempotent (HAMi #2936;
    # tests/test_webhook_reinvocation.py), and the versions stay both (HAMi #3158).
    assert hook["reinvocationPolicy"] == "IfNeeded"
    assert hook["admissionReviewVersions"] == ["v1", "v1beta1"]


def _selected(selector: dict, labels: dict) -> bool:
    for expr in selector.get("matchExpressions", []):
        value = labels.get(expr["key"])
        if expr["operator"] == "NotIn" and value in expr["values"]:
            return False
        if expr["operator"] == "In" and value not in expr["values"]:
            return False
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


@pytest.mark.parametrize("name", sorted(WEBHOOKS))
def test_webhook_never_sees_system_namespaces_or_the_scheduler_itself(name):
    hook = WEBHOOKS[name]
    for namespace in ("kube-system", "kube-public", "kube-node-lease", NAMESPACE):
        assert not _selected(hook["namespaceSelector"], {"kubernetes.io/metadata.name": namespace})
    assert _selected(hook["namespaceSelector"], {"kubernetes.io/metadata.name": "team-a"})


def test_the_mutation_honours_the_opt_out_label():
    assert not _selected(MUTATION["namespaceSelector"], {"kubernetes.io/metadata.name": "x", "hami.io/webhook": "ignore"})
    # Even if the namespace were selected, the scheduler's and certgen's pods opt out by label.
    for workload in (DEPLOYMENT, find("Job", "hami-scheduler-certgen")):
        assert not _selected(MUTATION["objectSelector"], workload["spec"]["template"]["metadata"]["labels"])
    assert _selected(MUTATION["objectSelector"], {"app": "trainer"})


def _certgen(step: str) -> dict:
    spec = find("Job", "hami-scheduler-certgen")["spec"]["template"]["spec"]
    return next(c for c in spec["initContainers"] + spec["containers"] if c["args"][0] == step)


def test_certgen_creates_the_secret_before_patching_the_webhook():
    spec = find("Job", "hami-scheduler-certgen")["spec"]["template"]["spec"]
    assert [c["args"][0] for c in spec["initContainers"]] == ["create"]
    assert [c["args"][0] for c in spec["containers"]] == ["patch"]
    args = dict(a.split("=", 1) for a in _certgen("patch")["args"][1:])
    assert args["--webhook-name"] == "hami-webhook" and args["--secret-name"] == "hami-scheduler-tls"
    assert args["--patch-validating"] == "false"
    rules = find("ClusterRole", "hami-scheduler-certgen")["rules"]
    assert rules == [{"apiGroups": ["admissionregistration.k8s.io"], "resources": ["mutatingwebhookconfigurations"],
                      "resourceNames": ["hami-webhook"], "verbs": ["get", "update"]}]
    assert spec["serviceAccountName"] == "hami-scheduler-certgen"


# ---------------------------------------------------------------------------------------------
# RBAC: granted == used
# ---------------------------------------------------------------------------------------------

def granted(kind: str, name: str) -> set[tuple[str, str, str]]:
    return {(group, resource, verb) for rule in find(kind, name)["rules"] for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


def rbac_request(method: str, path: str, query: str) -> tuple[str, str, str, str | None]:
    """(API group, resource, verb, namespace) as the API server's authorizer sees a request."""
    parts = path.strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    namespace = None
    if rest[0] == "namespaces" and len(rest) > 2:
        namespace, rest = rest[1], rest[2:]
    resource = rest[0] if len(rest) < 3 else f"{rest[0]}/{rest[2]}"
    named = len(rest) >= 2
    watch = parse_qs(query).get("watch", [""])[0] in ("1", "true")
    verb = {"GET": "watch" if watch else ("get" if named else "list"), "POST": "create", "PATCH": "patch",
            "PUT": "update", "DELETE": "delete"}[method]
    return group, resource, verb, namespace


# Granted for the kube-scheduler sidecar, not hami-py: its own leader election on the Lease.
SIDECAR_LEASE_VERBS = {("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")}


async def refit_once(api, app, name: str, node: str) -> None:
    """The device plugin of ``node`` (the manifests' account) refits pod ``name`` onto another GPU."""
    plugin = api.create("pods", {"apiVersion": "v1", "kind": "Pod",
                                 "metadata": {"name": f"device-plugin-{node}", "namespace": NAMESPACE},
                                 "spec": {"nodeName": node, "containers": [{"name": "plugin", "image": "hami"}]}})
    api.add_token("plugin-token", f"system:serviceaccount:{OPTIONS.device_plugin_namespace}:"
                                  f"{OPTIONS.device_plugin_service_account}", pod=plugin)
    pod = api.get("pods", name)
    held = pod["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"].split(",", 1)[0]
    other = next(u for u in (gpu_uuid(node, 0), gpu_uuid(node, 1)) if u != held)
    body = {"podUID": pod["metadata"]["uid"], "podNamespace": "default", "podName": name, "nodeName": node,
            "containerIndex": 0, "deviceType": "NVIDIA", "allowedDeviceUUIDs": [other]}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{app.cluster_url}/refit", json=body,
                                headers={"Authorization": "Bearer plugin-token"}) as answer:
            assert (answer.status, (await answer.json())["succeeded"]) == (200, True)


async def plugin_answers(app, pod: dict) -> None:
    """The API server's review of the manifests' device plugin writing bind-phase success on ``pod``."""
    answered = json.loads(json.dumps(pod))
    answered["metadata"]["annotations"]["hami.io/bind-phase"] = "success"
    user = f"system:serviceaccount:{OPTIONS.device_plugin_namespace}:{OPTIONS.device_plugin_service_account}"
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
              "request": {"uid": "u-1", "operation": "UPDATE", "object": answered, "oldObject": pod,
                          "userInfo": {"username": user, "groups": ["system:serviceaccounts"]}}}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{app.webhook_url}{WEBHOOK_PATH}", json=review) as answer:
            assert (await answer.json())["response"]["allowed"] is True


async def session_stubs_once(api, tmp_path) -> None:
    """One pass of the leader's remote-GPU session stubs (hami_py/k8s/lupine_sessions.py, run by
    the leader when the remotegpu section names a sessionImage) in the scheduler's namespace: a
    stub created for a server (as the node watch knows it), a stale one deleted."""
    api.create("pods", {"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": "lupine-session-gone", "namespace": NAMESPACE,
                                     "labels": {"hami.io/lupine-session": "gone"}},
                        "spec": {"nodeName": "gone", "containers": [{"name": "relay", "image": "socat"}]}})
    client = KubeClient(await load_configuration(str(write_kubeconfig(tmp_path / "kubeconfig", api.url))), qps=0)
    try:
        done = await reconcile_session_stubs(client=client, namespace=NAMESPACE, image="socat",
                                             servers={"lupine-1": "10.0.0.5:14833"})
    finally:
        await client.close()
    assert (done.created, done.deleted) == (["lupine-session-lupine-1"], ["lupine-session-gone"]), done


async def test_rbac_grants_exactly_what_a_run_uses(api, tmp_path):
    """Run every path that talks to the API (leadership, registration with role labels, quota
    watch, filter, bind with its node lock, events, session stubs) and compare the verbs with
    the grants."""
    api.crds.add("podgroups")     # scheduler-plugins' PodGroup CRD installed: gangs watch PodGroups
    api.create("leases", {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                          "metadata": {"name": "hami-scheduler", "namespace": NAMESPACE},
                          "spec": {"holderIdentity": "sched-0_5f0c3a4e", "leaseDurationSeconds": 3600}})
    api.create("pods", {"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": "sched-0", "namespace": NAMESPACE,
                                     "labels": {"app.kubernetes.io/component": "hami-scheduler"}},
                        "spec": {"containers": [{"name": "hami-py", "image": "hami-py"}]}})
    api.create("nodes", gpu_node("gpu-1", gpus=2))
    options = embedded_options(
        scheduler_name=OPTIONS.scheduler_name, leader_elect=True,
        leader_elect_resource_name=OPTIONS.leader_elect_resource_name,
        leader_elect_resource_namespace=OPTIONS.leader_elect_resource_namespace,
        hostname="sched-0", pod_name="sched-0", pod_namespace=NAMESPACE, registration_interval_s=0.05,
        node_lock_wait_s=0.2, device_preemption=True, device_plugin_namespace=OPTIONS.device_plugin_namespace,
        device_plugin_service_account=OPTIONS.device_plugin_service_account)
    async with running_scheduler(api, options=options, device_plugin=False) as app:
        extender = ExtenderClient(app.url)
        try:
            pod = api.create("pods", gpu_pod("trainer", gpumem=2000))
            placement = await extender.schedule(pod, ["gpu-1"])
            assert (placement.node, placement.error) == ("gpu-1", "")
            # No device plugin releases the lock; another scheduler's lock replaces it (one this
            # process did not write), so a second bind on the node reads it (get nodes) and its
            # owner (get pods) before giving up.
            api.create("pods", gpu_pod("elsewhere", gpumem=2000))
            api.patch("nodes", "gpu-1", {"metadata": {"annotations": {
                LOCK_ANNOTATION: lock_value("default", "elsewhere")}}})
            await wait_for(lambda: (app.cache.lock_hint("gpu-1")[0] or "").endswith(",elsewhere"),
                           what="the lock seen by the watch")
            second = api.create("pods", gpu_pod("trainer-2", gpumem=2000))
            placement = await extender.schedule(second, ["gpu-1"])
            assert placement.error.endswith("node lock contention"), placement
            await wait_for(lambda: api.list("events", namespace="default"), what="an event written")
            # A pod that fits nowhere, filtered twice: the repeat raises the first Event's count.
            big = api.create("pods", gpu_pod("too-big", gpumem=10 ** 7))
            for _ in range(2):
                assert (await extender.filter(big, ["gpu-1"]))["NodeNames"] in (None, [])
            await wait_for(lambda: any(e["count"] == 2 for e in api.list("events", namespace="default")
                                       if e["involvedObject"]["name"] == "too-big"), what="an event's count raised")
            await wait_for(lambda: api.get("pods", "sched-0", namespace=NAMESPACE)["metadata"]["labels"]
                           .get("hami.io/scheduler-role") == "leader", what="role label")
            # NUMA refit: gpu-1's device plugin moves trainer's pending GPU (tokenreviews create; get
            # pods, its own pod and trainer's; patch pods).
            await refit_once(api, app, "trainer", "gpu-1")
            # The webhook's UPDATE rule: may the device plugin, answering on trainer, write Nodes?
            # (subjectaccessreviews create)
            await plugin_answers(app, api.get("pods", "trainer"))
            # Device preemption: a pod of a higher priority that needs both GPUs evicts the bound
            # trainer (pods/eviction) and is nominated to the node (pods/status).
            urgent = gpu_pod("urgent", gpus=2, gpumem=143000)
            urgent["spec"]["priority"] = 1000
            result = await extender.filter(api.create("pods", urgent), ["gpu-1"])
            assert result["FailedNodes"]["gpu-1"].startswith("preempting 1 pods on node gpu-1"), result
        finally:
            await extender.close()
    await session_stubs_once(api, tmp_path)
    used = {rbac_request(*r) for r in api.requests}
    cluster = granted("ClusterRole", "hami-scheduler")
    namespaced = granted("Role", "hami-scheduler")
    for group, resource, verb, namespace in used:
        if (group, resource, verb) in cluster:
            continue
        assert (group, resource, verb) in namespaced and namespace == NAMESPACE, \
            f"hami-py used {verb} {group}/{resource} in {namespace}, which manifests/rbac.yaml does not grant"
    used_verbs = {(g, r, v) for g, r, v, _ in used}
    assert cluster == used_verbs - namespaced, "ClusterRole grants more than hami-py uses"
    assert namespaced == (used_verbs & namespaced) | SIDECAR_LEASE_VERBS, "Role grants more than is used"


def test_every_binding_names_an_existing_account_and_role():
    accounts = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in DOCS if d["kind"] == "ServiceAccount"}
    for doc in DOCS:
        if doc["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        for subject in doc["subjects"]:
            assert (subject["namespace"], subject["name"]) in accounts
        ref = doc["roleRef"]
        if not ref["name"].startswith("system:") and (doc["kind"], ref["name"]) not in KUBE_SYSTEM_BINDINGS:
            # (system:* and kube-system's extension-apiserver-authentication-reader: built-in roles of every cluster)
            role = find(ref["kind"], ref["name"])
            if ref["kind"] == "Role":
                assert role["metadata"]["namespace"] == doc["metadata"]["namespace"]
    assert DEPLOYMENT["spec"]["template"]["spec"]["serviceAccountName"] == "hami-scheduler"


# ---------------------------------------------------------------------------------------------
# image, Makefile, kind scripts
# ---------------------------------------------------------------------------------------------

def test_dockerfile_builds_the_kernel_and_runs_the_cli_as_the_manifest_user():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert len(re.findall(r"^FROM ", dockerfile, re.M)) == 2               # multi-stage
    assert "import hami_py._kernel" in dockerfile                            # the Cython build happened
    assert 'ENTRYPOINT ["hami-scheduler"]' in dockerfile
    assert "hami-scheduler = hami_py.cli:main" in (ROOT / "setup.py").read_text()
    user = re.search(r"^USER (\d+)", dockerfile, re.M).group(1)
    assert int(user) == DEPLOYMENT["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
    ignored = (ROOT / ".dockerignore").read_text().split()
    for source in re.findall(r"^COPY (?!--from)(\S+)", dockerfile, re.M):
        assert f"!{source.rstrip('/')}" in ignored or f"!{source.rstrip('/')}/" in ignored, source


def test_make_targets_run_the_kind_scripts():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^image:.*\n\tdocker build -t \$\(IMAGE\) \.$", makefile, re.M)
    for target, script in (("kind-up", "up.sh"), ("kind-deploy", "deploy.sh"), ("kind-demo", "demo.sh"),
                           ("kind-demo-preemption", "preemption-demo.sh")):
        assert re.search(rf"^{target}:.*\n\thack/kind/{script}$", makefile, re.M), target
    for script in (ROOT / "hack" / "kind").glob("*.sh"):
        if script.name != "env.sh":
            assert script.stat().st_mode & stat.S_IXUSR, f"{script.name} is not executable"
        subprocess.run(["bash", "-n", str(script)], check=True, timeout=30)


def test_fake_gpu_nodes_script_writes_what_the_device_plugin_would(tmp_path):
    log = tmp_path / "kubectl.log"
    stub = tmp_path / "kubectl"
    stub.write_text(f"#!{sys.executable}\nimport json, sys\n"
                    f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n")
    stub.chmod(0o755)
    env = {**os.environ, "KUBECTL": str(stub), "KIND_CLUSTER": "t", "FAKE_GPUS": "3"}
    subprocess.run(["bash", str(ROOT / "hack" / "kind" / "fake-gpu-nodes.sh"), "worker-a"], check=True,
                   env=env, capture_output=True, timeout=60)
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert all(c[:2] == ["--context", "kind-t"] for c in calls)
    annotate = next(c for c in calls if c[2] == "annotate")
    annotations = dict(a.split("=", 1) for a in annotate if a.startswith("hami.io/"))
    devices = NvidiaVendor(nvidia_config(DeviceConfig.default())).parse_node_devices(NodeView.of(annotations))
    assert [(d.index, d.count, d.devmem, d.devcore, d.type, d.health) for d in devices] == \
        [(i, 10, 23028, 100, "NVIDIA A10", True) for i in range(3)]
    assert len({d.id for d in devices}) == 3 and all(re.fullmatch(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", d.id)
                                                    for d in devices)
    assert re.fullmatch(r"Reported \d{4}-\d\d-\d\d \d\d:\d\d:\d\d", annotations["hami.io/node-handshake"])
    patch = next(c for c in calls if c[2] == "patch")
    assert "--subresource=status" in patch
    assert json.loads(patch[-1]) == {"status": {"capacity": {"nvidia.com/gpu": "30"}}}


def test_route_table_includes_the_webhook():
    """The route the MutatingWebhookConfiguration calls is served by the running app: on the
    cluster listener (beside /refit and the probes, and nothing else), or on the extender's
    listener in v2.10's layout."""
    single = build_app(service=None, metrics=Metrics(), ready=lambda: True,
                       extra_routes=[("POST", WEBHOOK_PATH, _never)])
    assert ("POST", WEBHOOK_PATH) in routes_of(single)
    assert WEBHOOK_ROUTES == {("POST", WEBHOOK_PATH), ("POST", REFIT_PATH), ("GET", "/healthz"), ("HEAD", "/healthz"),
                              ("GET", "/readyz"), ("HEAD", "/readyz")}
