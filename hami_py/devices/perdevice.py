"""A per-filter charge for families whose devices are charged a value of their own.

The kernel charges every device of a request row the same memory and cores (the row's, or what a
:class:`~hami_py.devices.base.Charger` says for that node). Two families charge per device:

* AWS Neuron charges a **core mask** (core 0 = 1, core 1 = 2, both = 3), and which mask a
  one-core request gets depends on which core of the device is still free;
* AMD charges **compute units**: a percentage of each device's own CU count.

Such a family sets both ``FLAG_CHARGE`` and ``FLAG_CHOOSE`` and uses one :class:`DeviceCharge` per
filter for both hooks. For each node and request row the kernel first calls the charger (which
tells this object which row, hence which container, is being fitted) and gets back values that
never exceed the real charge of any device, so the kernel's own checks refuse only devices the
family would refuse too; after the kernel's walk the chooser sees every device that passed and
applies the exact rule, device by device, including what the pod's earlier containers took on that
node. ``settle`` finally gives each chosen device its exact charge, so the decision's annotations
and the reservation carry the same values.

The chooser the kernel calls is the :class:`DeviceCharge` the family's charger built for the
same filter (``ChoiceAsk.charger``, see :class:`PerDeviceCharging`).
"""
from __future__ import annotations

from hami_py.devices.base import Charger, ChoiceAsk, ContainerDevice
from hami_py.podshape import PodShape, pod_shape


def pod_containers(pod: dict) -> list[dict]:
    """The pod's containers, init containers first (the allocation annotations' positions)."""
    spec = pod.get("spec") or {}
    init = [c for c in spec.get("initContainers") or [] if isinstance(c, dict)]
    app = [c for c in spec.get("containers") or [] if isinstance(c, dict)]
    return init + app


class DeviceCharge(Charger):
    """One filter's per-device charges of one family (subclassed per family).

    ``asks`` maps a container position (init containers first) to the family's parsed request.
    Subclasses implement :meth:`row_charge` (the kernel's lower-bound values for a row on a node)
    and :meth:`pick` (the exact choice); the base class keeps the pod's own usage per node, as the
    kernel does: app containers and native sidecars accumulate, each ordinary init container sees
    the node as they have left it so far."""

    def __init__(self, cache, vendor_key: str, asks: dict[int, object], row_container: list[int], shape: PodShape):
        self.cache = cache
        self.vid = cache.vendor_ids[vendor_key]
        self.asks = asks
        self.row_container = row_container
        self.shape = shape
        self._row: dict[int, int] = {}                         # node -> row being fitted there
        self._app: dict[int, dict[int, list[int]]] = {}        # node -> position -> [mem, cores] of app containers
        self._picks: dict[tuple[int, int, int], tuple[int, int, object]] = {}

    # -- the kernel's hooks --------------------------------------------------------------------

    def __call__(self, node_index: int, row: int):
        self._row[node_index] = row
        return self.row_charge(node_index, self.asks[self.row_container[row]])

    def choose(self, node_index: int, positions: list[int], nums: int):
        row = self._row.get(node_index)
        if row is None:
            raise ValueError(f"chooser called for node {node_index} before its charger: not a FLAG_CHARGE row")
        container = self.row_container[row]
        ask = self.asks[container]
        if self.shape.is_init(container):
            # An ordinary init container runs beside the sidecars placed before it (app rows,
            # which come first) and adds nothing to what the app containers see.
            extra = {p: list(held) for p, held in self._app.get(node_index, {}).items()}
        else:
            extra = self._app.setdefault(node_index, {})
        answer = self.pick(node_index, ask, positions, nums, extra)
        if isinstance(answer, int):
            return answer
        for position, mem, cores, data in answer:
            held = extra.setdefault(position, [0, 0])
            held[0] += mem
            held[1] += cores
            self._picks[(node_index, container, position)] = (mem, cores, data)
        return [entry[0] for entry in answer], 0.0

    def settle(self, node_index: int, position: int, container: int, device: ContainerDevice) -> None:
        mem, cores, data = self._picks[(node_index, container, position)]
        device.usedmem, device.usedcores = mem, cores
        self.finish(node_index, position, device, data)

    # -- for the families ------------------------------------------------------------------------

    def family_positions(self, node_index: int) -> list[int]:
        """The positions of the family's devices in the node's device list."""
        off = self.cache.node_offset[node_index]
        vendor, vid = self.cache.vendor, self.vid
        return [k for k in range(len(self.cache.devices_at(node_index))) if vendor[off + k] == vid]

    def row_charge(self, node_index: int, ask) -> tuple[int, int, int] | int:
        raise NotImplementedError

    def pick(self, node_index: int, ask, positions: list[int], nums: int,
             extra: dict[int, list[int]]) -> list[tuple[int, int, int, object]] | int:
        """``nums`` of ``positions`` as (position, memory, cores, data for finish), or a reason."""
        raise NotImplementedError

    def finish(self, node_index: int, position: int, device: ContainerDevice, data) -> None:
        device.custom = data


class PerDeviceCharging:
    """The two kernel hooks of a per-device family (mixed into its DeviceVendor): the charger is
    a ``charge_type`` built from the family's parsed request (``ask(container)``) of each of the
    pod's containers, and the chooser is that charger's own ``choose`` (``ChoiceAsk.charger``)."""

    charge_type: type[DeviceCharge]

    def ask(self, container: dict):
        raise NotImplementedError

    def charger(self, cache, pod: dict, row_container: list[int]) -> DeviceCharge:
        containers = pod_containers(pod)
        asks = {}
        for position in set(row_container):
            if 0 <= position < len(containers):
                ask = self.ask(containers[position])
                if ask is not None:
                    asks[position] = ask
        return self.charge_type(cache, asks, row_container, pod_shape(pod))

    def chooser(self, cache, ask: ChoiceAsk):
        if not isinstance(ask.charger, DeviceCharge):
            raise ValueError(f"a per-device family's chooser needs its filter's DeviceCharge, got {ask.charger!r}")
        return ask.charger.choose
