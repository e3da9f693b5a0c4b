"""The fit kernel's numbers for Python: request row layout, policies, device orderings, vendor flags.

They are ``cython_core/kernel_codes.pxd``'s, read from the built kernel (``_kernel.CODES``), so
the kernel and Python cannot disagree; ``hami_py.reasons`` holds the .pxd's other half (the
reason and node outcome codes). Production code takes its numbers from here, never from
``scheduling/kernel/reference.py``: that is the kernel's specification, read by the tests. It sits
beside ``reasons`` rather than in ``scheduling/`` because the device layer sets the vendor flags.
"""
from __future__ import annotations

from hami_py._kernel import CODES

# A request row: ROW_WIDTH int32 values, at these offsets.
ROW_WIDTH = CODES["ROW_WIDTH"]
ROW_CONTAINER, ROW_IS_INIT, ROW_VENDOR, ROW_NUMS, ROW_MEMREQ, ROW_MEMPCT, ROW_CORESREQ = (
    CODES[f"ROW_{name}"] for name in ("CONTAINER", "IS_INIT", "VENDOR", "NUMS", "MEMREQ", "MEMPCT", "CORESREQ"))
MEMPCT_UNSET = CODES["MEMPCT_UNSET"]

# Node policy (the query's ``node_policy``).
POLICY_BINPACK = CODES["POLICY_BINPACK"]
POLICY_SPREAD = CODES["POLICY_SPREAD"]
POLICY_FRAG = CODES["POLICY_FRAG"]      # fragmentation-aware: kernel_frag.frag_node_score decides

# Device orderings (the query's ``gpu_policy``). Single policies are small numbers; a chain of up
# to three sort keys (``"numa,binpack"``) is CHAIN + k0 + B*k1 + B*B*k2 (B = CHAIN_BASE) with the
# keys below, 0 = end.
ORDER_BINPACK = CODES["ORDER_BINPACK"]
ORDER_SPREAD = CODES["ORDER_SPREAD"]
ORDER_MUTEX = CODES["ORDER_MUTEX"]
ORDER_CHAIN = CODES["ORDER_CHAIN"]
KEY_BINPACK, KEY_SPREAD, KEY_NUMA = CODES["KEY_BINPACK"], CODES["KEY_SPREAD"], CODES["KEY_NUMA"]
KEY_FRAG = CODES["KEY_FRAG"]            # fragmentation-aware: kernel_frag.frag_device_cost, smallest first
CHAIN_BASE = CODES["CHAIN_BASE"]

MAX_TOPOLOGY_COMBOS = CODES["MAX_TOPOLOGY_COMBOS"]   # device combinations weighed for one topology-aware pick
MIG_SEARCH_BUDGET = CODES["MIG_SEARCH_BUDGET"]       # placements one MIG GPU's joint plan may try
MAX_MIG_INSTANCES = CODES["MAX_MIG_INSTANCES"]       # instances one MIG plan holds at most

# Per-vendor rules (query.vendor_flags, from DeviceVendor.kernel_flags; devices.base says what each means).
FLAG_EXCLUSIVE = CODES["FLAG_EXCLUSIVE"]
FLAG_EQUAL_SHARE = CODES["FLAG_EQUAL_SHARE"]
FLAG_CHOOSE = CODES["FLAG_CHOOSE"]
FLAG_CHARGE = CODES["FLAG_CHARGE"]
FLAG_SLOTS_FIRST = CODES["FLAG_SLOTS_FIRST"]

__all__ = [
    "ROW_WIDTH", "ROW_CONTAINER", "ROW_IS_INIT", "ROW_VENDOR", "ROW_NUMS", "ROW_MEMREQ", "ROW_MEMPCT", "ROW_CORESREQ",
    "MEMPCT_UNSET", "POLICY_BINPACK", "POLICY_SPREAD", "POLICY_FRAG", "ORDER_BINPACK", "ORDER_SPREAD", "ORDER_MUTEX",
    "ORDER_CHAIN", "KEY_BINPACK", "KEY_SPREAD", "KEY_NUMA", "KEY_FRAG", "CHAIN_BASE", "MAX_TOPOLOGY_COMBOS",
    "MIG_SEARCH_BUDGET", "MAX_MIG_INSTANCES",
    "FLAG_EXCLUSIVE", "FLAG_EQUAL_SHARE", "FLAG_CHOOSE", "FLAG_CHARGE", "FLAG_SLOTS_FIRST",
]
