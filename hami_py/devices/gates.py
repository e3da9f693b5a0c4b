"""Device gates shared by the families: the pod annotations that pick or avoid devices.

Upstream's semantics, for every family: a "use" list (comma separated, entries trimmed) admits
only the device ids it names, a "no-use" list refuses them; a blank annotation imposes nothing.
Type lists match the upper-cased device model by substring. Gates are built once per filter
from the pod's annotations and then cost one call per device, or one per kind of device when
they depend on the model and mode alone (``per_kind``).
"""
from __future__ import annotations

from hami_py.devices.base import DeviceInfo, DeviceSelector
from hami_py.reasons import CARD_CORDONED, CARD_TYPE_MISMATCH, CARD_UUID_MISMATCH, OK


def non_blank(annotations: dict[str, str], key: str | None) -> str | None:
    """The annotation's value when it is present and not blank (blank means no constraint)."""
    if not key:
        return None
    value = annotations.get(key)
    if value is None or not value.strip():
        return None
    return value


def type_entries(value: str | None) -> tuple[str, ...] | None:
    """A type list upper-cased once; blank entries are dropped (they match nothing upstream)."""
    if value is None:
        return None
    return tuple(entry.strip().upper() for entry in value.split(",") if entry.strip())


def uuid_entries(value: str | None) -> frozenset[str] | None:
    if value is None:
        return None
    return frozenset(entry.strip() for entry in value.split(","))


def make_type_gate(use: tuple[str, ...] | None, nouse: tuple[str, ...] | None, mode: str | None = None):
    """A function device -> allowed by a use/no-use type list and, for NVIDIA, the mode text."""
    upper_of: dict[str, str] = {}  # device type -> upper-cased, computed once per distinct type

    def type_allowed(device: DeviceInfo) -> bool:
        if mode is not None and device.mode not in mode:
            return False  # the pod's mode text must contain the device's mode ("" always does)
        if use is None and nouse is None:
            return True
        model = upper_of.get(device.type)
        if model is None:
            model = upper_of[device.type] = device.type.upper()
        if use is not None and not any(entry in model for entry in use):
            return False
        return nouse is None or not any(entry in model for entry in nouse)

    return type_allowed


def make_selector(cordoned: frozenset[str] | None, type_allowed,
                  use_uuids: frozenset[str] | None, nouse_uuids: frozenset[str] | None) -> DeviceSelector:
    """One gate in upstream's order (cordon, type, UUID), so the reason counted is upstream's."""
    def select(device: DeviceInfo) -> int:
        if cordoned is not None and device.id in cordoned:
            return CARD_CORDONED
        if type_allowed is not None and not type_allowed(device):
            return CARD_TYPE_MISMATCH
        if use_uuids is not None and device.id not in use_uuids:
            return CARD_UUID_MISMATCH
        if nouse_uuids is not None and device.id in nouse_uuids:
            return CARD_UUID_MISMATCH
        return OK

    # Without cordons and UUID lists the answer depends on the device's model and mode alone.
    select.per_kind = cordoned is None and use_uuids is None and nouse_uuids is None
    return select


def uuid_selector(pod_annotations: dict[str, str], use_keys: tuple[str, ...], nouse_keys: tuple[str, ...],
                  *, use_type: str | None = None, nouse_type: str | None = None) -> DeviceSelector | None:
    """The gate of a family selected by UUID (several annotation families may be read: Kunlun
    reads two) and optionally by type; None when the pod sets none of them."""
    use = [v for k in use_keys if (v := non_blank(pod_annotations, k)) is not None]
    nouse = [v for k in nouse_keys if (v := non_blank(pod_annotations, k)) is not None]
    use_t = non_blank(pod_annotations, use_type)
    nouse_t = non_blank(pod_annotations, nouse_type)
    if not use and not nouse and use_t is None and nouse_t is None:
        return None
    type_allowed = None
    if use_t is not None or nouse_t is not None:
        type_allowed = make_type_gate(type_entries(use_t), type_entries(nouse_t))
    use_set = frozenset().union(*map(uuid_entries, use)) if use else None
    nouse_set = frozenset().union(*map(uuid_entries, nouse)) if nouse else None
    if len(use) > 1:
        # Every "use" list present must admit the device (upstream checks each family in turn).
        sets = [uuid_entries(v) for v in use]
        inner = make_selector(None, type_allowed, None, nouse_set)

        def select_all(device: DeviceInfo) -> int:
            if any(device.id not in s for s in sets):
                return CARD_UUID_MISMATCH
            return inner(device)

        select_all.per_kind = False
        return select_all
    return make_selector(None, type_allowed, use_set, nouse_set)
