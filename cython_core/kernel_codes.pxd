# The numbers the fit kernel and the Python side must agree on, written once.
#
# ``fit_kernel.pyx`` cimports this file and exports every name below in ``_kernel.CODES``;
# ``hami_py/reasons.py`` and ``hami_py/kernel_codes.py`` take their values from there (the
# reference and the device base read those two), so nothing else repeats a number. ``tests/test_kernel.py`` reads
# this file and fails when a name is missing from CODES or the built kernel is older than it.
# Add a name: here, in the CODES dict of fit_kernel.pyx, and where Python reads it.

cdef enum:
    # Per-device failure reasons (counts in out_reasons; upstream's strings in hami_py.reasons).
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
    CARD_QOS_POLICY_MISMATCH = 16        # Metax sGPU: the card's tasks hold another QoS policy
    CARD_APP_CLASS_MISMATCH = 17         # Metax sGPU: the card's tasks are of another app class
    N_DEVICE_REASONS = 18

    # Whole-node outcomes (out_status).
    NODE_FIT = 0
    NODE_DEVICE_REASONS = 1          # the per-device counts explain it
    NODE_INSUFFICIENT_DEVICE = 2     # fewer candidate devices than the request's count
    NODE_UNREGISTERED = 3            # not in the cache (candidate index -1)

    # A request row: ROW_WIDTH int32 values, at these offsets.
    ROW_WIDTH = 7
    ROW_CONTAINER = 0
    ROW_IS_INIT = 1
    ROW_VENDOR = 2
    ROW_NUMS = 3
    ROW_MEMREQ = 4
    ROW_MEMPCT = 5
    ROW_CORESREQ = 6
    MEMPCT_UNSET = 101

    # Node policy, and device orderings: single policies are small numbers; a chain of up to
    # three sort keys is ORDER_CHAIN + k0 + CHAIN_BASE*k1 + CHAIN_BASE**2*k2 with the KEY_* below,
    # 0 = end. POLICY_FRAG (fragmentation-aware) scores a node by what the placement costs the
    # cluster's whole devices and stranded memory (docs/FRAGMENTATION.md); KEY_FRAG orders a
    # node's devices by the same cost.
    POLICY_BINPACK = 0
    POLICY_SPREAD = 1
    POLICY_FRAG = 2
    ORDER_BINPACK = 0
    ORDER_SPREAD = 1
    ORDER_MUTEX = 2
    ORDER_CHAIN = 64
    KEY_BINPACK = 1
    KEY_SPREAD = 2
    KEY_NUMA = 3
    KEY_FRAG = 4
    CHAIN_BASE = 8

    # Device combinations weighed for one topology-aware pick.
    MAX_TOPOLOGY_COMBOS = 20000

    # MIG: placements one GPU's joint plan may try (upstream's migSearchBudget, HAMi #2855), and
    # the instances one plan holds at most (a slice mask has 64 bits).
    MIG_SEARCH_BUDGET = 4096
    MAX_MIG_INSTANCES = 64

    # Per-vendor rule flags (query.vendor_flags; DeviceVendor.kernel_flags).
    FLAG_EXCLUSIVE = 1     # a device already hosting a task takes no other
    FLAG_EQUAL_SHARE = 2   # a shared device takes only tasks of the memory size it already hosts
    FLAG_CHOOSE = 4        # collect every fitting device, the vendor's chooser picks
    FLAG_CHARGE = 8        # the vendor's charger says, per node, what one device of the row costs
    FLAG_SLOTS_FIRST = 16  # a device must have all the row's slots free before memory is checked
