"""A real Kubernetes control plane on loopback for the test suite: etcd, kube-apiserver and
kube-scheduler, the released binaries, not stand-ins.

Where the binaries come from, in this order (envtest's convention first):

* ``$KUBEBUILDER_ASSETS``: a folder holding ``etcd``, ``kube-apiserver`` (and ``kube-scheduler``
  for the tests that run it), as ``setup-envtest use -p path`` prints;
* ``../shared/k8s`` beside the repository (``$HAMI_SHARED_K8S`` names another folder): its
  ``unpack`` script checks and unpacks the compressed binaries into a cache folder.

Without either the tests that need them skip with one line saying so; under ``CI=true`` (or
``HAMI_REQUIRE_REAL_K8S=1``) they fail instead, so CI can never pass with them skipped.

What runs, all on 127.0.0.1 and on ports picked free for the session:

* ``etcd`` (single member, no fsync) and ``kube-apiserver`` with RBAC (``--authorization-mode=
  Node,RBAC``), a static token for an admin (group ``system:masters``), service-account tokens
  signed with a key made here (so the TokenRequest API works), a client CA and a front-proxy CA
  as a kubeadm cluster has (published in kube-system/extension-apiserver-authentication), and an
  audit log of every request the ``hami-scheduler`` ServiceAccount makes (``--audit-policy-file``):
  the RBAC tests read it.
* ``kube-scheduler`` (``KubeSchedulerProcess``) with a KubeSchedulerConfiguration of the test's.

Differences from a full cluster, and what stands in (see ../shared/k8s/README.md): there is no
controller-manager (nothing creates a namespace's ``default`` ServiceAccount, so
``ControlPlane.ensure_namespace()`` does; nothing removes the ``node.kubernetes.io/not-ready`` taint the TaintNodesByCondition
admission plugin puts on a new Node, so that plugin is disabled: every Node here is as a
Ready node would be), no kubelet (a bound pod stays Pending; a pod is deleted with grace period
0, as the kubelet would confirm a stopped pod's deletion; the device plugin's half of a bind is
done by ``hami_py.fakeapi.deviceplugin.SimulatedDevicePlugin`` over the API).

Every process is stopped by its PID when the session ends, and dies with the test process if
that is killed (``PR_SET_PDEATHSIG``).
"""
from __future__ import annotations

import asyncio
import ctypes
import functools
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import structlog
import yaml

log = structlog.get_logger(__name__)

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = ROOT / "manifests"
CONTROL_PLANE = ("etcd", "kube-apiserver")
KUBE_SCHEDULER = "kube-scheduler"
SA_NAMESPACE = "hami-system"
SA_NAME = "hami-scheduler"
SA_USER = f"system:serviceaccount:{SA_NAMESPACE}:{SA_NAME}"
ADMIN_TOKEN = "hami-test-admin"   # a throwaway control plane's own static token, nothing else's

HOW_TO_PROVIDE = ("set KUBEBUILDER_ASSETS to a folder with etcd, kube-apiserver and kube-scheduler "
                  "(envtest's layout), or put ../shared/k8s (with its unpack script) beside the repository")


class BinariesMissing(Exception):
    """The real control plane's binaries cannot be found; the message says how to provide them."""


def shared_k8s() -> Path:
    """``../shared/k8s`` relative to the repository, unless ``$HAMI_SHARED_K8S`` names another."""
    override = os.environ.get("HAMI_SHARED_K8S")
    return Path(override) if override else ROOT.parent / "shared" / "k8s"


def required() -> bool:
    """Must the real control-plane tests run (CI), rather than skip when the binaries are missing?"""
    return any(os.environ.get(name, "").strip().lower() in ("1", "true", "yes")
               for name in ("CI", "HAMI_REQUIRE_REAL_K8S"))


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


@functools.lru_cache(maxsize=None)
def _unpacked(folder: str) -> Path | None:
    """Run ``<folder>/unpack`` once per process; the folder it prints."""
    script = Path(folder) / "unpack"
    if not script.is_file():
        return None
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise BinariesMissing(f"{script.name} in ../shared/k8s failed: {done.stderr.strip() or done.returncode}")
    lines = done.stdout.strip().splitlines()
    return Path(lines[-1]) if lines else None


def find_binaries(names: tuple[str, ...] = CONTROL_PLANE) -> dict[str, Path]:
    """name -> path of each binary, from $KUBEBUILDER_ASSETS, else ../shared/k8s; BinariesMissing."""
    found: dict[str, Path] = {}
    assets = os.environ.get("KUBEBUILDER_ASSETS", "")
    if assets:
        for name in names:
            if _executable(Path(assets) / name):
                found[name] = Path(assets) / name
    missing = [n for n in names if n not in found]
    if missing:
        folder = _unpacked(str(shared_k8s()))
        if folder is not None:
            for name in missing:
                if _executable(folder / name):
                    found[name] = folder / name
    missing = [n for n in names if n not in found]
    if missing:
        raise BinariesMissing(f"real Kubernetes binaries not found ({', '.join(missing)}): {HOW_TO_PROVIDE}")
    return found


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


try:    # resolved here, in the parent: the child, between fork and exec, only calls it
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None
except (OSError, AttributeError):
    _PRCTL = None


def _die_with_parent() -> None:   # pragma: no cover - runs in the child between fork and exec
    """Linux: the child gets SIGKILL when the test process dies, however it dies."""
    _PRCTL(1, signal.SIGKILL)   # PR_SET_PDEATHSIG


class Process:
    """One control-plane binary, its output in ``log_path``; stopped by its PID."""

    def __init__(self, name: str, argv: list[str], log_path: Path, *, cwd: Path):
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.cwd = cwd
        self.popen: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def start(self) -> None:
        with open(self.log_path, "ab") as out:
            self.popen = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          cwd=self.cwd, preexec_fn=_die_with_parent if _PRCTL is not None else None)
        log.info("started", process=self.name, pid=self.popen.pid)

    def stop(self) -> None:
        """SIGKILL by its PID, and reaped. (Everything here is thrown away afterwards, and
        kube-apiserver's graceful shutdown waits a minute for open watches.)"""
        if self.popen is None:
            return
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGKILL)
            self.popen.wait(30)
        log.info("stopped", process=self.name, pid=self.popen.pid, returncode=self.popen.returncode)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def poll_until(predicate, *, timeout: float, what: str, process: Process | None = None,
               interval: float = 0.05) -> None:
    """Synchronous poll with a deadline, for start-ups (called from a test's event loop, it holds
    that loop up meanwhile); a process that exits meanwhile ends the wait at once with its log tail."""
    deadline = time.monotonic() + timeout
    while True:
        if process is not None and not process.alive:
            raise RuntimeError(f"{process.name} exited ({process.popen.returncode}) waiting for {what}:\n"
                               f"{process.log_tail()}")
        try:
            if predicate():
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            tail = f":\n{process.log_tail()}" if process is not None else ""
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}{tail}")
        time.sleep(interval)


# -- resources, paths -------------------------------------------------------------------------

# plural -> (group/version, namespaced)
RESOURCES = {
    "pods": ("v1", True), "nodes": ("v1", False), "events": ("v1", True), "namespaces": ("v1", False),
    "resourcequotas": ("v1", True), "serviceaccounts": ("v1", True), "configmaps": ("v1", True),
    "leases": ("coordination.k8s.io/v1", True),
    "clusterroles": ("rbac.authorization.k8s.io/v1", False),
    "clusterrolebindings": ("rbac.authorization.k8s.io/v1", False),
    "roles": ("rbac.authorization.k8s.io/v1", True),
    "rolebindings": ("rbac.authorization.k8s.io/v1", True),
    "mutatingwebhookconfigurations": ("admissionregistration.k8s.io/v1", False),
    "priorityclasses": ("scheduling.k8s.io/v1", False),
    "poddisruptionbudgets": ("policy/v1", True),
}
KINDS = {"Pod": "pods", "Node": "nodes", "Namespace": "namespaces", "ResourceQuota": "resourcequotas",
         "ServiceAccount": "serviceaccounts", "ConfigMap": "configmaps", "Lease": "leases",
         "ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings", "Role": "roles",
         "RoleBinding": "rolebindings", "MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
         "PriorityClass": "priorityclasses", "PodDisruptionBudget": "poddisruptionbudgets"}


def resource_path(resource: str, name: str | None = None, *, namespace: str | None = None) -> str:
    group_version, namespaced = RESOURCES[resource]
    base = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    if namespaced and namespace:
        base += f"/namespaces/{namespace}"
    base += f"/{resource}"
    return f"{base}/{name}" if name else base


def manifest_docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((MANIFESTS / name).read_text()) if d]


# -- the control plane ------------------------------------------------------------------------

AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata", "users": [SA_USER]}, {"level": "None"}],
}


@dataclass
class AuditEntry:
    verb: str
    group: str
    resource: str            # with the subresource: pods/binding
    namespace: str
    name: str
    code: int
    user_agent: str
    uri: str


class ControlPlane:
    """etcd + kube-apiserver in ``workdir``: ``start()``, ``start_apiserver()`` (again, after
    ``apiserver.stop()``: same port, etcd and certificates), ``stop()``."""

    started: list["ControlPlane"] = []    # every plane of this session (their audit logs are checked)

    def __init__(self, workdir: Path, binaries: dict[str, Path], *, apiserver_flags: tuple[str, ...] = ()):
        self.workdir = Path(workdir)
        self.binaries = binaries
        self.apiserver_flags = apiserver_flags
        self.etcd_port = free_port()
        self.etcd_peer_port = free_port()
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.ca_file = self.workdir / "certs" / "apiserver.crt"   # self-signed by the apiserver at start
        self.audit_log = self.workdir / "audit.log"
        self.etcd: Process | None = None
        self.apiserver: Process | None = None
        self._ssl: ssl.SSLContext | None = None
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))   # loopback: never a proxy

    # lifecycle

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._write_files()
        ControlPlane.started.append(self)
        self.etcd = Process("etcd", [
            str(self.binaries["etcd"]), "--name", "hami-test", "--data-dir", str(self.workdir / "etcd-data"),
            "--listen-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{self.etcd_peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.etcd_peer_port}",
            "--unsafe-no-fsync", "--log-level", "warn"], self.workdir / "etcd.log", cwd=self.workdir)
        try:
            self.etcd.start()
            poll_until(self._etcd_healthy, timeout=30, what="etcd /health", process=self.etcd)
            self.start_apiserver()
        except BaseException:
            self.stop()
            raise

    def _write_files(self) -> None:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        (self.workdir / "sa.key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()))
        (self.workdir / "sa.pub").write_bytes(key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
        (self.workdir / "tokens.csv").write_text(f"{ADMIN_TOKEN},admin,admin-uid,system:masters\n")
        # A client CA and a front-proxy CA, as a kubeadm cluster has: the API server publishes
        # both in the ConfigMap kube-system/extension-apiserver-authentication, which delegating
        # components (kube-scheduler's secure port) read. No certificate is ever issued from them.
        import trustme
        trustme.CA().cert_pem.write_to_path(str(self.workdir / "client-ca.crt"))
        trustme.CA().cert_pem.write_to_path(str(self.workdir / "front-proxy-ca.crt"))
        (self.workdir / "audit-policy.yaml").write_text(yaml.safe_dump(AUDIT_POLICY))

    def apiserver_argv(self) -> list[str]:
        w = self.workdir
        return [
            str(self.binaries["kube-apiserver"]),
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            "--bind-address=127.0.0.1", f"--secure-port={self.port}", "--advertise-address=127.0.0.1",
            f"--cert-dir={w / 'certs'}", "--service-cluster-ip-range=10.96.0.0/16",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={w / 'sa.pub'}", f"--service-account-signing-key-file={w / 'sa.key'}",
            f"--token-auth-file={w / 'tokens.csv'}", f"--client-ca-file={w / 'client-ca.crt'}",
            f"--requestheader-client-ca-file={w / 'front-proxy-ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client", "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group", "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            "--authorization-mode=Node,RBAC",
            # No node lifecycle controller would ever lift the not-ready taint this plugin adds.
            "--disable-admission-plugins=TaintNodesByCondition",
            f"--audit-policy-file={w / 'audit-policy.yaml'}", f"--audit-log-path={self.audit_log}",
            "--audit-log-maxsize=0", "--audit-log-mode=blocking",
            "--profiling=false", "--v=1",
            *self.apiserver_flags,
        ]

    def start_apiserver(self) -> None:
        self.apiserver = Process("kube-apiserver", self.apiserver_argv(), self.workdir / "kube-apiserver.log",
                                 cwd=self.workdir)
        self.apiserver.start()
        poll_until(lambda: self.ca_file.exists(), timeout=60, what="the apiserver's serving certificate",
                   process=self.apiserver)
        self._ssl = None
        poll_until(self._apiserver_ready, timeout=60, what="kube-apiserver /readyz", process=self.apiserver)

    def stop(self) -> None:
        for process in (self.apiserver, self.etcd):
            if process is not None:
                process.stop()

    # HTTP, synchronous (set-up and checks outside the tests' event loops)

    def _etcd_healthy(self) -> bool:
        with self._opener.open(f"http://127.0.0.1:{self.etcd_port}/health", timeout=2) as r:
            return json.loads(r.read()).get("health") == "true"

    def _apiserver_ready(self) -> bool:
        status, body = self.call("GET", "/readyz", raw=True, timeout=2)
        return status == 200 and body == b"ok"

    def ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context(cafile=str(self.ca_file))
        return self._ssl

    def call(self, method: str, path: str, body=None, *, token: str = ADMIN_TOKEN,
             content_type: str = "application/json", raw: bool = False, timeout: float = 30):
        """(status, decoded JSON body) of one request; ``raw``: the body's bytes."""
        data = None if body is None else (body if isinstance(body, bytes) else orjson.dumps(body))
        request = urllib.request.Request(self.url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {token}", "Content-Type": content_type, "Accept": "application/json"})
        handler = urllib.request.HTTPSHandler(context=self.ssl_context())
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), handler)
        try:
            with opener.open(request, timeout=timeout) as r:
                status, payload = r.status, r.read()
        except urllib.error.HTTPError as exc:
            status, payload = exc.code, exc.read()
        if raw:
            return status, payload
        return status, (orjson.loads(payload) if payload else {})

    def must(self, method: str, path: str, body=None, **kw) -> dict:
        status, answer = self.call(method, path, body, **kw)
        if not 200 <= status < 300:
            raise RuntimeError(f"{method} {path}: HTTP {status}: {answer}")
        return answer

    def apply(self, doc: dict) -> dict:
        """Server-side apply of one object, as ``kubectl apply --server-side --force-conflicts``."""
        meta = doc["metadata"]
        path = resource_path(KINDS[doc["kind"]], meta["name"], namespace=meta.get("namespace"))
        return self.must("PATCH", path + "?fieldManager=hami-tests&force=true", doc,
                         content_type="application/apply-patch+yaml")

    def aggregate_cluster_role(self, name: str) -> None:
        """What kube-controller-manager's ClusterRole aggregation controller would do (it does not
        run here): the built-in ``name`` (``edit``, ``admin``, ``view``) gets the rules of every
        ClusterRole its aggregationRule selects; until then it grants nothing."""
        role = self.must("GET", resource_path("clusterroles", name))
        rules = []
        for selector in (role.get("aggregationRule") or {}).get("clusterRoleSelectors") or ():
            query = ",".join(f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items())
            for item in self.must("GET", resource_path("clusterroles") + f"?labelSelector={query}")["items"]:
                rules += [rule for rule in item.get("rules") or () if rule not in rules]
        self.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
                    "rules": rules})

    def ensure_namespace(self, name: str, labels: dict | None = None) -> None:
        """The namespace and its ``default`` ServiceAccount (no controller-manager makes it)."""
        self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}})
        self.apply({"apiVersion": "v1", "kind": "ServiceAccount",
                    "metadata": {"name": "default", "namespace": name}})

    def prepare(self) -> "ControlPlane":
        """Apply manifests/namespace.yaml and manifests/rbac.yaml, mint the ServiceAccount's token
        (TokenRequest), and write two kubeconfigs: ``sa_kubeconfig`` (hami-scheduler's identity,
        token in ``sa_token``) and ``admin_kubeconfig`` (the tests', and the device plugin
        stand-in's)."""
        for doc in manifest_docs("namespace.yaml") + manifest_docs("rbac.yaml"):
            self.apply(doc)
        self.ensure_namespace(SA_NAMESPACE, labels={"hami.io/webhook": "ignore"})
        self.sa_token = self.token()
        self.sa_kubeconfig = self.write_kubeconfig(self.workdir / "hami-scheduler.kubeconfig", self.sa_token,
                                                   user=SA_USER)
        self.admin_kubeconfig = self.write_kubeconfig(self.workdir / "admin.kubeconfig", ADMIN_TOKEN, user="admin")
        return self

    def token(self, namespace: str = SA_NAMESPACE, name: str = SA_NAME, *, seconds: int = 7200) -> str:
        """A ServiceAccount token from the TokenRequest API (what ``kubectl create token`` does)."""
        answer = self.must("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
                           {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                            "spec": {"expirationSeconds": seconds}})
        return answer["status"]["token"]

    def write_kubeconfig(self, path: Path, token: str, *, user: str = "user", server: str | None = None) -> Path:
        """A kubeconfig for ``token``; ``server`` another address of this API server (a relay)."""
        config = {
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "real", "cluster": {"server": server or self.url,
                                                      "certificate-authority": str(self.ca_file)}}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "real", "context": {"cluster": "real", "user": user}}],
            "current-context": "real", "preferences": {},
        }
        Path(path).write_text(yaml.safe_dump(config, sort_keys=False))
        return Path(path)

    # audit log

    def audit_size(self) -> int:
        return self.audit_log.stat().st_size if self.audit_log.exists() else 0

    def audit_entries(self, since: int = 0) -> list[AuditEntry]:
        """The ServiceAccount's requests logged from byte offset ``since`` on (complete lines)."""
        if not self.audit_log.exists():
            return []
        with open(self.audit_log, "rb") as f:
            f.seek(since)
            data = f.read()
        entries = []
        for line in data.splitlines():
            if not line.strip():
                continue
            try:
                event = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue   # a line being written right now
            if (event.get("user") or {}).get("username") != SA_USER:
                continue
            ref = event.get("objectRef") or {}
            resource = ref.get("resource", "")
            if ref.get("subresource"):
                resource += "/" + ref["subresource"]
            entries.append(AuditEntry(verb=event.get("verb", ""), group=ref.get("apiGroup", ""), resource=resource,
                                      namespace=ref.get("namespace", ""), name=ref.get("name", ""),
                                      code=int((event.get("responseStatus") or {}).get("code") or 0),
                                      user_agent=event.get("userAgent", ""), uri=event.get("requestURI", "")))
        return entries


def forbidden(entries: list[AuditEntry]) -> list[str]:
    return [f"{e.verb} {e.group or 'core'}/{e.resource} {e.namespace}/{e.name} ({e.user_agent}): {e.code}"
            for e in entries if e.code == 403]


# -- kube-scheduler ---------------------------------------------------------------------------

FORBIDDEN_LINE = re.compile(r"forbidden", re.IGNORECASE)


class KubeSchedulerProcess:
    """kube-scheduler with ``config`` (a KubeSchedulerConfiguration dict) and ``args`` besides."""

    def __init__(self, binary: Path, workdir: Path, config: dict, args: list[str]):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = self.workdir / "config.yaml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.secure_port = free_port()
        self.process = Process(KUBE_SCHEDULER, [str(binary), *[a.replace("{config}", str(self.config_path))
                                                                for a in args],
                                                "--bind-address=127.0.0.1", f"--secure-port={self.secure_port}"],
                               self.workdir / "kube-scheduler.log", cwd=self.workdir)

    def start(self, *, timeout: float = 60) -> None:
        self.process.start()
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE    # its own self-signed serving certificate
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                             urllib.request.HTTPSHandler(context=context))

        def ready() -> bool:
            try:
                with opener.open(f"https://127.0.0.1:{self.secure_port}/readyz", timeout=2) as r:
                    return r.read() == b"ok"
            except urllib.error.HTTPError:
                return False

        try:
            poll_until(ready, timeout=timeout, what="kube-scheduler /readyz", process=self.process)
        except BaseException:
            self.process.stop()
            raise

    def stop(self) -> None:
        self.process.stop()

    def log_text(self) -> str:
        return self.process.log_text()

    def forbidden_lines(self) -> list[str]:
        return [line for line in self.log_text().splitlines() if FORBIDDEN_LINE.search(line)]


def sidecar_config(*, extender_url: str, kubeconfig: Path, config: dict | None = None) -> dict:
    """manifests/scheduler-config.yaml's KubeSchedulerConfiguration (or ``config``, another
    build's: an overlay's) with what cannot work on a loopback test machine changed, and nothing else:

    * the extender's ``urlPrefix``: hami-py listens on a free port here, not the pod's 9444
      (still HTTPS, still ``tlsConfig.insecure``);
    * ``clientConnection.kubeconfig``: in the pod, kube-scheduler uses the in-cluster
      configuration (the ServiceAccount's token); here a kubeconfig carries that token.
    Leader election stays on, on the same Lease."""
    if config is None:
        configmap = next(d for d in manifest_docs("scheduler-config.yaml") if d["kind"] == "ConfigMap")
        config = yaml.safe_load(configmap["data"]["config.yaml"])
    assert len(config["extenders"]) == 1
    config["extenders"][0]["urlPrefix"] = extender_url
    config.setdefault("clientConnection", {})["kubeconfig"] = str(kubeconfig)
    return config


def sidecar_args(*, kubeconfig: Path) -> list[str]:
    """The sidecar's command line from manifests/deployment.yaml, plus what the pod's in-cluster
    configuration gives it implicitly: its delegated authentication and authorization (of
    requests to its own /metrics and /healthz) use the ServiceAccount, here through the same
    kubeconfig. That delegation is what reads the ConfigMap extension-apiserver-authentication
    in kube-system. ``{config}`` stands for the config file's path. Serving moves to 127.0.0.1
    and a free port (``KubeSchedulerProcess``)."""
    deployment = next(d for d in manifest_docs("deployment.yaml") if d["kind"] == "Deployment")
    container = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == KUBE_SCHEDULER)
    command = list(container["command"])
    assert command[0] == KUBE_SCHEDULER
    args = ["--config={config}" if a.startswith("--config=") else a for a in command[1:]]
    assert "--config={config}" in args, command
    return [*args, f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}"]


# -- the API, from a test's event loop --------------------------------------------------------

class RealKube:
    """Admin access to the real API server over hami-py's own KubeClient (kubernetes-asyncio)."""

    def __init__(self, client):
        self.client = client

    @classmethod
    async def connect(cls, kubeconfig: Path) -> "RealKube":
        from hami_py.k8s.client import KubeClient, load_configuration
        return cls(KubeClient(await load_configuration(str(kubeconfig)), qps=0, burst=1000))

    async def close(self) -> None:
        await self.client.close()

    async def create(self, resource: str, obj: dict, *, namespace: str | None = None) -> dict:
        ns = namespace or (obj.get("metadata") or {}).get("namespace")
        return await self.client.post(resource_path(resource, namespace=ns), obj)

    async def get(self, resource: str, name: str, *, namespace: str | None = None) -> dict | None:
        from hami_py.k8s.client import KubeApiError
        try:
            return await self.client.get(resource_path(resource, name, namespace=namespace))
        except KubeApiError as exc:
            if exc.not_found:
                return None
            raise

    async def patch(self, resource: str, name: str, body: dict, *, namespace: str | None = None,
                    subresource: str = "") -> dict:
        path = resource_path(resource, name, namespace=namespace) + (f"/{subresource}" if subresource else "")
        return await self.client.patch(path, body)

    async def delete(self, resource: str, name: str, *, namespace: str | None = None, grace: int | None = 0,
                     missing_ok: bool = True) -> None:
        from hami_py.k8s.client import KubeApiError
        query = [("gracePeriodSeconds", str(grace))] if grace is not None else None
        try:
            await self.client.request("DELETE", resource_path(resource, name, namespace=namespace), query=query)
        except KubeApiError as exc:
            if not (missing_ok and exc.not_found):
                raise

    async def list(self, resource: str, *, namespace: str | None = None, label_selector: str = "",
                   field_selector: str = "") -> list[dict]:
        query = [(k, v) for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v]
        answer = await self.client.get(resource_path(resource, namespace=namespace), query=query or None)
        return answer.get("items") or []

    async def events_for(self, pod: dict) -> list[tuple[str, str, str, str]]:
        """(source component, type, reason, message) of every Event about this pod (by UID)."""
        meta = pod["metadata"]
        items = await self.list("events", namespace=meta["namespace"],
                                field_selector=f"involvedObject.uid={meta['uid']}")
        return [((e.get("source") or {}).get("component") or e.get("reportingComponent") or "",
                 e.get("type", ""), e.get("reason", ""), e.get("message", "")) for e in items]


async def budget_allowing_no_disruption(kube: RealKube, namespace: str, name: str, *, app: str) -> None:
    """A PodDisruptionBudget over the pods labelled ``app`` that allows no disruption, with the
    status kube-controller-manager's disruption controller would write (it does not run here)."""
    await kube.create("poddisruptionbudgets", {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name, "namespace": namespace},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": app}}}})
    await kube.patch("poddisruptionbudgets", name, {"status": {
        "observedGeneration": 1, "disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1,
        "expectedPods": 1}}, namespace=namespace, subresource="status")


async def wait_for_value(fetch, check, *, timeout: float = 20.0, what: str, interval: float = 0.05):
    """Await ``fetch()`` until ``check(value)`` holds; that value. TimeoutError with the last one."""
    deadline = time.monotonic() + timeout
    while True:
        value = await fetch()
        if check(value):
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}; last seen: {value!r}"[:4000])
        await asyncio.sleep(interval)


# -- objects ----------------------------------------------------------------------------------

def real_node(name: str, *, labels: dict | None = None, **kw) -> dict:
    """A GPU node as HAMi's device plugin registers it (hami_py.fakeapi.objects.gpu_node), with
    what a kubelet would also report: a pod capacity (kube-scheduler counts pods against it)."""
    from hami_py.fakeapi.objects import gpu_node
    node = gpu_node(name, labels=labels, **kw)
    for key in ("capacity", "allocatable"):
        node["status"][key]["pods"] = "110"
    return node


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def dns_name(text: str, limit: int = 40) -> str:
    """A test's name as a DNS label (namespace and node names)."""
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return label[:limit].rstrip("-") or "t"


# -- a TCP proxy to cut the scheduler off the API server --------------------------------------

class Partition:
    """A loopback TCP relay in front of the API server: ``cut()`` drops every connection through
    it and refuses new ones (the scheduler loses its watches and cannot reconnect) while the
    test, talking to the API server directly, changes the cluster; ``heal()`` lets it back."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.port = 0
        self.open = True
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        self.connections = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.open:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self.connections += 1
        self._conns.update((writer, up_writer))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(1 << 16):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.transport.abort()

        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        finally:
            self._conns.difference_update((writer, up_writer))

    def cut(self) -> None:
        self.open = False
        for w in list(self._conns):
            w.transport.abort()

    def heal(self) -> None:
        self.open = True

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


@dataclass
class Snapshot:
    """The API server's nodes and pods at one moment, in the shape tests/reliability_helpers.py
    reads (``.list(resource)``), so its recount from annotations works against the real server."""
    items: dict[str, list[dict]] = field(default_factory=dict)

    @classmethod
    async def take(cls, kube: RealKube) -> "Snapshot":
        return cls({"nodes": await kube.list("nodes"), "pods": await kube.list("pods")})

    def list(self, resource: str, namespace: str | None = None) -> list[dict]:
        items = self.items[resource]
        return [i for i in items if namespace is None or i["metadata"].get("namespace") == namespace]


async def wait_books_balance(kube: RealKube, app, *, timeout: float = 20.0) -> None:
    """The cache equals the recount from the real API server's annotations (polled with a
    deadline: the watch may still be delivering), nothing is oversubscribed, and the cache agrees
    with its own pod records."""
    from tests.conftest import assert_books_balance
    from tests.reliability_helpers import books_mismatch, explain_mismatch, oversubscribed
    deadline = time.monotonic() + timeout
    while True:
        snap = await Snapshot.take(kube)
        problems = books_mismatch(snap, app)
        if not problems:
            break
        if time.monotonic() > deadline:
            raise AssertionError("usage books do not balance with the real API server after %.0fs:\n  %s\n%s" % (
                timeout, "\n  ".join(problems), explain_mismatch(snap, app)))
        await asyncio.sleep(0.05)
    over = oversubscribed(snap, app)
    assert not over, "oversubscribed:\n  " + "\n  ".join(over)
    assert_books_balance(app)


# -- hami-scheduler against it ----------------------------------------------------------------

@asynccontextmanager
async def real_scheduler(*, kubeconfig: Path, plugin_kubeconfig: Path | None, options=None,
                         device_config=None, wait_ready: bool = True):
    """hami_py.app.SchedulerApp in-process with ``kubeconfig`` (the ServiceAccount's), and the
    device plugin stand-in with ``plugin_kubeconfig`` (None: no stand-in)."""
    from hami_py.embedded import embedded_options, scheduler_with_kubeconfig

    async with scheduler_with_kubeconfig(
            str(kubeconfig), plugin_kubeconfig=str(plugin_kubeconfig) if plugin_kubeconfig is not None else None,
            options=options or embedded_options(scheduler_name="hami-scheduler"), device_config=device_config,
            wait_ready=wait_ready) as app:
        yield app
