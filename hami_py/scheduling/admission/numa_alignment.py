"""``hami.io/numa-alignment``: a pod's opt-in to the NUMA refit (scheduling/verbs/refit.py).

HAMi's device plugin (after v2.10) asks the scheduler to refit a container's devices when kubelet's
Topology Manager allows others, but only for pods carrying this annotation:

* ``best-effort``: refit when it can; an allocation whose refit fails goes ahead as kubelet chose;
* ``strict``: an allocation whose refit fails fails.

Values are read case-insensitively, surrounding blanks ignored, as upstream reads them. Any other
value is refused at admission, so a typo is seen at ``kubectl apply`` and not as a pod that was
never aligned.
"""
from __future__ import annotations

NUMA_ALIGNMENT_ANNOTATION = "hami.io/numa-alignment"
NUMA_ALIGNMENTS = ("best-effort", "strict")


def numa_alignment(annotations: dict[str, str] | None) -> str | None:
    """The pod's alignment mode, None when it asks for none; ValueError for a value that is neither."""
    value = (annotations or {}).get(NUMA_ALIGNMENT_ANNOTATION)
    if value is None:
        return None
    mode = str(value).strip().lower()
    if mode not in NUMA_ALIGNMENTS:
        raise ValueError(f"invalid {NUMA_ALIGNMENT_ANNOTATION} annotation {value!r}: expected "
                         f"{' or '.join(NUMA_ALIGNMENTS)}")
    return mode
