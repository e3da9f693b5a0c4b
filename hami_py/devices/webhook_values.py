"""The webhook's check that a container's resource values are integers in a range.

Upstream's webhook refuses a pod whose count, memory, percentage or cores is not an integer in
the family's range (HAMi after v2.10: #2740, #2789, #3012, #3179), each family over its own
resources, in limits and requests or in limits only, in upstream's words. One reading of those
values here, so that the families differ only in what they check, never in how.
"""
from __future__ import annotations

from typing import Callable, Iterable

from hami_py.devices.base import RequestError
from hami_py.devices.template import integer_between
from hami_py.quantity import parse_exact_int

# (resource name, lowest, highest): "" as a name checks nothing (a family's unset resource).
Check = tuple[str, int, int]
# Upstream's words for a refused value, when a family has its own: (resource, value) -> message.
Refusal = Callable[[str, object], str]


def checked_integers(container: str, checks: Iterable[Check], *places: dict, first_only: bool = False,
                     refusal: Refusal | None = None) -> dict[str, int]:
    """Each checked resource present in ``places`` (limits, requests: the order upstream reads)
    must be an integer in its range; with ``first_only`` only the value upstream reads (the first
    place holding it) is checked. The values read, by resource (the first place's).

    Raises RequestError naming the container, the resource and the value (``integer_between``'s
    words), or ``refusal``'s words."""
    values: dict[str, int] = {}
    for resource, low, high in checks:
        if not resource:
            continue
        for place in places:
            if resource not in place:
                continue
            raw = place[resource]
            if refusal is None:
                value = integer_between(container, resource, raw, low, high)
            else:
                value = parse_exact_int(raw)
                if value is None or not low <= value <= high:
                    raise RequestError(refusal(resource, raw))
            values.setdefault(resource, value)
            if first_only:
                break
    return values
