"""The webhook's UPDATE rule asks the API server who may write Nodes (hami_py/k8s/accessreview.py).

A change of a scheduler-owned pod annotation passes only for a user the API server's authorizer
lets ``update`` or ``patch`` Nodes (a SubjectAccessReview for the AdmissionReview's userInfo):
here against the in-repo API server (its ``node_writers``), through the running scheduler's
``/webhook``. Answers are kept a few seconds per user, so a burst of a device plugin's updates
costs one review; a review that fails refuses the update (fail closed) and is not kept.
tests/test_real_k8s_webhook.py asks the real kube-apiserver.
"""
from __future__ import annotations

import asyncio
import copy
import os
import tempfile

import aiohttp
import pytest

from hami_py.fakeapi.server import NODE_WRITERS, write_kubeconfig
from hami_py.http.webhook import WEBHOOK_PATH
from hami_py.k8s.accessreview import (
    SUBJECT_ACCESS_REVIEWS, AccessReviewFailed, NodeWriters, Subject, may_write_nodes,
)
from hami_py.k8s.client import KubeApiError, KubeClient, load_configuration
from tests.test_webhook_owned_annotations import DECISION, our_pod, update_review

DEVICE_PLUGIN = "system:serviceaccount:kube-system:hami-device-plugin"
EDITOR = "system:serviceaccount:team-a:editor"      # a namespace's editor: may patch pods, not nodes


@pytest.fixture
async def client(api):
    with tempfile.TemporaryDirectory() as tmp:
        config = await load_configuration(write_kubeconfig(os.path.join(tmp, "kubeconfig"), api.url))
    kube = KubeClient(config, qps=0, burst=100)
    try:
        yield kube
    finally:
        await kube.close()


def reviews_asked(api) -> int:
    return sum(1 for method, path, _ in api.requests if method == "POST" and path == SUBJECT_ACCESS_REVIEWS)


class Recording:
    """A client stand-in that records what it is asked and answers from a list."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.posted: list[tuple[str, dict]] = []

    async def post(self, path: str, body: dict, **kw) -> dict:
        self.posted.append((path, body))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


# -- the review -----------------------------------------------------------------------------------

async def test_the_review_names_the_whole_subject_and_asks_update_then_patch():
    client = Recording({"status": {"allowed": False}}, {"status": {"allowed": True}})
    assert await may_write_nodes(client, user="u", groups=("g1", "g2"), uid="id-1", extra={"scopes": ("a",)}) is True
    assert [body["spec"]["resourceAttributes"] for _, body in client.posted] == [
        {"group": "", "resource": "nodes", "verb": "update"}, {"group": "", "resource": "nodes", "verb": "patch"}]
    path, body = client.posted[0]
    assert path == SUBJECT_ACCESS_REVIEWS and body["kind"] == "SubjectAccessReview"
    assert {k: v for k, v in body["spec"].items() if k != "resourceAttributes"} == \
        {"user": "u", "groups": ["g1", "g2"], "uid": "id-1", "extra": {"scopes": ["a"]}}
    # The first yes is enough; two noes are a no.
    assert await may_write_nodes(Recording({"status": {"allowed": True}}), user="u") is True
    assert await may_write_nodes(Recording({"status": {"allowed": False}}, {"status": {"denied": True}}), user="u") \
        is False


async def test_a_review_that_is_not_answered_raises_saying_why():
    with pytest.raises(AccessReviewFailed, match=r"SubjectAccessReview \(update nodes\): forbidden"):
        await may_write_nodes(Recording(KubeApiError(403, "Forbidden", "forbidden")), user="u")
    with pytest.raises(AccessReviewFailed, match="the answer has no status"):
        await may_write_nodes(Recording({}), user="u")


async def test_the_in_repo_api_server_answers_for_its_node_writers(api, client):
    assert await may_write_nodes(client, user=DEVICE_PLUGIN) is True
    assert await may_write_nodes(client, user=EDITOR) is False
    assert await may_write_nodes(client, user="admin", groups=("system:masters",)) is True
    api.node_writers.add(EDITOR)
    assert await may_write_nodes(client, user=EDITOR) is True
    assert "system:serviceaccount:hami-system:hami-scheduler" in NODE_WRITERS
    with pytest.raises(AccessReviewFailed, match="at least one of user or group"):
        await may_write_nodes(client, user="")


# -- kept per subject -------------------------------------------------------------------------------

async def test_answers_are_kept_a_few_seconds_per_subject(api, client):
    now = [0.0]
    writers = NodeWriters(client, ttl_s=5.0, clock=lambda: now[0])
    plugin = Subject.of(user=DEVICE_PLUGIN, groups=["system:serviceaccounts"])
    # A burst of a device plugin's updates, all at once: one review.
    assert await asyncio.gather(*(writers.allowed(plugin) for _ in range(20))) == [True] * 20
    assert reviews_asked(api) == 1
    now[0] = 4.9
    assert await writers.allowed(plugin) is True and reviews_asked(api) == 1
    # Another subject is another question (the same name with other groups too).
    assert await writers.allowed(Subject.of(user=DEVICE_PLUGIN, groups=["system:masters"])) is True
    editor = Subject.of(user=EDITOR)
    assert await writers.allowed(editor) is False
    assert reviews_asked(api) == 1 + 1 + 2          # a no asks both verbs
    # Expired: asked again, and the answer may have changed.
    api.node_writers.discard(DEVICE_PLUGIN)
    now[0] = 5.1
    assert await writers.allowed(plugin) is False


async def test_a_failed_review_is_not_kept(api, client):
    writers = NodeWriters(client, ttl_s=60.0)
    plugin = Subject.of(user=DEVICE_PLUGIN)
    api.faults.add(method="POST", path=SUBJECT_ACCESS_REVIEWS, status=500)
    with pytest.raises(AccessReviewFailed):
        await writers.allowed(plugin)
    assert await writers.allowed(plugin) is True
    assert reviews_asked(api) == 2


async def test_a_hung_review_is_given_up_in_time(api, client):
    writers = NodeWriters(client, timeout_s=0.2)
    api.faults.add(method="POST", path=SUBJECT_ACCESS_REVIEWS, hang=True)
    try:
        with pytest.raises(AccessReviewFailed, match="timed out"):
            await asyncio.wait_for(writers.allowed(Subject.of(user=DEVICE_PLUGIN)), 5)
    finally:
        api.faults.release()


async def test_the_kept_answers_are_bounded(api, client):
    writers = NodeWriters(client, kept=3)
    for i in range(6):
        await writers.allowed(Subject.of(user=f"user-{i}"))
    assert len(writers.answers) <= 3


# -- through the running scheduler's /webhook --------------------------------------------------------

async def post_review(app, body: dict) -> dict:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{app.webhook_url}{WEBHOOK_PATH}", json=body) as answer:
            assert answer.status == 200
            return (await answer.json())["response"]


def answered(user: str) -> dict:
    """The device plugin's answer (bind-phase success) on a pod of ours, as ``user`` makes it."""
    old = our_pod(DECISION)
    new = copy.deepcopy(old)
    new["metadata"]["annotations"]["hami.io/bind-phase"] = "success"
    return update_review(old, new, user=user)


async def test_the_webhook_lets_node_writers_through_and_refuses_a_namespace_editor(api, app):
    assert (await post_review(app, answered(DEVICE_PLUGIN)))["allowed"] is True
    refused = await post_review(app, answered(EDITOR))
    assert refused == {"uid": "up-1", "allowed": False, "status": {
        "code": 403, "reason": "Forbidden",
        "message": f"annotation hami.io/bind-phase is written by the scheduler and cannot be set by {EDITOR}"}}
    # An update of nothing owned asks nothing.
    before = reviews_asked(api)
    plain = update_review(our_pod(DECISION), our_pod({**DECISION, "team": "vision"}), user=EDITOR)
    assert (await post_review(app, plain))["allowed"] is True
    assert reviews_asked(api) == before


async def test_a_burst_through_the_webhook_costs_one_review(api, app):
    responses = await asyncio.gather(*(post_review(app, answered(DEVICE_PLUGIN)) for _ in range(30)))
    assert all(r["allowed"] for r in responses)
    assert reviews_asked(api) == 1 and app.node_writers.reviews == 1


async def test_the_webhook_fails_closed_when_the_review_fails(api, app):
    api.faults.add(method="POST", path=SUBJECT_ACCESS_REVIEWS, status=503)
    response = await post_review(app, answered(DEVICE_PLUGIN))
    assert (response["allowed"], response["status"]["code"]) == (False, 500)
    assert response["status"]["message"].startswith(
        f"annotation hami.io/bind-phase is written by the scheduler and cannot be set by {DEVICE_PLUGIN}: cannot "
        f"tell whether {DEVICE_PLUGIN} may write nodes (SubjectAccessReview (update nodes): ")
    errors = app.metrics.registry.get_sample_value("hami_extender_request_errors_total", {"verb": "webhook"})
    assert errors == 1
    # Not kept: the next update is asked again, and passes.
    assert (await post_review(app, answered(DEVICE_PLUGIN)))["allowed"] is True
