"""overlays/kube-scheduler-in-the-loop/ against Kubernetes, the base manifests and the code.

The overlay is built twice: here, in Python, by applying its two patches to the base's objects
(so the checks run offline, without kubectl), and by ``kubectl kustomize`` when kubectl is
installed; both builds must agree. The built objects are valid Kubernetes 1.32 (strict), hami-py's
arguments parse with --filter-mode=all and --device-preemption, kube-scheduler's configuration is
the base's with exactly ``prioritizeVerb`` and ``preemptVerb`` added, naming routes the extender
serves.
"""
from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from hami_py.cli import build_parser, options_from_args
from tests.test_manifests import EXTENDER_FIELDS, EXTENDER_ROUTES, KUBERNETES_VERSION, load_manifests

ROOT = Path(__file__).resolve().parent.parent
OVERLAY = ROOT / "overlays" / "kube-scheduler-in-the-loop"
KUSTOMIZATION = yaml.safe_load((OVERLAY / "kustomization.yaml").read_text())


def _key(doc: dict) -> tuple[str, str, str]:
    return doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"]


def _pointer(doc, path: str):
    """(parent container, last key) of a JSON pointer (RFC 6901) inside ``doc``."""
    parts = [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")]
    node = doc
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node, parts[-1]


def _json_patch(doc: dict, ops: list[dict]) -> None:
    """The operations the overlay uses (test, add, replace), as kustomize applies them."""
    for op in ops:
        parent, last = _pointer(doc, op["path"])
        if op["op"] == "test":
            got = parent[int(last)] if isinstance(parent, list) else parent[last]
            assert got == op["value"], f"test {op['path']}: {got!r} != {op['value']!r}"
        elif op["op"] in ("add", "replace") and isinstance(parent, list):
            if last == "-":
                parent.append(op["value"])
            elif op["op"] == "add":
                parent.insert(int(last), op["value"])
            else:
                parent[int(last)] = op["value"]
        elif op["op"] in ("add", "replace"):
            parent[last] = op["value"]
        else:
            raise AssertionError(f"unsupported patch op {op['op']}")


def build_overlay() -> list[dict]:
    """What `kubectl kustomize overlays/kube-scheduler-in-the-loop` builds, computed here."""
    base, *own = KUSTOMIZATION["resources"]
    assert base == "../../manifests"
    docs = {_key(d): d for d in copy.deepcopy(load_manifests())}
    for name in own:        # objects of the overlay's own (files beside its kustomization)
        docs.update((_key(d), d) for d in yaml.safe_load_all((OVERLAY / name).read_text()) if d)
    for patch in KUSTOMIZATION["patches"]:
        if "path" in patch:
            # A strategic merge of a ConfigMap: its data keys replaced.
            [change] = [d for d in yaml.safe_load_all((OVERLAY / patch["path"]).read_text()) if d]
            target = docs[_key(change)]
            assert set(change) <= {"apiVersion", "kind", "metadata", "data"}
            target["data"].update(change["data"])
        else:
            t = patch["target"]
            target = next(d for d in docs.values() if d["kind"] == t["kind"] and d["metadata"]["name"] == t["name"])
            _json_patch(target, yaml.safe_load(patch["patch"]))
    return list(docs.values())


BUILT = build_overlay()
BASE = {_key(d): d for d in load_manifests()}


def find(kind: str, name: str, docs=BUILT) -> dict:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def hami_args(docs=BUILT) -> list[str]:
    deployment = find("Deployment", "hami-scheduler", docs)
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "hami-py")["args"]


def scheduler_config(docs=BUILT) -> dict:
    return yaml.safe_load(find("ConfigMap", "hami-scheduler", docs)["data"]["config.yaml"])


def test_the_overlay_changes_only_the_scheduler_config_and_hamis_arguments():
    """Of the base's objects only these two change (the overlay may add objects of its own)."""
    changed = {_key(d) for d in BUILT if _key(d) in BASE and d != BASE[_key(d)]}
    assert changed == {("ConfigMap", "hami-system", "hami-scheduler"), ("Deployment", "hami-system", "hami-scheduler")}
    assert set(BASE) <= {_key(d) for d in BUILT}


@pytest.mark.parametrize("key", sorted({_key(d) for d in BUILT}), ids=lambda k: f"{k[0]}/{k[2]}")
def test_built_objects_are_valid_kubernetes(key):
    kubernetes_validate.validate(next(d for d in BUILT if _key(d) == key), KUBERNETES_VERSION, strict=True)


def test_hami_runs_in_all_mode_with_device_preemption_and_every_base_flag():
    base = hami_args([*BASE.values()])
    assert hami_args()[:len(base)] == base                     # appended to, never rewritten
    assert hami_args()[len(base):] == ["--filter-mode=all", "--device-preemption"]
    options = options_from_args(build_parser().parse_args(hami_args()))
    assert options.filter_mode == "all" and options.device_preemption


def test_kube_scheduler_asks_hami_to_prioritize_and_preempt_and_nothing_else_changes():
    base = yaml.safe_load(BASE[("ConfigMap", "hami-system", "hami-scheduler")]["data"]["config.yaml"])
    built = scheduler_config()
    [extender] = built["extenders"]
    assert set(extender) <= EXTENDER_FIELDS
    assert (extender["prioritizeVerb"], extender["preemptVerb"]) == ("prioritize", "preempt")
    assert {("POST", "/prioritize"), ("POST", "/preempt")} <= EXTENDER_ROUTES
    assert isinstance(extender["weight"], int) and extender["weight"] >= 1
    assert set(extender) - set(base["extenders"][0]) == {"prioritizeVerb", "preemptVerb"}
    expected = copy.deepcopy(base)
    expected["extenders"][0].update({k: extender[k] for k in ("prioritizeVerb", "preemptVerb") if k in extender})
    assert built == expected, ("the overlay's scheduler-config.yaml drifted from manifests/scheduler-config.yaml: "
                               "run hack/sync-in-the-loop-overlay.py")


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_kubectl_kustomize_builds_what_the_offline_build_does():
    out = subprocess.run(["kubectl", "kustomize", str(OVERLAY)], check=True, capture_output=True,
                         text=True, timeout=60).stdout
    built = {_key(d): d for d in yaml.safe_load_all(out) if d}
    assert set(built) == {_key(d) for d in BUILT}
    assert scheduler_config(list(built.values())) == scheduler_config()
    assert hami_args(list(built.values())) == hami_args()
