"""Failure reasons, as small integers for the kernel and as upstream's strings for FailedNodes.

kube-scheduler users read these strings in `kubectl describe pod` events, and HAMi's own tooling
parses them (``"<count>/<total> <Reason>"``), so the spelling is upstream's, letter for letter.
"""
from __future__ import annotations

OK = 0
CARD_NOT_HEALTH = 1
CARD_CORDONED = 2
CARD_TYPE_MISMATCH = 3
NUMA_NOT_FIT = 4
CARD_UUID_MISMATCH = 5
CARD_TIME_SLICING_EXHAUSTED = 6
EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT = 7
RESOURCE_QUOTA_NOT_FIT = 8
CARD_INSUFFICIENT_MEMORY = 9
CARD_INSUFFICIENT_CORE = 10
CARD_COMPUTE_UNITS_EXHAUSTED = 11
CARD_MIG_TOPOLOGY_INFEASIBLE = 12
ALLOCATED_CARDS_INSUFFICIENT_REQUEST = 13
CARD_NOT_FOUND_CUSTOM_FILTER_RULE = 14
MODE_NOT_FIT = 15
N_DEVICE_REASONS = 16

NAMES = {
    CARD_NOT_HEALTH: "CardNotHealth",
    CARD_CORDONED: "CardCordoned",
    CARD_TYPE_MISMATCH: "CardTypeMismatch",
    NUMA_NOT_FIT: "NumaNotFit",
    CARD_UUID_MISMATCH: "CardUuidMismatch",
    CARD_TIME_SLICING_EXHAUSTED: "CardTimeSlicingExhausted",
    EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT: "ExclusiveDeviceAllocateConflict",
    RESOURCE_QUOTA_NOT_FIT: "ResourceQuotaNotFit",
    CARD_INSUFFICIENT_MEMORY: "CardInsufficientMemory",
    CARD_INSUFFICIENT_CORE: "CardInsufficientCore",
    CARD_COMPUTE_UNITS_EXHAUSTED: "CardComputeUnitsExhausted",
    CARD_MIG_TOPOLOGY_INFEASIBLE: "CardMigTopologyInfeasible",
    ALLOCATED_CARDS_INSUFFICIENT_REQUEST: "AllocatedCardsInsufficientRequest",
    CARD_NOT_FOUND_CUSTOM_FILTER_RULE: "CardNotFoundCustomFilterRule",
    MODE_NOT_FIT: "ModeNotFit",
}

# Whole-node failures (the kernel reports these instead of per-device counts).
NODE_FIT = 0
NODE_DEVICE_REASONS = 1          # the per-device counts explain it
NODE_INSUFFICIENT_DEVICE = 2     # fewer candidate devices than the request's count
NODE_UNREGISTERED = 3            # not in the cache (candidate index -1)

NODE_INSUFFICIENT_DEVICE_TEXT = "NodeInsufficientDevice"
NODE_UNREGISTERED_TEXT = "node unregistered"


def gen_reason(counts: dict[int, int], total: int) -> str:
    """Format per-device failure counts the way upstream's GenReason does.

    Each entry is ``"<count>/<total> <Reason>"``; entries are sorted as whole strings (so by the
    count prefix first, lexicographically) and joined with ``", "``.
    """
    parts = sorted(f"{c}/{total} {NAMES[r]}" for r, c in counts.items() if c > 0)
    return ", ".join(parts)
