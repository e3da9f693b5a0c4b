"""Failure reasons, as small integers for the kernel and as upstream's strings for FailedNodes.

kube-scheduler users read these strings in `kubectl describe pod` events, and HAMi's own tooling
parses them (``"<count>/<total> <Reason>"``), so the spelling is upstream's, letter for letter.

The numbers are the kernel's (``cython_core/kernel_codes.pxd``, exported as ``_kernel.CODES``):
written once, so the kernel and this module cannot drift apart.
"""
from __future__ import annotations

from hami_py._kernel import CODES

OK = CODES["OK"]
CARD_NOT_HEALTH = CODES["CARD_NOT_HEALTH"]
CARD_CORDONED = CODES["CARD_CORDONED"]
CARD_TYPE_MISMATCH = CODES["CARD_TYPE_MISMATCH"]
NUMA_NOT_FIT = CODES["NUMA_NOT_FIT"]
CARD_UUID_MISMATCH = CODES["CARD_UUID_MISMATCH"]
CARD_TIME_SLICING_EXHAUSTED = CODES["CARD_TIME_SLICING_EXHAUSTED"]
EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT = CODES["EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT"]
RESOURCE_QUOTA_NOT_FIT = CODES["RESOURCE_QUOTA_NOT_FIT"]
CARD_INSUFFICIENT_MEMORY = CODES["CARD_INSUFFICIENT_MEMORY"]
CARD_INSUFFICIENT_CORE = CODES["CARD_INSUFFICIENT_CORE"]
CARD_COMPUTE_UNITS_EXHAUSTED = CODES["CARD_COMPUTE_UNITS_EXHAUSTED"]
CARD_MIG_TOPOLOGY_INFEASIBLE = CODES["CARD_MIG_TOPOLOGY_INFEASIBLE"]
ALLOCATED_CARDS_INSUFFICIENT_REQUEST = CODES["ALLOCATED_CARDS_INSUFFICIENT_REQUEST"]
CARD_NOT_FOUND_CUSTOM_FILTER_RULE = CODES["CARD_NOT_FOUND_CUSTOM_FILTER_RULE"]
MODE_NOT_FIT = CODES["MODE_NOT_FIT"]
CARD_QOS_POLICY_MISMATCH = CODES["CARD_QOS_POLICY_MISMATCH"]
CARD_APP_CLASS_MISMATCH = CODES["CARD_APP_CLASS_MISMATCH"]
N_DEVICE_REASONS = CODES["N_DEVICE_REASONS"]

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
    CARD_QOS_POLICY_MISMATCH: "CardQosPolicyMismatch",      # upstream's Metax sGPU words
    CARD_APP_CLASS_MISMATCH: "CardAppClassMismatch",
}

# Whole-node failures (the kernel reports these instead of per-device counts).
NODE_FIT = CODES["NODE_FIT"]
NODE_DEVICE_REASONS = CODES["NODE_DEVICE_REASONS"]            # the per-device counts explain it
NODE_INSUFFICIENT_DEVICE = CODES["NODE_INSUFFICIENT_DEVICE"]  # fewer candidate devices than the request's count
NODE_UNREGISTERED = CODES["NODE_UNREGISTERED"]                # not in the cache (candidate index -1)

NODE_INSUFFICIENT_DEVICE_TEXT = "NodeInsufficientDevice"
NODE_UNREGISTERED_TEXT = "node unregistered"


def gen_reason(counts: dict[int, int], total: int) -> str:
    """Format per-device failure counts the way upstream's GenReason does.

    Each entry is ``"<count>/<total> <Reason>"``; entries are sorted as whole strings (so by the
    count prefix first, lexicographically) and joined with ``", "``.
    """
    parts = sorted(f"{c}/{total} {NAMES[r]}" for r, c in counts.items() if c > 0)
    return ", ".join(parts)
