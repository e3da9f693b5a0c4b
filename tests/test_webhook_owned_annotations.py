"""Scheduler-owned annotations at admission (hami_py.scheduling.admission.rules).

The device plugins hand out devices from a pod's decision annotations, so nobody but a scheduler
(and, once the pod is bound, a device plugin) may write them, nor the defragmenter's hold: a pod
presetting one at CREATE is refused whatever its scheduler, and an UPDATE changing one passes only
on a pod of this scheduler for a user the API server lets write Nodes (its SubjectAccessReview's
answer is the rules' input here; tests/test_webhook_node_writers.py asks it over HTTP). The keys
come from the vendor registry, every family of it; a family's pod marks (which users set) are
never among them. manifests/webhook.yaml's guard names them too.
"""
from __future__ import annotations

import copy
import re

import kubernetes_validate
import pytest

from hami_py.config import DeviceConfig, parse_device_config
from hami_py.devices.base import DeviceVendor
from hami_py.devices.registry import FamilySwitches, build_vendors
from hami_py.scheduling.admission.rules import (
    ADMISSION_V1, ADMISSION_V1BETA1, GENERIC_OWNED_ANNOTATIONS, AdmissionSettings, node_write_question, review,
    review_asking, scheduler_owned_annotations,
)
from hami_py.k8s.accessreview import Subject
from hami_py.scheduling.admission.owned_annotations import OWNED_BESIDE_DECISIONS, decision_annotations
from tests import test_manifests as manifests
from tests.test_webhook import OURS, admit, container, make_pod

ALL_VENDORS = build_vendors(DeviceConfig.default(), FamilySwitches(enable_ascend=True, enable_iluvatar=True))
OWNED = scheduler_owned_annotations(ALL_VENDORS)
DEVICE_PLUGIN = "system:serviceaccount:kube-system:hami-device-plugin"
SCHEDULER_ACCOUNT = "system:serviceaccount:hami-system:hami-scheduler"
# A ServiceAccount a namespace admin let patch pods: no node writer.
TEAM_ACCOUNT = "system:serviceaccount:team-a:ci"
# Who the API server lets write Nodes, as the rules are told it (the SubjectAccessReview's answer).
NODE_WRITERS = frozenset({DEVICE_PLUGIN, SCHEDULER_ACCOUNT, "kubernetes-admin"})
GPU = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}


def family_keys(vendor: DeviceVendor) -> set[str]:
    """What a family's decision writes, by its own account (the marks aside)."""
    keys = {vendor.to_allocate_annotation, vendor.allocated_annotation, *vendor.decision_annotations()}
    return {k for k in keys if k} - set(vendor.pod_marks)


FAMILY_KEYS = sorted({(vendor.vendor_key, key) for vendor in ALL_VENDORS.values() for key in family_keys(vendor)})


def our_pod(annotations: dict | None = None, *, scheduler: str | None = "hami-scheduler") -> dict:
    pod = make_pod(container(limits=dict(GPU)), scheduler=scheduler)
    if annotations is not None:
        pod["metadata"]["annotations"] = dict(annotations)
    return pod


def update_review(old: dict, new: dict, *, user: str, version: str = ADMISSION_V1) -> dict:
    return {"apiVersion": version, "kind": "AdmissionReview",
            "request": {"uid": "up-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "operation": "UPDATE", "namespace": "team-a", "object": new, "oldObject": old,
                        "userInfo": {"username": user, "uid": f"uid-{user}", "groups": ["system:authenticated"],
                                     "extra": {"authentication.kubernetes.io/pod-name": ["p-1"]}}}}


def update(old: dict, new: dict, *, user: str, settings: AdmissionSettings = OURS, version: str = ADMISSION_V1,
           vendors=ALL_VENDORS, writers=NODE_WRITERS, asked: list | None = None) -> dict:
    """The response to an UPDATE review of ``old`` into ``new`` by ``user``, the API server
    letting ``writers`` write Nodes (``writers`` may also be the answer itself: a str is a
    review that failed); the subjects asked go into ``asked``."""
    def may_write_nodes(subject: Subject):
        if asked is not None:
            asked.append(subject)
        return writers if isinstance(writers, str) else subject.user in writers

    answer = review(update_review(old, new, user=user, version=version), settings=settings, vendors=vendors,
                    may_write_nodes=may_write_nodes)
    assert (answer["apiVersion"], answer["response"]["uid"]) == (version, "up-1")
    return answer["response"]


def refused(response: dict) -> str:
    assert response["allowed"] is False and response["status"]["code"] == 403, response
    return response["status"]["message"]


def untouched(response: dict) -> None:
    """Allowed as it is: no patch, no message."""
    assert response["allowed"] is True and response["status"] == {"code": 200}, response
    assert "patch" not in response and "patchType" not in response


# -- which keys ---------------------------------------------------------------------------------

def test_every_familys_decision_keys_the_generic_ones_and_the_defragmenters_hold_are_owned():
    # Every family the config turns on has some (remote GPUs are off in the chart's default, and
    # a family that is off claims no key: tests/test_family_remotegpu.py checks them turned on).
    assert {vendor for vendor, _ in FAMILY_KEYS} == {k for k, v in ALL_VENDORS.items() if v.resource_names()}
    assert {key for _, key in FAMILY_KEYS} | set(GENERIC_OWNED_ANNOTATIONS) == decision_annotations(ALL_VENDORS)
    assert set(GENERIC_OWNED_ANNOTATIONS) == {"hami.io/vgpu-node", "hami.io/vgpu-time", "hami.io/bind-phase",
                                              "hami.io/bind-time"}
    assert OWNED_BESIDE_DECISIONS == ("hami.io/defrag-hold",)
    assert OWNED == decision_annotations(ALL_VENDORS) | {"hami.io/defrag-hold"}
    assert {"hami.io/vgpu-devices-to-allocate", "hami.io/vgpu-devices-allocated", "hami.io/bind-time"} <= OWNED


def test_pod_marks_users_set_are_never_owned():
    marks = {mark for vendor in ALL_VENDORS.values() for mark in vendor.pod_marks}
    assert marks, "no family keeps pod marks any more: this test no longer shows anything"
    assert not marks & OWNED
    # Even a family that listed its mark among its decision keys would not make it owned.
    class Listing(DeviceVendor):
        vendor_key = "Listing"
        allocated_annotation = "example.com/allocated"
        pod_marks = ("example.com/qos",)

        def decision_annotations(self):
            return ("example.com/allocated", "example.com/qos")

    assert scheduler_owned_annotations({"Listing": Listing()}) == \
        {*GENERIC_OWNED_ANNOTATIONS, *OWNED_BESIDE_DECISIONS, "example.com/allocated"}


def test_a_pod_setting_every_familys_marks_is_admitted():
    marks = {mark: "x" for vendor in ALL_VENDORS.values() for mark in vendor.pod_marks}
    pod = make_pod(container(limits={"cpu": "1"}), scheduler="other")
    pod["metadata"]["annotations"] = marks
    response, _ = admit(pod, vendors=ALL_VENDORS)
    assert response["allowed"], response


# -- CREATE ---------------------------------------------------------------------------------------

OWN_KEYS = [*GENERIC_OWNED_ANNOTATIONS, *OWNED_BESIDE_DECISIONS]


@pytest.mark.parametrize("vendor, key", FAMILY_KEYS + [("", k) for k in OWN_KEYS],
                         ids=[f"{v}:{k}" for v, k in FAMILY_KEYS] + OWN_KEYS)
@pytest.mark.parametrize("scheduler", [None, "default-scheduler", "hami-scheduler", "other-scheduler"])
def test_a_pod_presetting_any_familys_key_is_refused_whatever_its_scheduler(vendor, key, scheduler):
    pod = our_pod({key: "GPU-0,NVIDIA,80000,100:;", "team": "vision"}, scheduler=scheduler)
    response, _ = admit(pod, vendors=ALL_VENDORS)
    assert refused(response) == f"annotation {key} is written by the scheduler and cannot be set when creating a pod"


def test_a_forged_decision_is_refused_naming_every_key_it_presets():
    forged = {"hami.io/vgpu-devices-to-allocate": "GPU-a,NVIDIA,80000,100:;",
              "hami.io/vgpu-devices-allocated": "GPU-a,NVIDIA,80000,100:;",
              "hami.io/vgpu-node": "gpu-1", "hami.io/bind-phase": "allocating", "team": "vision"}
    for version in (ADMISSION_V1, ADMISSION_V1BETA1):
        response, _ = admit(our_pod(forged, scheduler="other-scheduler"), vendors=ALL_VENDORS, version=version)
        assert refused(response) == (
            "annotations hami.io/bind-phase, hami.io/vgpu-devices-allocated, hami.io/vgpu-devices-to-allocate, "
            "hami.io/vgpu-node are written by the scheduler and cannot be set when creating a pod")


def test_a_pod_with_other_annotations_is_admitted_and_mutated_as_before():
    pod = our_pod({"hami.io/gpu-scheduler-policy": "spread", "nvidia.com/use-gputype": "H200"},
                  scheduler="default-scheduler")
    response, patched = admit(pod, vendors=ALL_VENDORS)
    assert response["allowed"] and patched["spec"]["schedulerName"] == "hami-scheduler"


# -- UPDATE -------------------------------------------------------------------------------------

DECISION = {"hami.io/vgpu-node": "gpu-1", "hami.io/vgpu-devices-to-allocate": "GPU-a,NVIDIA,3000,0:;",
            "hami.io/vgpu-devices-allocated": "GPU-a,NVIDIA,3000,0:;", "hami.io/bind-phase": "allocating"}
FORGED_TO_ALLOCATE = "GPU-a,NVIDIA,80000,100:;"


@pytest.mark.parametrize("change, key", [
    ({"hami.io/vgpu-devices-to-allocate": FORGED_TO_ALLOCATE}, "hami.io/vgpu-devices-to-allocate"),   # modify
    ({"hami.io/vgpu-mig-allocations": "[]"}, "hami.io/vgpu-mig-allocations"),                       # add
    ({"hami.io/vgpu-node": None}, "hami.io/vgpu-node"),                                             # remove
    ({"hami.io/defrag-hold": '{"node": "gpu-1", "victims": [], "until": "2030-01-01T00:00:00Z"}'},
     "hami.io/defrag-hold"),
])
@pytest.mark.parametrize("user", ["alice", TEAM_ACCOUNT, "system:node:gpu-1", ""])
def test_who_may_not_write_nodes_cannot_add_change_or_remove_a_decision(change, key, user):
    """A ServiceAccount as such is no longer enough (HAMi's first rule, ours until #3074): one a
    namespace admin granted pod patches is refused like a person."""
    old = our_pod(DECISION)
    new = our_pod({k: v for k, v in {**DECISION, **change}.items() if v is not None})
    shown = user or "an unauthenticated user"
    assert refused(update(old, new, user=user)) == \
        f"annotation {key} is written by the scheduler and cannot be set by {shown}"


@pytest.mark.parametrize("user", [DEVICE_PLUGIN, SCHEDULER_ACCOUNT, "kubernetes-admin"])
def test_who_may_write_nodes_writes_a_decision_on_a_pod_of_ours(user):
    old = our_pod(DECISION)
    answered = our_pod({**DECISION, "hami.io/bind-phase": "success", "hami.io/vgpu-devices-to-allocate": ";"})
    untouched(update(old, answered, user=user))
    cleared = our_pod({"team": "vision"})                  # a void decision removed (scheduling/verbs/stale.py)
    untouched(update(old, cleared, user=user))
    held = our_pod({**DECISION, "hami.io/defrag-hold": '{"node": "gpu-1"}'})   # defrag --execute's operator
    untouched(update(old, held, user=user))


def test_the_rule_asks_about_the_requests_author_as_its_user_info_says():
    asked: list[Subject] = []
    old, new = our_pod(DECISION), our_pod({**DECISION, "hami.io/bind-phase": "success"})
    untouched(update(old, new, user=DEVICE_PLUGIN, asked=asked))
    assert asked == [Subject(DEVICE_PLUGIN, ("system:authenticated",), f"uid-{DEVICE_PLUGIN}",
                             (("authentication.kubernetes.io/pod-name", ("p-1",)),))]
    # Nothing asked where the answer cannot matter: no owned key changed, another scheduler's pod.
    untouched(update(old, our_pod({**DECISION, "team": "vision"}), user="alice", asked=asked))
    other = our_pod({}, scheduler="other-scheduler")
    refused(update(other, our_pod({"hami.io/bind-phase": "success"}, scheduler="other-scheduler"), user="alice",
                   asked=asked))
    assert len(asked) == 1


def test_an_answer_that_could_not_be_had_refuses_saying_why():
    """Fail closed: the API server did not answer the SubjectAccessReview."""
    old, new = our_pod(DECISION), our_pod({**DECISION, "hami.io/bind-phase": "success"})
    response = update(old, new, user=DEVICE_PLUGIN,
                      writers="SubjectAccessReview (update nodes): POST /apis/...: timed out")
    assert (response["allowed"], response["status"]["code"]) == (False, 500)
    assert response["status"]["message"] == (
        f"annotation hami.io/bind-phase is written by the scheduler and cannot be set by {DEVICE_PLUGIN}: cannot tell "
        f"whether {DEVICE_PLUGIN} may write nodes (SubjectAccessReview (update nodes): POST /apis/...: timed out)")


async def test_review_asking_awaits_the_question_only_when_the_rule_needs_it():
    asked: list[Subject] = []

    async def ask(subject: Subject):
        asked.append(subject)
        return subject.user == DEVICE_PLUGIN

    old, new = our_pod(DECISION), our_pod({**DECISION, "hami.io/bind-phase": "success"})
    for user, allowed in ((DEVICE_PLUGIN, True), ("alice", False)):
        answer = await review_asking(update_review(old, new, user=user), settings=OURS, vendors=ALL_VENDORS, ask=ask)
        assert answer["response"]["allowed"] is allowed
    assert [s.user for s in asked] == [DEVICE_PLUGIN, "alice"]
    # A CREATE, an update of nothing owned and a malformed review ask nothing.
    created = await review_asking({"apiVersion": ADMISSION_V1, "kind": "AdmissionReview",
                                   "request": {"uid": "c", "operation": "CREATE", "object": our_pod()}},
                                  settings=OURS, vendors=ALL_VENDORS, ask=ask)
    assert created["response"]["allowed"]
    assert node_write_question(update_review(old, our_pod(DECISION), user="alice"), settings=OURS,
                               vendors=ALL_VENDORS) is None
    assert node_write_question({"kind": "AdmissionReview"}, settings=OURS, vendors=ALL_VENDORS) is None
    assert len(asked) == 2

    async def broken(subject: Subject):
        raise RuntimeError("boom")

    answer = await review_asking(update_review(old, new, user=DEVICE_PLUGIN), settings=OURS, vendors=ALL_VENDORS,
                                 ask=broken)
    assert answer["response"]["allowed"] is False and "internal error: boom" in answer["response"]["status"]["message"]


def test_a_node_writer_cannot_write_a_decision_on_another_schedulers_pod():
    old = our_pod({}, scheduler="other-scheduler")
    new = our_pod({"hami.io/bind-phase": "success"}, scheduler="other-scheduler")
    assert refused(update(old, new, user=DEVICE_PLUGIN)) == (
        f"annotation hami.io/bind-phase is written by the scheduler and cannot be set by {DEVICE_PLUGIN} "
        'on a pod of scheduler "other-scheduler"')
    # The pod's scheduler is the one it had (spec.schedulerName cannot change on an update).
    assert not update(old, our_pod({"hami.io/bind-phase": "success"}), user=DEVICE_PLUGIN)["allowed"]
    # Without --scheduler-name there is no "ours" to compare with: who may write Nodes decides.
    untouched(update(old, new, user=DEVICE_PLUGIN, settings=AdmissionSettings()))
    refused(update(old, new, user="alice", settings=AdmissionSettings()))


def test_every_familys_keys_are_guarded_on_update():
    for _, key in FAMILY_KEYS:
        old, new = our_pod({}), our_pod({key: "x"})
        assert refused(update(old, new, user="alice")).startswith(f"annotation {key} is written by the scheduler")
        assert refused(update(old, new, user=TEAM_ACCOUNT)).startswith(f"annotation {key} is written")
        untouched(update(old, new, user=DEVICE_PLUGIN))


def test_an_update_leaving_the_decision_alone_passes_untouched_whoever_makes_it():
    old = our_pod(DECISION)
    labelled = our_pod({**DECISION, "team": "vision", "hami.io/gpu-scheduler-policy": "spread"})
    labelled["metadata"]["labels"] = {"app": "trainer"}
    untouched(update(old, labelled, user="alice"))
    # Not even the create rules run: this device pod has no GPU count and another scheduler, which
    # a CREATE would patch, and an update may not.
    bare = make_pod(container(limits={"nvidia.com/gpumem": "3000"}), scheduler="default-scheduler")
    untouched(update(bare, bare, user="alice"))
    # The marks users set are theirs to change.
    marks = {mark: "x" for vendor in ALL_VENDORS.values() for mark in vendor.pod_marks}
    untouched(update(our_pod(DECISION), our_pod({**DECISION, **marks}), user="alice"))


def test_update_answers_in_v1beta1():
    old, new = our_pod(DECISION), our_pod({**DECISION, "hami.io/vgpu-devices-to-allocate": FORGED_TO_ALLOCATE})
    assert refused(update(old, new, user="alice", version=ADMISSION_V1BETA1)).startswith(
        "annotation hami.io/vgpu-devices-to-allocate is written by the scheduler")
    untouched(update(old, new, user=DEVICE_PLUGIN, version=ADMISSION_V1BETA1))


@pytest.mark.parametrize("mutate, message", [
    (lambda r: r.pop("oldObject"), "request.oldObject: expected a Pod object, got null"),
    (lambda r: r.update(oldObject={"kind": "Node"}), 'request.oldObject is a "Node", not a Pod'),
    (lambda r: r.update(userInfo="alice"), "request.userInfo: expected an object, got a string"),
    (lambda r: r["userInfo"].update(groups="system:masters"),
     "request.userInfo.groups: expected a list of strings, got a string"),
    (lambda r: r["userInfo"].update(extra={"scopes": "all"}),
     "request.userInfo.extra[scopes]: expected a list of strings, got a string"),
    (lambda r: r["object"]["metadata"].update(annotations={"hami.io/bind-phase": 1}),
     "metadata.annotations[hami.io/bind-phase]: expected a string, got a number"),
])
def test_a_malformed_update_review_is_a_400_naming_the_field(mutate, message):
    body = {"apiVersion": ADMISSION_V1, "kind": "AdmissionReview",
            "request": {"uid": "u", "operation": "UPDATE", "object": our_pod(DECISION), "oldObject": our_pod(),
                        "userInfo": {"username": DEVICE_PLUGIN}}}
    mutate(body["request"])
    response = review(body, settings=OURS, vendors=ALL_VENDORS)["response"]
    assert (response["allowed"], response["status"]["code"], response["status"]["message"]) == (False, 400, message)


# -- manifests/webhook.yaml: the guard's matchConditions ----------------------------------------

OWNED_PREFIX = "hami.io/"


def _guard_expression() -> tuple[list[str], str]:
    """(the key list the guard's CEL starts with, the rest of the expression)."""
    [condition] = manifests.GUARD["matchConditions"]
    match = re.fullmatch(r"\s*\[([^\]]*)\]\.exists\(k,(.*)", condition["expression"], re.DOTALL)
    assert match, condition["expression"][:200]
    keys = re.findall(r"'([^']*)'", match.group(1))
    assert match.group(1).count(",") == len(keys) - 1     # nothing but quoted keys in the list
    return keys, match.group(2)


def test_the_guards_conditions_name_every_scheduler_owned_key_of_the_deployed_config():
    """The matchConditions keep the guard off ordinary updates, so a key they missed would be
    written unchecked: every family's keys for manifests/device-config.yaml with the Deployment's
    switches are either in the list or under the hami.io/ prefix the expression also checks, and
    the list has nothing else. (The API server's evaluation: tests/test_real_k8s_webhook.py.)"""
    options = manifests.OPTIONS
    switches = FamilySwitches(enable_ascend=options.enable_ascend, enable_iluvatar=options.enable_iluvatar)
    owned = scheduler_owned_annotations(build_vendors(parse_device_config(manifests.DEVICE_CONFIG_TEXT), switches))
    keys, rest = _guard_expression()
    expected = sorted(k for k in owned if not k.startswith(OWNED_PREFIX))
    assert keys == expected, f"the guard's key list in manifests/webhook.yaml should be: {expected}"
    # The prefix is checked on the new object's keys (set or changed) and the old one's (removed).
    assert rest.count(f"k.startsWith('{OWNED_PREFIX}')") == 2
    assert {"hami.io/vgpu-devices-to-allocate", "hami.io/bind-phase"} <= owned
    # has() and `in` only: CEL optionals are not in every API server's library.
    assert ".?" not in rest and "optional." not in rest


def test_offline_validation_sees_the_guards_conditions():
    """kubernetes-validate knows matchConditions (Kubernetes 1.32): a misspelt field fails."""
    wrong = copy.deepcopy(manifests.find("MutatingWebhookConfiguration", "hami-webhook"))
    condition = wrong["webhooks"][0]["matchConditions"][0]
    condition["expresion"] = condition.pop("expression")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong, manifests.KUBERNETES_VERSION, strict=True)


def test_the_guard_has_no_opt_out():
    """The opt-out label is set by the pod's (or namespace's) author, whom the guard is about."""
    guard = manifests.GUARD
    assert manifests._selected(guard["namespaceSelector"],
                               {"kubernetes.io/metadata.name": "x", "hami.io/webhook": "ignore"})
    assert "objectSelector" not in guard
