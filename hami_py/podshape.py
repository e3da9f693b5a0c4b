"""A pod's containers as the books count them: ordinary init containers, native sidecars and app
containers.

Kubernetes runs a pod's init containers one after another before its app containers, so their
devices are needed one at a time. A native sidecar (KEP-753, GA in 1.33) is an init container with
``restartPolicy: Always``: it starts in its turn among the init containers and then runs beside
the app containers for the pod's whole life. Kubernetes' effective request of a pod is the larger
of

* for each ordinary init container, its own request plus the sidecars started before it, and
* all app containers plus all sidecars,

and the books follow the same rule, device by device (``hami_py.cache.pod_ledger.collapse``, the
kernel's init rows, the quota checks). Once every ordinary init container has succeeded, only the
app containers and the sidecars hold devices.

Positions are the allocation annotations' container order: init containers (sidecars among them,
in spec order) first, then app containers.
"""
from __future__ import annotations

from dataclasses import dataclass

SIDECAR_RESTART_POLICY = "Always"


def is_sidecar(container: object) -> bool:
    """Whether an init container is a native sidecar (``restartPolicy: Always``)."""
    return isinstance(container, dict) and container.get("restartPolicy") == SIDECAR_RESTART_POLICY


@dataclass(frozen=True, slots=True)
class PodShape:
    num_init: int = 0                      # init containers, sidecars included (they come first)
    sidecars: frozenset[int] = frozenset()  # positions of the native sidecars among them
    init_done: bool = False                # every ordinary init container has succeeded

    def is_init(self, position: int) -> bool:
        """An ordinary init container: it runs to completion, alone, before the app containers."""
        return position < self.num_init and position not in self.sidecars


def pod_shape(pod: dict) -> PodShape:
    """The shape of a pod object (spec and, for ``init_done``, status)."""
    spec = pod.get("spec") or {}
    init = spec.get("initContainers") or []
    if not isinstance(init, list):
        return PodShape()
    sidecars = frozenset(p for p, c in enumerate(init) if is_sidecar(c))
    ordinary = [c.get("name") for p, c in enumerate(init) if p not in sidecars and isinstance(c, dict)]
    return PodShape(len(init), sidecars, bool(ordinary) and _succeeded(pod, ordinary))


def _succeeded(pod: dict, names: list) -> bool:
    """Whether every named init container has terminated with exit code 0 (a sidecar's status,
    running, does not count: it never terminates while the pod runs)."""
    statuses = (pod.get("status") or {}).get("initContainerStatuses") or []
    by_name = {st.get("name"): st for st in statuses if isinstance(st, dict)}
    for name in names:
        term = ((by_name.get(name) or {}).get("state") or {}).get("terminated")
        if not term or term.get("exitCode") != 0:
            return False
    return True
