"""The PodGroup watch, when the cluster serves scheduler-plugins' PodGroup CRD.

Asked once at start with a LIST of one item: a 404 means the CRD is not installed, and PodGroup
gangs stay off for this process's life (said once in the start-up log; Kueue's pod groups need no
CRD and stay on). A 403 (an older RBAC without podgroups) turns them off too, rather than leave
an informer that could never sync holding up the books. Any other answer, even an error, leaves
the informer to it: a server that is down now answers later, and the informer retries as every
watch does.
"""
from __future__ import annotations

import structlog

from hami_py.k8s.client import KubeApiError, KubeClient
from hami_py.k8s.informer import Informer
from hami_py.scheduling.gangs.book import GangBook
from hami_py.scheduling.gangs.membership import PODGROUPS_PATH

log = structlog.get_logger(__name__)


async def podgroups_unusable(client: KubeClient) -> str | None:
    """Why this scheduler cannot watch PodGroups, or None when it can (or may, later)."""
    try:
        await client.get(PODGROUPS_PATH, query=[("limit", "1")])
    except KubeApiError as exc:
        if exc.not_found:
            return "the API server serves no podgroups.scheduling.x-k8s.io (scheduler-plugins' CRD is not installed)"
        if exc.status == 403:
            return "this scheduler may not list podgroups.scheduling.x-k8s.io (its RBAC lacks them)"
    return None


async def podgroup_informer(client: KubeClient, book: GangBook) -> Informer | None:
    """The informer feeding ``book`` the PodGroups, or None (logged once) when they cannot be watched."""
    why = await podgroups_unusable(client)
    if why is not None:
        log.info("PodGroup gangs off; Kueue pod groups stay on", reason=why)
        return None
    book.podgroups_on = True
    return Informer(client=client, path=PODGROUPS_PATH, on_event=book.observe_podgroup,
                    on_relist=lambda items, rv: book.replace_podgroups(items))
