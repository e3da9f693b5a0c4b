"""The text formats that carry devices between device plugins, the scheduler and pods.

Three formats, all vendor-neutral, all fixed by upstream HAMi so that its device plugins and
HAMi-core work with our scheduler unchanged:

* the per-pod allocation list (``<uuid>,<type>,<usedmem>,<usedcores>[,<slots>]:`` per device,
  ``;`` after every container), written into ``...-to-allocate`` / ``...-allocated`` pod annotations;
* the JSON device inventory that current device plugins write into node annotations;
* the older colon/comma inventory that some plugins (and older NVIDIA ones) still write.

The cache decodes every node's inventory and every pod's allocation at start-up, so these
functions avoid per-call regex compilation and per-field exception handling where they can.
Errors name exactly what is wrong (which device, which field, which value) because the text
comes from other programs and the operator has to find the culprit.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import orjson

from hami_py.devices.base import AllocationDecodeError, ContainerDevice, DeviceDecodeError, DeviceInfo, PodDevices
from hami_py.quantity import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, UINT32_MAX, UINT64_MAX

CONTAINER_SEPARATOR = ";"
DEVICE_SEPARATOR = ":"
FIELD_SEPARATOR = ","

_SIGNED_DECIMAL = re.compile(r"[+-]?[0-9]+", re.ASCII)


# ---------------------------------------------------------------------------------------------
# Go-compatible scalar parsing and quoting (the legacy formats are parsed with Go's strconv)
# ---------------------------------------------------------------------------------------------

_GO_ESCAPES = {
    '"': '\\"', "\\": "\\\\", "\a": "\\a", "\b": "\\b", "\f": "\\f",
    "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v",
}


def go_quote(text: str) -> str:
    """``text`` double-quoted the way Go's ``%q`` prints it, so messages match upstream's."""
    if text.isprintable() and '"' not in text and "\\" not in text:
        return f'"{text}"'
    out = ['"']
    for char in text:
        escaped = _GO_ESCAPES.get(char)
        if escaped is not None:
            out.append(escaped)
        elif char.isprintable():
            out.append(char)
        elif ord(char) < 0x80:
            out.append(f"\\x{ord(char):02x}")
        elif ord(char) < 0x10000:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(f"\\U{ord(char):08x}")
    out.append('"')
    return "".join(out)


def parse_go_int(text: str, low: int, high: int) -> int | None:
    """A base-10 integer as Go's ``strconv.ParseInt`` reads it, or None if malformed/out of range.

    Stricter than ``int()``: no surrounding spaces, no underscores, ASCII digits only.
    """
    if not (text.isdigit() and text.isascii()) and not _SIGNED_DECIMAL.fullmatch(text):
        return None
    if len(text) > 20:
        # Leading zeros are legal; anything longer than 20 significant digits is beyond any
        # 64-bit range (and too long for int(), which refuses several thousand digits).
        digits = text.lstrip("+-").lstrip("0") or "0"
        if len(digits) > 20:
            return None
        number = -int(digits) if text[0] == "-" else int(digits)
    else:
        number = int(text)
    return number if low <= number <= high else None


def _go_int_error(function: str, text: str) -> str:
    """The text of the error Go's strconv returns for ``text``, e.g. for upstream's messages."""
    why = "value out of range" if _SIGNED_DECIMAL.fullmatch(text) else "invalid syntax"
    return f"strconv.{function}: parsing {go_quote(text)}: {why}"


_GO_BOOLS = {
    "1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True,
    "0": False, "f": False, "F": False, "FALSE": False, "false": False, "False": False,
}


def parse_go_bool(text: str) -> bool | None:
    """``text`` as Go's ``strconv.ParseBool`` reads it, or None when Go would return an error."""
    return _GO_BOOLS.get(text)


# ---------------------------------------------------------------------------------------------
# Pod allocation lists
# ---------------------------------------------------------------------------------------------

def _has_separator(value: str) -> bool:
    return FIELD_SEPARATOR in value or DEVICE_SEPARATOR in value or CONTAINER_SEPARATOR in value


def _check_token(value: str, what: str) -> None:
    if not value:
        raise ValueError(f"device {what} is empty")
    if _has_separator(value):
        raise ValueError(f"device {what} {go_quote(value)} contains a separator (',', ':' or ';')")


def check_device_id(device_id: str) -> None:
    """A registered device's id must be writable into an allocation list: not empty (the list's
    readers refuse a device without a UUID) and no ``,``, ``:`` or ``;`` (each would shift every
    later field, device or container). Raises DeviceDecodeError: the node's registration of that
    family is refused, never a decision naming the device."""
    if not device_id:
        raise DeviceDecodeError("a device has an empty id, which no pod's allocation annotation can carry")
    if _has_separator(device_id):
        raise DeviceDecodeError(f"device id {go_quote(device_id)} contains a separator (',', ':' or ';'), "
                                "which no pod's allocation annotation can carry")


def _check_count(value: int, what: str) -> None:
    if type(value) is not int or not 0 <= value <= INT32_MAX:
        raise ValueError(f"device {what} {value!r} is not a non-negative 32-bit integer")


def encode_pod_devices(pod_devices: PodDevices) -> str:
    """A pod's allocation for one vendor as annotation text.

    Every device is ``<uuid>,<type>,<usedmem>,<usedcores>:`` and every container, empty or not,
    ends with ``;``, so position *k* of the text is container *k* (init containers first):
    ``[[], [dev]]`` gives ``;GPU-x,NVIDIA,5000,30:;``. A device holding several slots (a
    partition of several slices) carries them in a fifth field, ``<uuid>,<type>,<mem>,<cores>,<slots>:``,
    written only when above 1 (HAMi #2877), so every other allocation reads as before.

    Raises ValueError for a value the format cannot carry or that would not read back (an empty
    UUID or type, or one holding a separator; a number negative or outside int32): writing it
    would corrupt every later container's position, or fail every reader.
    """
    parts: list[str] = []
    for container in pod_devices:
        for device in container:
            _check_token(device.uuid, "uuid")
            _check_token(device.type, "type")
            _check_count(device.usedmem, "usedmem")
            _check_count(device.usedcores, "usedcores")
            if device.slots > 1:
                _check_count(device.slots, "slots")
                parts.append(f"{device.uuid},{device.type},{device.usedmem},{device.usedcores},{device.slots}:")
            else:
                parts.append(f"{device.uuid},{device.type},{device.usedmem},{device.usedcores}:")
        parts.append(CONTAINER_SEPARATOR)
    return "".join(parts)


def _decode_allocation_int(text: str, name: str, slot: int, item: str) -> int:
    number = parse_go_int(text, INT32_MIN, INT32_MAX)
    if number is None:
        raise AllocationDecodeError(
            f"invalid {name} field: container {slot} device {go_quote(item)}: "
            f"{go_quote(text)} is not a 32-bit integer")
    if number < 0:
        raise AllocationDecodeError(
            f"{name} field must not be negative: {number}: container {slot} device {go_quote(item)}")
    return number


def _decode_container(text: str, slot: int) -> list[ContainerDevice]:
    devices: list[ContainerDevice] = []
    if not text:
        return devices
    for item in text.split(DEVICE_SEPARATOR):
        if not item:
            continue  # the empty item after the last ':'
        if FIELD_SEPARATOR not in item:
            raise AllocationDecodeError(f"malformed container device annotation segment: {go_quote(item)}: "
                                        f"container {slot}")
        fields = item.split(FIELD_SEPARATOR)
        if len(fields) < 4:
            raise AllocationDecodeError(
                "pod annotation format error, missing fields, do not use nodeName in task spec: "
                f"container {slot} device {go_quote(item)} has {len(fields)} fields, "
                "want <uuid>,<type>,<usedmem>,<usedcores>")
        for position, what in ((0, "UUID"), (1, "type")):
            if not fields[position]:
                raise AllocationDecodeError(f"pod annotation format error, missing device {what}: "
                                            f"container {slot} device {go_quote(item)}")
        # The fifth field, the slots a device holds, is optional (HAMi #2877): written only when
        # above 1, and ignored when it does not read as a positive count.
        slots = parse_go_int(fields[4], 1, INT32_MAX) if len(fields) > 4 else None
        devices.append(ContainerDevice(
            uuid=fields[0],
            type=fields[1],
            usedmem=_decode_allocation_int(fields[2], "memory", slot, item),
            usedcores=_decode_allocation_int(fields[3], "core", slot, item),
            slots=slots or 1,
        ))
    return devices


def decode_pod_devices(text: str) -> PodDevices:
    """Read back an allocation list written by us or by upstream's scheduler.

    Splits on ``;`` (containers) then ``:`` (devices), upstream's rules (HAMi #2765, #2877):
    empty items are skipped; an item without ``,``, with fewer than 4 fields, an empty UUID or
    type, or a negative memory or core field is an error; a fifth field is the device's slots
    (ignored unless a positive count), later ones are ignored.

    Trailing slot: upstream's decoder turns the final ``;`` into one extra empty container
    slot. Callers align slots with containers by index, so that phantom slot would claim a
    container that does not exist; we drop exactly one trailing empty slot when the text ends
    with ``;``. Thus ``decode(encode(x)) == x``, ``";GPU-x,NVIDIA,5000,30:;"`` gives two
    slots, and ``""`` gives none. Text not ending with ``;`` keeps every slot.
    """
    if not text:
        return []
    slots = text.split(CONTAINER_SEPARATOR)
    if text[-1] == CONTAINER_SEPARATOR:
        slots.pop()
    return [_decode_container(slot_text, slot) for slot, slot_text in enumerate(slots)]


# ---------------------------------------------------------------------------------------------
# JSON device inventory
# ---------------------------------------------------------------------------------------------

@dataclass(slots=True, frozen=True)
class MigPlacement:
    """Where one MIG instance sits on its GPU: memory slices [start, start+size)."""
    start: int
    size: int


@dataclass(slots=True)
class MigProfile:
    """One MIG profile a GPU offers (e.g. ``1g.18gb``) with every placement it can take."""
    name: str = ""
    memory_mb: int = 0
    core: int = 0
    slice_count: int = 0
    placements: list[MigPlacement] = field(default_factory=list)


_JSON_TYPE_NAMES = {str: "string", bool: "boolean", int: "number", float: "number",
                    list: "array", dict: "object", type(None): "null"}


def _describe(value: object) -> str:
    """A JSON value for an error message: its JSON type and (short) text."""
    kind = _JSON_TYPE_NAMES.get(type(value), type(value).__name__)
    if value is None or isinstance(value, (list, dict)):
        return kind
    text = orjson.dumps(value).decode()
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{kind} {text}"


class _FieldError(Exception):
    """A field-level problem. Each enclosing decoder adds its step to ``path`` on the way out
    (innermost first), so the message can name the field as ``migProfiles[0].placements[1].size``."""

    def __init__(self, problem: str):
        super().__init__(problem)
        self.problem = problem
        self.path: list[str | int] = []

    def field_name(self) -> str:
        text = ""
        for step in reversed(self.path):
            text += f"[{step}]" if isinstance(step, int) else (f".{step}" if text else step)
        return text


def _json_int(value: object, low: int, high: int, kind: str) -> int:
    if type(value) is not int:
        raise _FieldError(f"expected an integer ({kind}), got {_describe(value)}")
    if not low <= value <= high:
        raise _FieldError(f"{value} is out of range for {kind}")
    return value


def _json_str(value: object) -> str:
    if type(value) is not str:
        raise _FieldError(f"expected a string, got {_describe(value)}")
    return value


def _json_bool(value: object) -> bool:
    if type(value) is not bool:
        raise _FieldError(f"expected true or false, got {_describe(value)}")
    return value


def _json_object(value: object) -> dict:
    if type(value) is not dict:
        raise _FieldError(f"expected an object, got {_describe(value)}")
    return value


def _json_array(value: object) -> list:
    if type(value) is not list:
        raise _FieldError(f"expected an array, got {_describe(value)}")
    return value


def _fold(keys: dict[str, str], key: str) -> str | None:
    """The canonical field for ``key``, matched like Go's encoding/json: exact, else any case."""
    name = keys.get(key)
    if name is None:
        name = keys.get(key.lower())
    return name


_PLACEMENT_KEYS = {"start": "start", "size": "size"}


def _decode_placement(value: object) -> MigPlacement:
    start = size = 0
    for key, item in _json_object(value).items():
        name = _fold(_PLACEMENT_KEYS, key)
        if name is None or item is None:
            continue
        try:
            number = _json_int(item, 0, UINT32_MAX, "uint32")
        except _FieldError as err:
            err.path.append(name)
            raise
        if name == "start":
            start = number
        else:
            size = number
    return MigPlacement(start, size)


_PROFILE_KEYS = {"name": "name", "memorymb": "memoryMB", "memoryMB": "memoryMB", "core": "core",
                 "slicecount": "sliceCount", "sliceCount": "sliceCount",
                 "placements": "placements"}


def _decode_profile(value: object) -> MigProfile:
    profile = MigProfile()
    for key, item in _json_object(value).items():
        name = _fold(_PROFILE_KEYS, key)
        if name is None or item is None:
            continue  # unknown keys are ignored and null leaves the zero value, as in Go
        try:
            if name == "name":
                profile.name = _json_str(item)
            elif name == "memoryMB":
                profile.memory_mb = _json_int(item, INT32_MIN, INT32_MAX, "int32")
            elif name == "core":
                profile.core = _json_int(item, INT32_MIN, INT32_MAX, "int32")
            elif name == "sliceCount":
                profile.slice_count = _json_int(item, 0, UINT32_MAX, "uint32")
            else:
                profile.placements = _decode_list(item, _decode_placement)
        except _FieldError as err:
            err.path.append(name)
            raise
    return profile


def _decode_list(value: object, decode_one) -> list:
    decoded = []
    for position, item in enumerate(_json_array(value)):
        try:
            decoded.append(decode_one(item))
        except _FieldError as err:
            err.path.append(position)
            raise
    return decoded


# Keys of the JSON inventory, lower-cased for Go-style case-insensitive matching. "migtemplate"
# is deprecated and unused by scheduling; it is ignored like an unknown key.
_DEVICE_KEYS = {"id": "id", "index": "index", "count": "count", "devmem": "devmem",
                "devcore": "devcore", "type": "type", "numa": "numa", "mode": "mode",
                "migprofiles": "migProfiles", "migProfiles": "migProfiles", "health": "health",
                "devicevendor": "devicevendor", "custominfo": "custominfo"}


def _decode_json_device(obj: object) -> DeviceInfo:
    device = DeviceInfo(id="", index=0, count=0, devmem=0, devcore=0, type="")
    if type(obj) is not dict:
        raise _FieldError(f"expected an object, got {_describe(obj)}")
    for key, value in obj.items():
        name = _fold(_DEVICE_KEYS, key)
        if name is None or value is None:
            continue  # unknown keys are ignored and null leaves the zero value, as in Go
        try:
            _set_device_field(device, name, value)
        except _FieldError as err:
            err.path.append(name)
            raise
    return device


def _set_device_field(device: DeviceInfo, name: str, value: object) -> None:
    # Integer widths follow upstream's Go struct: count/devmem/devcore are int32, numa is int
    # and index is uint (both 64-bit on the platforms HAMi ships for).
    if name == "id":
        device.id = _json_str(value)
    elif name == "count":
        device.count = _json_int(value, INT32_MIN, INT32_MAX, "int32")
    elif name == "devmem":
        device.devmem = _json_int(value, INT32_MIN, INT32_MAX, "int32")
    elif name == "devcore":
        device.devcore = _json_int(value, INT32_MIN, INT32_MAX, "int32")
    elif name == "type":
        device.type = _json_str(value)
    elif name == "health":
        device.health = _json_bool(value)
    elif name == "index":
        device.index = _json_int(value, 0, UINT64_MAX, "uint")
    elif name == "numa":
        device.numa = _json_int(value, INT64_MIN, INT64_MAX, "int")
    elif name == "mode":
        device.mode = _json_str(value)
    elif name == "migProfiles":
        device.mig_profiles = _decode_list(value, _decode_profile)
    elif name == "custominfo":
        device.custom = dict(_json_object(value))
    else:  # devicevendor: the scheduler overwrites it with the vendor key, only its type matters
        _json_str(value)


def decode_json_devices(text: str | bytes) -> list[DeviceInfo]:
    """The JSON array inventory (``[{"id":..,"count":..,...}, ...]``) as DeviceInfo objects.

    Go's ``encoding/json`` rules, because that is what upstream decodes with: keys match
    case-insensitively, unknown keys are ignored, a missing or null field keeps its zero value
    (so a device without ``"health": true`` is unhealthy and one without ``mode`` has mode
    ``""``), numbers must be integers that fit the Go field's width, and JSON ``null`` for the
    whole text means no devices. Any wrong type is an error for the whole inventory, as in Go.

    Raises DeviceDecodeError naming the device position and field.
    """
    try:
        parsed = orjson.loads(text)
    except orjson.JSONDecodeError as err:
        raise DeviceDecodeError(f"invalid JSON: {err}") from None
    if parsed is None:
        return []
    if type(parsed) is not list:
        raise DeviceDecodeError(f"expected a JSON array of devices, got {_describe(parsed)}")
    devices = []
    for position, obj in enumerate(parsed):
        try:
            devices.append(_decode_json_device(obj))
        except _FieldError as err:
            where = f'field "{err.field_name()}": ' if err.path else ""
            raise DeviceDecodeError(f"device {position}: {where}{err.problem}") from None
    return devices


# ---------------------------------------------------------------------------------------------
# Legacy colon/comma device inventory
# ---------------------------------------------------------------------------------------------

def _legacy_int(text: str, field_name: str, function: str, low: int, high: int) -> int:
    number = parse_go_int(text, low, high)
    if number is None:
        raise DeviceDecodeError(f"invalid {field_name} field: {_go_int_error(function, text)}")
    return number


def _decode_legacy_device(segment: str) -> DeviceInfo:
    if FIELD_SEPARATOR not in segment:
        raise DeviceDecodeError(f"malformed node annotation segment: {go_quote(segment)}")
    items = segment.split(FIELD_SEPARATOR)
    if len(items) not in (7, 9):
        raise DeviceDecodeError(f"unexpected field count {len(items)} in node annotation")
    # Checked in upstream's order, so the first error reported is the one upstream reports.
    count = _legacy_int(items[1], "count", "ParseInt", INT32_MIN, INT32_MAX)
    devmem = _legacy_int(items[2], "memory", "ParseInt", INT32_MIN, INT32_MAX)
    devcore = _legacy_int(items[3], "core", "ParseInt", INT32_MIN, INT32_MAX)
    health = parse_go_bool(items[6])
    if health is None:
        raise DeviceDecodeError(
            f"invalid health field: strconv.ParseBool: parsing {go_quote(items[6])}: invalid syntax")
    numa = _legacy_int(items[5], "numa", "Atoi", INT64_MIN, INT64_MAX)
    index, mode = 0, "hami-core"
    if len(items) == 9:
        index = _legacy_int(items[7], "index", "Atoi", INT64_MIN, INT64_MAX)
        if index < 0:
            raise DeviceDecodeError(f"index field must not be negative: {index}")
        mode = items[8]
    return DeviceInfo(id=items[0], index=index, count=count, devmem=devmem, devcore=devcore,
                      type=items[4], numa=numa, mode=mode, health=health)


def decode_legacy_devices(text: str) -> list[DeviceInfo]:
    """The colon/comma inventory ``<id>,<count>,<devmem>,<devcore>,<type>,<numa>,<health>[,<index>,<mode>]:``.

    Devices are separated by ``:`` and must have exactly 7 or 9 fields; 7 fields mean index 0
    and mode ``hami-core``. Empty segments are skipped, so ``":"`` is an empty inventory. The
    error messages are upstream's, word for word (operators may grep for them).
    """
    if DEVICE_SEPARATOR not in text:
        raise DeviceDecodeError("node annotation missing device separator")
    return [_decode_legacy_device(segment) for segment in text.split(DEVICE_SEPARATOR) if segment]
