"""The fragmentation-aware policy's rules in plain Python: part of the kernel's specification.

The reference kernel (``kernel_ref``) calls these where the policy is asked for (``KEY_FRAG`` in a device
ordering chain, ``POLICY_FRAG`` as the node policy), and ``cython_core/fit_kernel.pyx`` mirrors
them function for function (hypothesis keeps the two equal, tests/test_kernel.py). The formulas,
their reasons and a worked example are in docs/FRAGMENTATION.md.
"""
from __future__ import annotations

from hami_py.kernel_codes import CHAIN_BASE, ORDER_CHAIN


def has_key(gpu_policy, key):
    """Whether a device ordering is a chain holding ``key``."""
    if gpu_policy < ORDER_CHAIN:
        return False
    code = gpu_policy - ORDER_CHAIN
    while code:
        if code % CHAIN_BASE == key:
            return True
        code //= CHAIN_BASE
    return False


def stranded_memory(total_mem, total_cores, count, used, used_mem, used_cores):
    """A device's stranded memory (MiB): free, on a device out of slots or cores, so that no
    request can use it. The simulator reports the same figure (simulate/results.py)."""
    if count == 0 or total_mem == 0:
        return 0
    free = total_mem - used_mem
    if free <= 0 or (count - used >= 1 and (total_cores == 0 or used_cores < total_cores)):
        return 0
    return free


def stranded_fraction(total_mem, total_cores, count, used, used_mem, used_cores):
    """``stranded_memory`` as a share of the device's memory."""
    if total_mem == 0:
        return 0.0
    return stranded_memory(total_mem, total_cores, count, used, used_mem, used_cores) / total_mem


def frag_device_cost(total_mem, total_cores, count, used, used_mem, used_cores, mem, cores, slots):
    """What giving one device the request costs what comes next (docs/FRAGMENTATION.md), the
    smaller the better: 4 when it breaks a whole device (nobody uses it yet); plus twice the
    memory the placement leaves stranded (``stranded_fraction`` after it); plus the memory it
    leaves free, as a share of the device's (the tightest fit keeps larger holes for larger
    requests). Each term but the first is at most 1 (3 together), so breaking a whole device
    always costs most. The memory stranded is the memory left free on a device the request leaves
    out of slots or cores."""
    cost = 4.0 if used == 0 else 0.0
    if count == 0 or total_mem == 0:
        return cost
    after_used, after_mem, after_cores = used + slots, used_mem + mem, used_cores + cores
    free = total_mem - after_mem
    if free < 0:
        free = 0
    return cost + 2.0 * stranded_fraction(total_mem, total_cores, count, after_used, after_mem, after_cores) \
        + free / total_mem


def frag_node_score(off, n, table, after_used, after_mem, after_cores):
    """The fragmentation-aware node score of a placement (higher is better), from the node's
    devices before it (the table) and after it (``after_*``, per device of the node):

        fill / 10 - (2 * whole devices' value lost + stranded memory added)

    The value of a node's whole free devices is the square of their number, per family (vendor
    id): breaking one of four costs 16 - 9 = 7, the only one of a node 1, so placements break
    whole devices where fewest are left, and nodes with several stay able to take a multi-device
    pod. Stranded memory (``stranded_fraction``, in devices) changes only on the devices taken
    (on the others the two terms are equal). ``fill`` (memory used over the node's, after) prefers the fuller node
    between placements otherwise equal."""
    total_mem, total_cores, count, health, vendor = (
        table.total_mem, table.total_cores, table.count, table.health, table.vendor)
    used, used_mem, used_cores = table.used, table.used_mem, table.used_cores
    lost = 0
    stranded = 0.0
    s_mem = s_tm = 0
    for k in range(n):
        j = off + k
        if all(vendor[off + e] != vendor[j] for e in range(k)):   # the first device of its family here
            before = after = 0
            for e in range(k, n):
                if vendor[off + e] == vendor[j] and health[off + e]:
                    before += used[off + e] == 0
                    after += after_used[e] == 0
            lost += before * before - after * after
        stranded += (stranded_fraction(total_mem[j], total_cores[j], count[j], after_used[k], after_mem[k],
                                       after_cores[k])
                     - stranded_fraction(total_mem[j], total_cores[j], count[j], used[j], used_mem[j], used_cores[j]))
        s_mem += after_mem[k]
        s_tm += total_mem[j]
    fill = s_mem / s_tm if s_tm > 0 else 0.0
    return fill / 10.0 - (2.0 * lost + stranded)
