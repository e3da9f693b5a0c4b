"""manifests/admission-policy.yaml against the code: the guard that holds while the scheduler is down.

The ValidatingAdmissionPolicy names every scheduler-owned annotation itself (CEL cannot ask
hami-py), so the list is checked here against ``scheduler_owned_annotations`` for the shipped
device config and the Deployment's switches: the manifest can never drift from the code. Its
scheduler name is the Deployment's, and its rule has the webhook's shape (CREATE: none preset;
UPDATE: a change only on a pod of ours, by a user who may write Nodes). The real API server
evaluates it in tests/test_real_k8s_admission_policy.py.
"""
from __future__ import annotations

import re

from hami_py.config import parse_device_config
from hami_py.devices.registry import FamilySwitches, build_vendors
from hami_py.scheduling.admission.owned_annotations import scheduler_owned_annotations
from tests import test_manifests as manifests

POLICY = manifests.find("ValidatingAdmissionPolicy", "hami-scheduler-owned-annotations")
BINDING = manifests.find("ValidatingAdmissionPolicyBinding", "hami-scheduler-owned-annotations")
VARIABLES = {v["name"]: v["expression"] for v in POLICY["spec"]["variables"]}


def deployed_owned_keys() -> list[str]:
    options = manifests.OPTIONS
    switches = FamilySwitches(enable_ascend=options.enable_ascend, enable_iluvatar=options.enable_iluvatar)
    return sorted(scheduler_owned_annotations(build_vendors(parse_device_config(manifests.DEVICE_CONFIG_TEXT),
                                                            switches)))


def test_the_policy_names_every_scheduler_owned_key_of_the_deployed_config():
    match = re.fullmatch(r"\s*\[([^\]]*)\]\s*", VARIABLES["owned"])
    assert match, VARIABLES["owned"][:200]
    keys = re.findall(r"'([^']*)'", match.group(1))
    assert match.group(1).count(",") == len(keys) - 1     # nothing but quoted keys in the list
    expected = deployed_owned_keys()
    # Sorted as the webhook sorts the keys it names, so both refuse in the same words.
    assert keys == expected, "the key list in manifests/admission-policy.yaml should be:\n" + \
        ",\n".join(f"          '{k}'" for k in expected)
    assert {"hami.io/vgpu-node", "hami.io/bind-phase", "hami.io/bind-time", "hami.io/defrag-hold",
            "hami.io/vgpu-devices-to-allocate"} <= set(keys)


def test_the_policy_is_about_the_deployments_scheduler():
    assert f"oldObject.spec.schedulerName == '{manifests.OPTIONS.scheduler_name}'" in VARIABLES["ours"]


def test_create_and_update_of_pods_and_their_status_everywhere():
    assert POLICY["spec"]["matchConstraints"] == {"resourceRules": [{
        "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
        "resources": ["pods", "pods/status"]}]}
    assert "namespaceSelector" not in POLICY["spec"]["matchConstraints"] and "matchConditions" not in POLICY["spec"]
    assert POLICY["spec"]["failurePolicy"] == "Fail"
    assert BINDING["spec"] == {"policyName": POLICY["metadata"]["name"], "validationActions": ["Deny"]}


def test_the_rule_has_the_webhooks_shape():
    [create, update] = POLICY["spec"]["validations"]
    assert create["expression"] == "variables.preset.size() == 0"
    assert update["expression"] == "variables.changed.size() == 0 || (variables.ours && variables.writesNodes)"
    assert "request.operation == 'CREATE'" in VARIABLES["preset"]
    assert "request.operation == 'UPDATE'" in VARIABLES["changed"]
    for verb in ("update", "patch"):
        assert f"authorizer.group('').resource('nodes').check('{verb}').allowed()" in VARIABLES["writesNodes"]
    assert {create["reason"], update["reason"]} == {"Forbidden"}
    assert "cannot be set when creating a pod" in create["messageExpression"]
    assert "cannot be set by ' + variables.author" in update["messageExpression"]
    for expression in [*VARIABLES.values(), create["messageExpression"], update["messageExpression"]]:
        assert ".?" not in expression and "optional." not in expression     # not in every API server's CEL


def test_the_kustomization_ships_it():
    assert "admission-policy.yaml" in manifests.yaml.safe_load(
        (manifests.MANIFESTS / "kustomization.yaml").read_text())["resources"]
