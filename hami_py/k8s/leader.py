"""Which scheduler replica leads: read from the Lease the kube-scheduler beside it holds.

HAMi runs several scheduler pods, each a kube-scheduler plus this extender, and only one of them
may keep the registration bookkeeping (handshake stamps, cleanup, role labels) and answer
/filter. Upstream does not campaign for leadership itself: the kube-scheduler sidecar already
does, on the coordination.k8s.io Lease named ``--leader-elect-resource-name`` in
``--leader-elect-resource-namespace``, with an identity of ``<hostname>_<uuid>``. So the extender
only watches that Lease and follows its own sidecar: it leads while the Lease names this host as
holder and has been renewed recently enough. We do the same, with three deliberate differences:

* The holder must be exactly the hostname or start with ``<hostname>_``. Upstream checks a bare
  prefix, so host ``hami-scheduler-1`` would also "lead" when ``hami-scheduler-10_…`` holds it.
* Freshness is judged by when we saw the Lease *change* (local monotonic clock, so the two
  machines' clocks never matter), and re-judged on a timer: a Lease that simply stops being
  renewed ends leadership once ``leaseDurationSeconds`` have passed, with no event needed, and
  /filter stops answering. Upstream's expired Lease only stops its registration passes (/filter
  keeps answering: ``synced`` is cleared on a holder change or deletion alone), and its hourly
  informer resync re-stamps an unchanged Lease as freshly observed.
* ``--leader-elect`` without a Lease name and namespace is refused at start-up (upstream would
  silently never lead, so /filter would block forever).

With ``--leader-elect=false`` (the binary's default) the replica always leads.

A follower keeps its watches and usage books warm (a fail-over serves at once) and stays Ready:
/readyz answers 200 once the caches are in, leader or not (upstream: 200 always). The chart runs
every replica behind one Deployment, and a follower reported unready would stall its rollouts;
webhook traffic finds the leader by the role label instead (see registration.py).
"""
from __future__ import annotations

import asyncio
import socket
from typing import Callable

import structlog

from hami_py.k8s.client import KubeClient
from hami_py.k8s.informer import Informer

log = structlog.get_logger(__name__)

LeadershipHandler = Callable[[bool], None]


def lease_path(namespace: str) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"


def leader_identity(hostname: str = "") -> str:
    """The identity we look for in the Lease: the given name, else this machine's hostname
    (in a pod, the pod name, which is what kube-scheduler puts before the ``_``)."""
    return hostname or socket.gethostname()


def check_leader_options(*, leader_elect: bool, name: str, namespace: str, identity: str) -> None:
    """ValueError naming what is missing when leader election cannot work as configured."""
    if not leader_elect:
        return
    missing = [flag for flag, value in (("--leader-elect-resource-name", name),
                                        ("--leader-elect-resource-namespace", namespace)) if not value]
    if missing:
        raise ValueError(f"--leader-elect=true needs {' and '.join(missing)} "
                         "(the Lease the kube-scheduler sidecar holds)")
    if not identity:
        raise ValueError("--leader-elect=true needs a hostname to recognise this replica in the Lease")


def holds_lease(holder: object, identity: str) -> bool:
    """kube-scheduler writes ``<hostname>_<uuid>``; a bare hostname is accepted too."""
    return isinstance(holder, str) and bool(identity) and (holder == identity or holder.startswith(identity + "_"))


class StaticLeadership:
    """``--leader-elect=false``: this replica always leads, and never changes its mind."""

    is_leader = True

    def __init__(self) -> None:
        self.synced = asyncio.Event()
        self.synced.set()

    def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass


class LeaseLeadership:
    """Leader iff the watched Lease names ``identity`` as holder and is fresh.

    ``on_change(leading)`` is called on the event loop whenever the answer flips, including when
    the Lease runs out without any event. ``synced`` is set once the Lease has been listed."""

    def __init__(self, *, client: KubeClient, namespace: str, name: str, identity: str,
                 on_change: LeadershipHandler | None = None):
        check_leader_options(leader_elect=True, name=name, namespace=namespace, identity=identity)
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.on_change = on_change
        self.is_leader = False
        self.holder: str | None = None
        self._duration_s: float | None = None
        self._observed_rv: str | None = None
        self._observed_at: float | None = None   # loop.time() when the Lease last changed
        self._timer: asyncio.TimerHandle | None = None
        # Only this Lease: kube-system holds many (the API servers' identity leases renew every 10 s).
        self.informer = Informer(client=client, path=lease_path(namespace), on_event=self._on_event,
                                 on_relist=self._on_relist, field_selector=f"metadata.name={name}")
        self.synced = self.informer.synced

    def start(self) -> None:
        self.informer.start()

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        await self.informer.stop()

    # -- lease events ---------------------------------------------------------------------------

    def _ours(self, lease: dict) -> bool:
        return (lease.get("metadata") or {}).get("name") == self.name

    def _on_event(self, kind: str, lease: dict) -> None:
        if self._ours(lease):
            self._observe(None if kind == "DELETED" else lease)

    def _on_relist(self, leases: list[dict], _rv: int | None) -> None:
        self._observe(next((lease for lease in leases if self._ours(lease)), None))

    def _observe(self, lease: dict | None) -> None:
        if lease is None:
            self.holder, self._duration_s, self._observed_rv, self._observed_at = None, None, None, None
        else:
            rv = (lease.get("metadata") or {}).get("resourceVersion")
            if rv != self._observed_rv or self._observed_at is None:
                # Only a change counts as a renewal: re-reading an unrenewed Lease after a
                # relist must not make it look fresh again.
                self._observed_rv = rv
                self._observed_at = asyncio.get_running_loop().time()
            spec = lease.get("spec") or {}
            self.holder = spec.get("holderIdentity")
            duration = spec.get("leaseDurationSeconds")
            valid = isinstance(duration, (int, float)) and not isinstance(duration, bool) and duration > 0
            self._duration_s = float(duration) if valid else None
        self._evaluate()

    # -- judgement ------------------------------------------------------------------------------

    def expires_in(self) -> float | None:
        """Seconds until the Lease as last seen runs out (None without a usable Lease)."""
        if self._observed_at is None or self._duration_s is None:
            return None
        return self._observed_at + self._duration_s - asyncio.get_running_loop().time()

    def _evaluate(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        remaining = self.expires_in()
        leading = holds_lease(self.holder, self.identity) and remaining is not None and remaining > 0
        if leading:
            # Expiry comes without an event: look again the moment it would happen.
            self._timer = asyncio.get_running_loop().call_later(remaining, self._evaluate)
        if leading != self.is_leader:
            self.is_leader = leading
            log.info("leadership changed", leading=leading, holder=self.holder, identity=self.identity,
                     lease=f"{self.namespace}/{self.name}")
            if self.on_change is not None:
                self.on_change(leading)


def build_leadership(*, leader_elect: bool, client: KubeClient, namespace: str, name: str, identity: str,
                     on_change: LeadershipHandler | None = None) -> StaticLeadership | LeaseLeadership:
    if not leader_elect:
        return StaticLeadership()
    return LeaseLeadership(client=client, namespace=namespace, name=name, identity=identity,
                           on_change=on_change)


__all__ = ["LeaseLeadership", "StaticLeadership", "build_leadership", "check_leader_options",
           "holds_lease", "leader_identity", "lease_path"]
