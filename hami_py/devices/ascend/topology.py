"""Which NPUs of a node a container gets: 910C module pairs and NetworkID groups.

The kernel hands the Ascend chooser every NPU of the node that passed upstream's generic checks
for one request row, in the policy's preferred order (upstream's walk order). Upstream's rules,
applied to that list:

* ``Ascend910C`` with ``superPod`` asking for more than one NPU: an NPU's module is ``index // 2``
  and only modules whose two NPUs both fit are taken, whole, until the request is met. The result
  must have exactly the requested size (an odd request never does): else
  ``AllocatedCardsInsufficientRequest``. Without ``superPod`` a 910C is counted NPU by NPU, as any
  other kind (HAMi #2853: the webhook already only pairs behind that gate, and an odd request it
  let through could then fit nowhere).
* Topology mode (an ``Ascend910*`` kind whose every NPU on the node registers a ``NetworkID``):
  all of them when exactly the request fit; the first one for a single NPU; otherwise NPUs are
  taken network by network, the networks with most fitting NPUs first.
* Anything else: the first ``nums``, which is upstream's first-fit walk.

The node's score adjustment is upstream's ScoreNode term for the row: 10 × the share of the
chosen NPUs on their most common network (0 when one of them has no ``NetworkID``).

Where upstream leaves the order to Go's map iteration (modules of equal fill, networks of equal
size) we take the one holding the most preferred NPU first, so the policy's order decides and
the answer is reproducible. Every function is linear in the candidates, so the work per node is
bounded by its NPU count.
"""
from __future__ import annotations

from typing import Sequence

ASCEND910_PREFIX = "Ascend910"
ASCEND910C = "Ascend910C"
NETWORK_ID_KEY = "NetworkID"
NETWORK_WEIGHT = 10
NPUS_PER_MODULE = 2


def network_id_of(custom: dict) -> int | None:
    """The device's ``NetworkID`` as upstream groups by it (a JSON number, truncated to an int),
    None when the registration has none. Registrations with a non-number are refused at decode."""
    value = custom.get(NETWORK_ID_KEY)
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value)


def module_pairs(candidates: Sequence[tuple[int, int]], nums: int) -> list[int] | None:
    """910C: ``candidates`` are (position, NPU index) in preferred order. The positions of the
    first ``nums // 2`` modules whose two NPUs (indices 2m and 2m+1) are both candidates, or None
    when fewer exist or ``nums`` is odd (a whole number of modules can never equal it)."""
    if nums <= 0 or nums % NPUS_PER_MODULE:
        return None
    first_at: dict[int, int] = {}            # NPU index -> first position holding it
    for position, index in candidates:
        first_at.setdefault(index, position)
    chosen: list[int] = []
    done: set[int] = set()
    for _, index in candidates:
        module = index // NPUS_PER_MODULE
        if module in done:
            continue
        low, high = module * NPUS_PER_MODULE, module * NPUS_PER_MODULE + 1
        if low in first_at and high in first_at:
            done.add(module)
            chosen.append(first_at[low])
            chosen.append(first_at[high])
            if len(chosen) == nums:
                return chosen
    return None


def network_groups(candidates: Sequence[tuple[int, int]], nums: int) -> list[int]:
    """Topology mode: ``candidates`` are (position, NetworkID) in preferred order. Up to ``nums``
    positions taken network by network, the networks with most candidates first (ties: the one
    whose first candidate comes first), each network's candidates in preferred order."""
    groups: dict[int, list[int]] = {}
    for position, network in candidates:
        groups.setdefault(network, []).append(position)
    ordered = sorted(groups.values(), key=len, reverse=True)   # stable: first appearance breaks ties
    chosen: list[int] = []
    for members in ordered:
        for position in members:
            chosen.append(position)
            if len(chosen) == nums:
                return chosen
    return chosen


def concentration_score(networks: Sequence[int | None]) -> float:
    """Upstream's ScoreNode term for one container: 10 × (most NPUs on one network) / NPUs; 0 for
    no NPU or when one of them has no NetworkID."""
    if not networks or any(n is None for n in networks):
        return 0.0
    counts: dict[int, int] = {}
    for network in networks:
        counts[network] = counts.get(network, 0) + 1
    return NETWORK_WEIGHT * max(counts.values()) / len(networks)


def choose(common_word: str, positions: Sequence[int], nums: int, *, index_of: Sequence[int],
           network_of: Sequence[int | None], topology: bool, pairs: bool = True) -> list[int] | None:
    """The positions a row of ``nums`` NPUs gets among the fitting ``positions`` (preferred order),
    or None when no acceptable choice exists. ``index_of[k]`` / ``network_of[k]`` are the
    registered index and NetworkID of position ``k``; ``topology`` says whether every NPU of this
    kind on the node has a NetworkID; ``pairs`` whether a 910C's NPUs go by module (``superPod``)."""
    if nums <= 0 or len(positions) < nums:
        return None
    if common_word == ASCEND910C and pairs and nums > 1:
        return module_pairs([(k, index_of[k]) for k in positions], nums)
    if topology and len(positions) > nums and nums > 1:
        return network_groups([(k, network_of[k]) for k in positions], nums)
    return list(positions[:nums])


def score(common_word: str, chosen: Sequence[int], network_of: Sequence[int | None]) -> float:
    """The node-score adjustment for one row's choice (``Ascend910*`` kinds only)."""
    if not common_word.startswith(ASCEND910_PREFIX):
        return 0.0
    return concentration_score([network_of[k] for k in chosen])
