"""Quantities and the vendor-neutral annotation formats: upstream's strings must decode exactly
as upstream decodes them, and everything we encode must read back unchanged."""
from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from hami_py.devices.base import AllocationDecodeError, ContainerDevice, DeviceDecodeError, DeviceInfo
from hami_py.devices.codec import (
    MigPlacement, MigProfile, check_device_id, decode_json_devices, decode_legacy_devices, decode_pod_devices,
    encode_pod_devices, go_quote, parse_go_bool, parse_go_int,
)
from hami_py.quantity import parse_exact_int, parse_quantity_ceil

H200_UUID = "GPU-1ca6d50e-73bd-0dc1-9ce8-0be2a804bec6"
UPSTREAM_UUID_A = "GPU-8dcd427f-483b-b48f-d7e5-75fb19a52b76"
UPSTREAM_UUID_B = "GPU-ebe7c3f7-303d-558d-435e-99a160631fe4"


# ---------------------------------------------------------------------------------------------
# quantities
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, exact", [
    ("10", 10), ("0", 0), ("007", 7), ("+5", 5), ("-3", -3),
    ("1k", 1000), ("1M", 10**6), ("1G", 10**9), ("2T", 2 * 10**12), ("1P", 10**15), ("1E", 10**18),
    ("1Ki", 1024), ("1Mi", 1 << 20), ("1Gi", 1073741824), ("1Ti", 1 << 40), ("1Pi", 1 << 50), ("1Ei", 1 << 60),
    ("1e3", 1000), ("1E3", 1000), ("1e+3", 1000), ("15e-1", None), ("1.5e3", 1500),
    ("500m", None), ("1.5", None), ("1000m", 1), ("1.0", 1), ("5.", 5), (".5", None),
    ("0.5Ki", 512), ("1.5Gi", 1610612736), ("1.5k", 1500), ("1n", None), ("1000000000n", 1),
    ("1u", None),
    ("9223372036854775807", 2**63 - 1), ("9223372036854775808", None), ("-9223372036854775808", -2**63),
    ("8Ei", None), ("1e19", None), ("1e999999999", None),
])
def test_parse_exact_int(text, exact):
    assert parse_exact_int(text) == exact


@pytest.mark.parametrize("garbage", [
    "", " ", " 1", "1 ", "1_000", "abc", "1x", "1KI", "1kk", "e3", "1e", "1e1.5", ".", "+", "-",
    "١٢", "１", "1\n", "0x10", "nan", "inf", None, True, False, [], {}, b"10",
])
def test_parse_exact_int_refuses_garbage(garbage):
    assert parse_exact_int(garbage) is None
    assert parse_quantity_ceil(garbage) is None


def test_parse_exact_int_accepts_numbers_from_json():
    assert parse_exact_int(10) == 10
    assert parse_exact_int(2.0) == 2
    assert parse_exact_int(1.5) is None
    assert parse_exact_int(1e20) is None  # beyond int64
    assert parse_exact_int(2**63) is None


@pytest.mark.parametrize("text, ceil", [
    ("500m", 1), ("1.5", 2), ("1.2", 2), ("-1.5", -2), ("-500m", -1), ("10", 10), ("1Gi", 1 << 30),
    ("100.1", 101), ("1e-3", 1), ("1e-999999999", 1), ("0.0000000001", 1), ("0", 0), (1.5, 2),
    ("1e999999999", None),
])
def test_parse_quantity_ceil(text, ceil):
    assert parse_quantity_ceil(text) == ceil


@given(st.integers(min_value=0, max_value=2**63 - 1))
def test_plain_integers_parse_exactly(number):
    assert parse_exact_int(str(number)) == number
    assert parse_quantity_ceil(str(number)) == number


@given(st.integers(min_value=-10**6, max_value=10**6), st.integers(min_value=1, max_value=999))
def test_milli_values_are_whole_only_when_divisible(whole, milli):
    text = f"{whole * 1000 + milli}m"
    assert parse_exact_int(text) is None
    value = whole * 1000 + milli
    magnitude = -(-abs(value) // 1000)  # rounded up, away from zero
    assert parse_quantity_ceil(text) == (magnitude if value > 0 else -magnitude)


# ---------------------------------------------------------------------------------------------
# Go scalar helpers
# ---------------------------------------------------------------------------------------------

def test_go_quote_matches_go_percent_q():
    assert go_quote("GPU-x") == '"GPU-x"'
    assert go_quote('a"b\\c') == '"a\\"b\\\\c"'
    assert go_quote("a\nb\tc\x00") == '"a\\nb\\tc\\x00"'
    assert go_quote("é") == '"é"'


def test_parse_go_int_is_strict():
    assert parse_go_int("42", -10, 100) == 42
    assert parse_go_int("+42", -10, 100) == 42
    assert parse_go_int("-7", -10, 100) == -7
    for bad in ["", " 1", "1 ", "1_0", "٣", "1.0", "0x1"]:
        assert parse_go_int(bad, -10, 100) is None
    assert parse_go_int("101", -10, 100) is None
    assert parse_go_int("0" * 5000 + "7", 0, 10) == 7
    assert parse_go_int("9" * 5000, 0, 10) is None


def test_parse_go_bool_accepts_exactly_go_spellings():
    for text in ["1", "t", "T", "TRUE", "true", "True"]:
        assert parse_go_bool(text) is True
    for text in ["0", "f", "F", "FALSE", "false", "False"]:
        assert parse_go_bool(text) is False
    for text in ["yes", "tRUE", "", " true", "on"]:
        assert parse_go_bool(text) is None


# ---------------------------------------------------------------------------------------------
# pod allocation lists
# ---------------------------------------------------------------------------------------------

def dev(uuid=H200_UUID, type_="NVIDIA", mem=5000, cores=30):
    return ContainerDevice(uuid=uuid, type=type_, usedmem=mem, usedcores=cores)


def test_encode_pod_devices_example():
    assert encode_pod_devices([[], [dev("GPU-x")]]) == ";GPU-x,NVIDIA,5000,30:;"


def test_encode_pod_devices_several_devices_and_containers():
    pod = [[dev(UPSTREAM_UUID_A, mem=500, cores=3)], [dev(UPSTREAM_UUID_B, mem=500, cores=3)]]
    assert encode_pod_devices(pod) == (
        f"{UPSTREAM_UUID_A},NVIDIA,500,3:;{UPSTREAM_UUID_B},NVIDIA,500,3:;")
    assert encode_pod_devices([[dev("a", mem=1, cores=2), dev("b", mem=3, cores=4)]]) == "a,NVIDIA,1,2:b,NVIDIA,3,4:;"
    assert encode_pod_devices([]) == ""
    assert encode_pod_devices([[]]) == ";"


@pytest.mark.parametrize("bad", [
    dev(uuid="GPU,x"), dev(uuid="GPU:x"), dev(uuid="GPU;x"), dev(type_="NV:IDIA"),
    dev(mem=2**31), dev(cores=-2**31 - 1), dev(mem="5"), dev(uuid=""), dev(type_=""), dev(mem=-1), dev(cores=-1),
    ContainerDevice("u", "T", 1, 2, slots=2**31),
])
def test_encode_pod_devices_refuses_values_the_format_cannot_carry(bad):
    with pytest.raises(ValueError):
        encode_pod_devices([[bad]])


def test_decode_upstream_annotation():
    text = f"{UPSTREAM_UUID_A},NVIDIA,500,3:;{UPSTREAM_UUID_B},NVIDIA,500,3:;"
    assert decode_pod_devices(text) == [[dev(UPSTREAM_UUID_A, mem=500, cores=3)],
                                        [dev(UPSTREAM_UUID_B, mem=500, cores=3)]]


def test_decode_trims_exactly_one_trailing_slot():
    # upstream would return three slots for two containers; the last one is the final ';'
    assert decode_pod_devices(";GPU-x,NVIDIA,5000,30:;") == [[], [dev("GPU-x")]]
    assert decode_pod_devices(";;") == [[], []]
    assert decode_pod_devices(";") == [[]]
    assert decode_pod_devices("") == []


def test_decode_without_final_separator_keeps_every_slot():
    assert decode_pod_devices("GPU-x,NVIDIA,5000,30:") == [[dev("GPU-x")]]
    assert decode_pod_devices("GPU-x,NVIDIA,5000,30") == [[dev("GPU-x")]]
    assert decode_pod_devices("a,NVIDIA,1,2:;b,NVIDIA,3,4") == [[dev("a", mem=1, cores=2)], [dev("b", mem=3, cores=4)]]


def test_decode_skips_empty_items_and_ignores_fields_past_the_slots():
    assert decode_pod_devices("GPU-x,NVIDIA,5000,30,extra,fields:::;") == [[dev("GPU-x")]]


def test_the_slots_of_a_device_are_a_fifth_field_written_only_above_one():
    """HAMi #2877: ``UUID,Type,mem,cores,slots:`` when a device holds several slots; an
    unparsable (or not positive) fifth field is ignored: one slot."""
    several = ContainerDevice("GPU-x", "Enflame", 20480, 50, slots=3)
    assert encode_pod_devices([[several, dev("GPU-y")]]) == "GPU-x,Enflame,20480,50,3:GPU-y,NVIDIA,5000,30:;"
    assert encode_pod_devices([[ContainerDevice("GPU-x", "NVIDIA", 5000, 30, slots=1)]]) == "GPU-x,NVIDIA,5000,30:;"
    assert decode_pod_devices("GPU-x,Enflame,20480,50,3:;") == [[several]]
    for fifth in ("x", "0", "-2", "", " 3", "2147483648"):
        assert decode_pod_devices(f"GPU-x,NVIDIA,5000,30,{fifth}:;")[0][0].slots == 1, fifth


@pytest.mark.parametrize("text, message", [
    ("junk:GPU-x,NVIDIA,5000,30:;", 'malformed container device annotation segment: "junk": container 0'),
    (";,NVIDIA,5000,30:;", 'pod annotation format error, missing device UUID: container 1 device ",NVIDIA,5000,30"'),
    ("GPU-x,,5000,30:;", 'pod annotation format error, missing device type: container 0 device "GPU-x,,5000,30"'),
    ("GPU-x,NVIDIA,-1,30:;", 'memory field must not be negative: -1: container 0 device "GPU-x,NVIDIA,-1,30"'),
    ("GPU-x,NVIDIA,5000,-1:;", 'core field must not be negative: -1: container 0 device "GPU-x,NVIDIA,5000,-1"'),
])
def test_decode_errors_say_which_segment_and_field(text, message):
    """HAMi #2765's refusals, each naming the container and the device text."""
    with pytest.raises(AllocationDecodeError) as err:
        decode_pod_devices(text)
    assert str(err.value) == message


@pytest.mark.parametrize("device_id", ["", "GPU-a,b", "GPU:a", "GPU;a"])
def test_a_registered_device_id_no_allocation_list_can_carry_is_refused(device_id):
    """Checked as a registration is decoded, so no decision ever names such a device."""
    with pytest.raises(DeviceDecodeError, match="no pod's allocation annotation can carry"):
        check_device_id(device_id)
    check_device_id("GPU-a_b.c/d")


def test_decode_missing_fields_error():
    with pytest.raises(AllocationDecodeError) as err:
        decode_pod_devices(";uuid,type,100:;")
    assert str(err.value) == (
        "pod annotation format error, missing fields, do not use nodeName in task spec: "
        'container 1 device "uuid,type,100" has 3 fields, want <uuid>,<type>,<usedmem>,<usedcores>')


@pytest.mark.parametrize("text, message", [
    ("GPU-x,NVIDIA,abc,30:;",
     'invalid memory field: container 0 device "GPU-x,NVIDIA,abc,30": "abc" is not a 32-bit integer'),
    (";GPU-x,NVIDIA,5000,3.5:;",
     'invalid core field: container 1 device "GPU-x,NVIDIA,5000,3.5": "3.5" is not a 32-bit integer'),
    ("GPU-x,NVIDIA,2147483648,0:;",
     'invalid memory field: container 0 device "GPU-x,NVIDIA,2147483648,0": "2147483648" is not a 32-bit integer'),
    ("GPU-x,NVIDIA, 5,0:;",
     'invalid memory field: container 0 device "GPU-x,NVIDIA, 5,0": " 5" is not a 32-bit integer'),
])
def test_decode_bad_numbers(text, message):
    with pytest.raises(AllocationDecodeError) as err:
        decode_pod_devices(text)
    assert str(err.value) == message


def test_decode_accepts_int32_extremes_and_signs():
    assert decode_pod_devices("u,T,+0,+2147483647:;") == [[dev("u", "T", 0, 2**31 - 1)]]
    assert decode_pod_devices("u,T,-0,0:;") == [[dev("u", "T", 0, 0)]]


token = st.text(st.characters(blacklist_characters=",:;", blacklist_categories=("Cs",)), min_size=1, max_size=12)
count = st.integers(min_value=0, max_value=2**31 - 1)
device_strategy = st.builds(ContainerDevice, uuid=token, type=token, usedmem=count, usedcores=count,
                            slots=st.integers(min_value=1, max_value=2**31 - 1))


@given(st.lists(st.lists(device_strategy, max_size=4), max_size=6))
def test_pod_devices_round_trip(pod):
    assert decode_pod_devices(encode_pod_devices(pod)) == pod


# ---------------------------------------------------------------------------------------------
# JSON inventory
# ---------------------------------------------------------------------------------------------

H200_JSON = ('[{"id":"GPU-1ca6d50e-73bd-0dc1-9ce8-0be2a804bec6","count":10,"devmem":143771,'
             '"devcore":100,"type":"NVIDIA H200","health":true,"mode":"hami-core"}]')


def test_decode_json_h200():
    assert decode_json_devices(H200_JSON) == [DeviceInfo(
        id=H200_UUID, index=0, count=10, devmem=143771, devcore=100, type="NVIDIA H200", numa=0,
        mode="hami-core", health=True)]


def test_decode_json_upstream_example_and_bytes():
    text = (b'[{"id":"GPU-0","count":10,"devmem":8192,"devcore":100,"type":"NVIDIA-A100",'
            b'"numa":0,"health":true,"index":0,"mode":"hami-core"}]')
    [device] = decode_json_devices(text)
    assert (device.id, device.count, device.devmem, device.type, device.health) == ("GPU-0", 10, 8192, "NVIDIA-A100", True)


def test_decode_json_defaults_for_omitted_fields():
    [device] = decode_json_devices('[{"id":"GPU-a","count":10,"devmem":1024,"devcore":100,"type":"NVIDIA"}]')
    assert device.health is False  # omitted health: unusable
    assert device.mode == ""       # omitted mode is "", not hami-core
    assert device.numa == 0 and device.index == 0 and device.mig_profiles == [] and device.custom == {}


def test_decode_json_keys_are_case_insensitive_and_unknown_keys_ignored():
    [device] = decode_json_devices(
        '[{"ID":"GPU-a","Count":4,"DEVMEM":2048,"DevCore":100,"Type":"NVIDIA T4","Health":true,'
        '"NUMA":1,"Index":3,"Mode":"mps","migtemplate":[{"whatever":1}],"devicevendor":"x","extra":[1,2]}]')
    assert device == DeviceInfo(id="GPU-a", index=3, count=4, devmem=2048, devcore=100, type="NVIDIA T4",
                                numa=1, mode="mps", health=True)


def test_decode_json_null_fields_keep_zero_values():
    [device] = decode_json_devices('[{"id":"GPU-a","count":null,"health":null,"mode":null}]')
    assert (device.count, device.health, device.mode) == (0, False, "")


def test_decode_json_null_and_empty():
    assert decode_json_devices("null") == []
    assert decode_json_devices("[]") == []


def test_decode_json_mig_profiles_and_custom_info():
    [device] = decode_json_devices(
        '[{"id":"' + H200_UUID + '","count":7,"devmem":143771,"devcore":100,"type":"NVIDIA H200",'
        '"mode":"mig","health":true,"custominfo":{"AIC":"1"},"migProfiles":['
        '{"name":"1g.18gb","memoryMB":16384,"core":14,"sliceCount":1,'
        '"placements":[{"start":0,"size":1},{"start":6,"size":1}]},'
        '{"name":"7g.141gb","MemoryMB":143360,"core":100,"slicecount":8,"placements":[{"Start":0,"SIZE":8}]}]}]')
    assert device.mig_profiles == [
        MigProfile("1g.18gb", 16384, 14, 1, [MigPlacement(0, 1), MigPlacement(6, 1)]),
        MigProfile("7g.141gb", 143360, 100, 8, [MigPlacement(0, 8)]),
    ]
    assert device.custom == {"AIC": "1"}


@pytest.mark.parametrize("text, message", [
    ('{"id":"GPU-a"}', "expected a JSON array of devices, got object"),
    ('"GPU-a"', 'expected a JSON array of devices, got string "GPU-a"'),
    ("[null]", "device 0: expected an object, got null"),
    ('[{"id":"a"}, 5]', "device 1: expected an object, got number 5"),
    ('[{"count":"10"}]', 'device 0: field "count": expected an integer (int32), got string "10"'),
    ('[{"count":10.0}]', 'device 0: field "count": expected an integer (int32), got number 10.0'),
    ('[{"devmem":2147483648}]', 'device 0: field "devmem": 2147483648 is out of range for int32'),
    ('[{"devcore":true}]', 'device 0: field "devcore": expected an integer (int32), got boolean true'),
    ('[{"index":-1}]', 'device 0: field "index": -1 is out of range for uint'),
    ('[{"numa":"0"}]', 'device 0: field "numa": expected an integer (int), got string "0"'),
    ('[{"health":"true"}]', 'device 0: field "health": expected true or false, got string "true"'),
    ('[{"id":5}]', 'device 0: field "id": expected a string, got number 5'),
    ('[{"type":["NVIDIA"]}]', 'device 0: field "type": expected a string, got array'),
    ('[{"mode":1}]', 'device 0: field "mode": expected a string, got number 1'),
    ('[{"devicevendor":1}]', 'device 0: field "devicevendor": expected a string, got number 1'),
    ('[{"custominfo":[]}]', 'device 0: field "custominfo": expected an object, got array'),
    ('[{"migProfiles":{}}]', 'device 0: field "migProfiles": expected an array, got object'),
    ('[{"migProfiles":[{"name":"1g.18gb","placements":[{"start":0,"size":-1}]}]}]',
     'device 0: field "migProfiles[0].placements[0].size": -1 is out of range for uint32'),
    ('[{"migProfiles":[{"memoryMB":"16gb"}]}]',
     'device 0: field "migProfiles[0].memoryMB": expected an integer (int32), got string "16gb"'),
    ('[{"migProfiles":[null]}]', 'device 0: field "migProfiles[0]": expected an object, got null'),
])
def test_decode_json_errors_name_device_and_field(text, message):
    with pytest.raises(DeviceDecodeError) as err:
        decode_json_devices(text)
    assert str(err.value) == message


def test_decode_json_syntax_error():
    with pytest.raises(DeviceDecodeError, match=r"^invalid JSON: "):
        decode_json_devices('[{"id":')


# ---------------------------------------------------------------------------------------------
# legacy colon/comma inventory
# ---------------------------------------------------------------------------------------------

P4_UUID = "GPU-ebe7c3f7-303d-558d-435e-99a160631fe4"


def test_decode_legacy_seven_fields():
    assert decode_legacy_devices(f"{P4_UUID},10,7680,100,NVIDIA-Tesla P4,0,true:") == [DeviceInfo(
        id=P4_UUID, index=0, count=10, devmem=7680, devcore=100, type="NVIDIA-Tesla P4", numa=0,
        mode="hami-core", health=True)]


def test_decode_legacy_nine_fields_and_several_devices():
    text = (f"{H200_UUID},10,143771,100,NVIDIA H200,0,true,0,hami-core:"
            f"{P4_UUID},10,7680,100,NVIDIA-Tesla P4,1,False,1,mig:")
    first, second = decode_legacy_devices(text)
    assert (first.id, first.devmem, first.type, first.index, first.mode) == (H200_UUID, 143771, "NVIDIA H200", 0, "hami-core")
    assert (second.numa, second.health, second.index, second.mode) == (1, False, 1, "mig")


def test_decode_legacy_skips_empty_segments():
    assert decode_legacy_devices(":") == []
    assert decode_legacy_devices("::") == []
    assert len(decode_legacy_devices(f"::{P4_UUID},10,7680,100,NVIDIA-Tesla P4,0,true::")) == 1


@pytest.mark.parametrize("text, message", [
    (f"{P4_UUID},10,7680,100,NVIDIA-Tesla P4,0,true", "node annotation missing device separator"),
    ("", "node annotation missing device separator"),
    ("GPU-x:", 'malformed node annotation segment: "GPU-x"'),
    (f"{P4_UUID},10,7680,100,NVIDIA-Tesla P4,0,true,1:", "unexpected field count 8 in node annotation"),
    ("a,b:", "unexpected field count 2 in node annotation"),
    (f"{P4_UUID},notanint,7680,100,NVIDIA-Tesla P4,0,true:",
     'invalid count field: strconv.ParseInt: parsing "notanint": invalid syntax'),
    (f"{P4_UUID},10,notanint,100,NVIDIA-Tesla P4,0,true:",
     'invalid memory field: strconv.ParseInt: parsing "notanint": invalid syntax'),
    (f"{P4_UUID},10,7680,notanint,NVIDIA-Tesla P4,0,true:",
     'invalid core field: strconv.ParseInt: parsing "notanint": invalid syntax'),
    (f"{P4_UUID},10,99999999999,100,NVIDIA-Tesla P4,0,true:",
     'invalid memory field: strconv.ParseInt: parsing "99999999999": value out of range'),
    (f"{P4_UUID},10,7680,100,NVIDIA-Tesla P4,notanint,true:",
     'invalid numa field: strconv.Atoi: parsing "notanint": invalid syntax'),
    (f"{P4_UUID},10,7680,100,NVIDIA-Tesla P4,0,yes:",
     'invalid health field: strconv.ParseBool: parsing "yes": invalid syntax'),
    # upstream checks health before numa
    (f"{P4_UUID},10,7680,100,NVIDIA-Tesla P4,x,yes:",
     'invalid health field: strconv.ParseBool: parsing "yes": invalid syntax'),
    (f"{P4_UUID},10,7680,100,NVIDIA-Tesla P4,0,true,notanint,hami-core:",
     'invalid index field: strconv.Atoi: parsing "notanint": invalid syntax'),
    (f"{P4_UUID},10,7680,100,NVIDIA-Tesla P4,0,true,-1,hami-core:", "index field must not be negative: -1"),
])
def test_decode_legacy_errors_are_upstreams(text, message):
    with pytest.raises(DeviceDecodeError) as err:
        decode_legacy_devices(text)
    assert str(err.value) == message
