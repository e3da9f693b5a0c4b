"""May this user write Nodes? A SubjectAccessReview, asked of the API server.

The webhook's UPDATE rule (scheduling/admission/rules.py) lets a change of a scheduler-owned pod
annotation through only for an identity the cluster trusts with Nodes: the scheduler, the device
plugins, an operator, not a namespace's editor, whom a namespace admin could grant pod patches.
The API server's authorizer is the judge (HAMi's ``canWriteNodes``, #3074): a
SubjectAccessReview for the requesting user (its name, groups, uid and extra, as the
AdmissionReview's ``userInfo`` gives them) asking ``update``, then ``patch``, on ``nodes`` of the
core group, cluster-wide. Either allowed is a yes.

``NodeWriters`` keeps each subject's answer ``ttl_s`` seconds (a burst of a device plugin's
updates costs one review), shares one review among the requests that ask for the same subject
meanwhile, and raises AccessReviewFailed when the API server cannot answer (the rule then
refuses: fail closed). Needs RBAC ``create`` on ``subjectaccessreviews`` and nothing more.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Callable

from hami_py.k8s.client import KubeApiError, KubeClient

SUBJECT_ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
NODE_WRITE_VERBS = ("update", "patch")
TTL_S = 5.0           # how long an answer is kept, per subject
REVIEW_TIMEOUT_S = 3.0    # under the webhook's timeoutSeconds (5): the API server hears our refusal
KEPT = 1024           # subjects remembered at most (expired ones are dropped first)


class AccessReviewFailed(Exception):
    """The API server did not answer a SubjectAccessReview; the message says why."""


@dataclass(frozen=True, slots=True)
class Subject:
    """Who asks, as an AdmissionReview's ``userInfo`` says (hashable: the cache's key)."""
    user: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()     # sorted by key

    @classmethod
    def of(cls, *, user: str, groups=(), uid: str = "", extra: dict | None = None) -> "Subject":
        return cls(user, tuple(groups), uid, tuple(sorted((k, tuple(v)) for k, v in (extra or {}).items())))


async def may_write_nodes(client: KubeClient, *, user: str, groups: tuple[str, ...] = (), uid: str = "",
                          extra: dict[str, tuple[str, ...]] | None = None,
                          timeout_s: float = REVIEW_TIMEOUT_S) -> bool:
    """Whether the API server's authorizer lets this user ``update`` or ``patch`` Nodes.

    Raises AccessReviewFailed when a review is not answered (an error, a timeout)."""
    spec: dict = {"user": user, "groups": list(groups)}
    if uid:
        spec["uid"] = uid
    if extra:
        spec["extra"] = {key: list(values) for key, values in extra.items()}
    for verb in NODE_WRITE_VERBS:
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                "spec": {**spec, "resourceAttributes": {"group": "", "resource": "nodes", "verb": verb}}}
        try:
            review = await client.post(SUBJECT_ACCESS_REVIEWS, body, timeout=timeout_s)
        except KubeApiError as exc:
            raise AccessReviewFailed(f"SubjectAccessReview ({verb} nodes): {exc}") from None
        status = review.get("status") if isinstance(review, dict) else None
        if not isinstance(status, dict):
            raise AccessReviewFailed(f"SubjectAccessReview ({verb} nodes): the answer has no status")
        if status.get("allowed") is True:
            return True
    return False


class NodeWriters:
    """``may_write_nodes`` per subject, answers kept ``ttl_s`` seconds, one review in flight
    per subject. Failures are not kept: the next request asks again."""

    def __init__(self, client: KubeClient, *, ttl_s: float = TTL_S, timeout_s: float = REVIEW_TIMEOUT_S,
                 clock: Callable[[], float] = time.monotonic, kept: int = KEPT):
        self.client = client
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self.clock = clock
        self.kept = kept
        self.answers: dict[Subject, tuple[float, bool]] = {}     # subject -> (expiry, allowed)
        self._asking: dict[Subject, asyncio.Task] = {}
        self.reviews = 0                                        # reviews asked (both verbs count one)

    async def allowed(self, subject: Subject) -> bool:
        """Raises AccessReviewFailed when the API server cannot answer."""
        known = self.answers.get(subject)
        if known is not None and known[0] > self.clock():
            return known[1]
        task = self._asking.get(subject)
        if task is None:
            task = self._asking[subject] = asyncio.create_task(self._ask(subject))
            task.add_done_callback(_retrieved)
        # Shielded: a caller that goes away (the API server gave up on the webhook) leaves the
        # review to finish for the others waiting on it, and for the cache.
        return await asyncio.shield(task)

    async def _ask(self, subject: Subject) -> bool:
        try:
            self.reviews += 1
            allowed = await may_write_nodes(self.client, user=subject.user, groups=subject.groups, uid=subject.uid,
                                            extra=dict(subject.extra), timeout_s=self.timeout_s)
            now = self.clock()
            if len(self.answers) >= self.kept:
                self.answers = {s: a for s, a in self.answers.items() if a[0] > now}
                if len(self.answers) >= self.kept:
                    self.answers.pop(next(iter(self.answers)))
            self.answers[subject] = (now + self.ttl_s, allowed)
            return allowed
        finally:
            self._asking.pop(subject, None)


def _retrieved(task: asyncio.Task) -> None:
    # A failure every caller stopped waiting for is not logged as "never retrieved".
    if not task.cancelled():
        task.exception()
