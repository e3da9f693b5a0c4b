"""What one /filter asks the fit kernel, and where the kernel writes its answer.

The kernel (``_kernel.filter_nodes`` and its reference ``kernel_ref.filter_nodes``) takes two
objects: the device table (the usage cache's columns, read as attributes named in
:data:`TABLE_COLUMNS`) and a :class:`FitQuery`. Forty-odd positional arguments drifted between
the caller, the reference, the Cython build, the tests and the bench at every new rule; named
slots do not, and a new per-filter input is one slot here instead of an edit in five call sites.
"""
from __future__ import annotations

from array import array
from typing import Sequence

from hami_py import reasons as R
from hami_py.devices.base import Charger, Chooser

# The device table's columns the kernel reads (UsageCache attributes; see its _DEVICE_COLUMNS
# and the per-node and MIG profile arrays). Any object with these attributes will do.
TABLE_COLUMNS = (
    "total_mem", "total_cores", "count", "numa", "health", "vendor", "used_mem", "used_cores", "used",
    "node_offset", "node_len", "pair_score", "node_pair_offset",
    "dev_mig", "mig_used", "mig_prof_off", "mig_prof_len", "prof_mem", "prof_core",
    "prof_place_off", "prof_place_len", "place_mask",
)

# The answer: per candidate node, then per device given to the winner.
OUTPUTS = ("out_status", "out_reasons", "out_total", "out_score",
           "out_row", "out_dev", "out_mem", "out_cores", "out_prof", "out_place", "out_slots", "out_count")

_NO_MASK = array("b")   # read only: an empty mask means no device is masked
_NO_RANK = array("i")   # read only: no profile preferred
_ZERO_I, _ZERO_Q, _ZERO_D = array("i", [0]), array("q", [0]), array("d", [0.0])
_N_REASONS = R.N_DEVICE_REASONS

_INPUTS = (
    "candidates", "rows", "mask", "node_policy", "gpu_policy", "numa_bind", "mutex",
    "w_slot", "w_core", "w_mem", "quota_mem", "quota_cores", "topology", "mig_ok",
    "vendor_flags", "choosers", "chargers", "prof_rank",
)


class FitQuery:
    """One filter's inputs and outputs.

    Inputs: ``candidates`` (node indexes, -1 for a name the cache does not know), ``rows`` (the
    pod's request rows, ``kernel_codes.ROW_WIDTH`` int32 each), ``mask`` (a reason code per device
    the pod may not use, empty when none), the policies, the per-vendor quota headroom, and per
    vendor id ``vendor_flags`` (``DeviceVendor.kernel_flags``) and ``choosers`` (a
    :data:`~hami_py.devices.base.Chooser` for the FLAG_CHOOSE vendors of the request, else None)
    and ``chargers`` (a :data:`~hami_py.devices.base.Charger` for its FLAG_CHARGE vendors), and
    ``prof_rank``: the pod's order of partition profiles, a rank per entry of the table's profile
    list (1 = most preferred, 0 = not named; ``DeviceVendor.partition_ranks``), empty when the
    pod states none (the profiles are then tried smallest first).

    Outputs, allocated zeroed for ``len(candidates)`` nodes and ``devices`` given devices (the
    request's total count): per candidate ``out_status``, ``out_total``, ``out_score`` and
    ``N_DEVICE_REASONS`` counts in ``out_reasons``; for the winner, one entry per device given in
    ``out_row``, ``out_dev``, ``out_mem``, ``out_cores``, ``out_prof``, ``out_place``, ``out_slots``,
    and in ``out_count[0]`` how many of those entries are given (at most the request's total
    count: a charger may size a row smaller on the winner, ``devices.base.Charger``).
    """

    __slots__ = _INPUTS + OUTPUTS

    def __init__(self, candidates: array, rows: array, devices: int, *, vendor_flags: array,
                 choosers: Sequence[Chooser | None], quota_mem: array, quota_cores: array,
                 mask: array | None = None, node_policy: int = 0, gpu_policy: int = 0,
                 numa_bind: bool = False, mutex: bool = False,
                 weights: tuple[float, float, float] = (1.0, 1.0, 1.0),
                 topology: bool = False, mig_ok: bool = True,
                 chargers: Sequence[Charger | None] | None = None, prof_rank: array | None = None):
        self.candidates = candidates
        self.rows = rows
        self.mask = _NO_MASK if mask is None else mask
        self.node_policy = node_policy
        self.gpu_policy = gpu_policy
        self.numa_bind = numa_bind
        self.mutex = mutex
        self.w_slot, self.w_core, self.w_mem = weights
        self.quota_mem = quota_mem
        self.quota_cores = quota_cores
        self.topology = topology
        self.mig_ok = mig_ok
        self.vendor_flags = vendor_flags
        self.choosers = choosers
        self.chargers = choosers if chargers is None else chargers   # any list: read only for FLAG_CHARGE
        self.prof_rank = _NO_RANK if prof_rank is None else prof_rank
        self._allocate(len(candidates), devices)

    def _allocate(self, n: int, k: int) -> None:
        # Repeating a one-element zero array is the quickest way to a zeroed one (several times
        # quicker than from bytes), and this runs once per filter.
        if k < 1:
            k = 1
        self.out_status = _ZERO_I * n
        self.out_reasons = _ZERO_I * (n * _N_REASONS)
        self.out_total = _ZERO_I * n
        self.out_score = _ZERO_D * n
        self.out_row = _ZERO_I * k
        self.out_dev = _ZERO_I * k
        self.out_mem = _ZERO_Q * k
        self.out_cores = _ZERO_I * k
        self.out_prof = _ZERO_I * k
        self.out_place = _ZERO_I * k
        self.out_slots = _ZERO_I * k
        self.out_count = _ZERO_I * 1

    def clone(self) -> FitQuery:
        """The same inputs with zeroed outputs of its own (to run another kernel on them)."""
        copy = object.__new__(FitQuery)
        for name in _INPUTS:
            setattr(copy, name, getattr(self, name))
        copy._allocate(len(self.candidates), len(self.out_row))
        return copy

    def outputs(self) -> dict[str, list]:
        """Every output as a list (to compare two kernels' answers)."""
        return {name: list(getattr(self, name)) for name in OUTPUTS}
