"""The device config file: upstream's schema and zero-value rules, the chart defaults, and
one-line errors that name the file, line and field."""
from __future__ import annotations

from pathlib import Path

import subprocess
import sys

import pytest
import yaml

from hami_py.config import (
    CHART_DEFAULT_DEVICE_CONFIG, ConfigError, DeviceConfig, load_device_config, parse_device_config,
)
from hami_py.devices.nvidia import MigProfileAllowlistEntry, NvidiaConfig, nvidia_config
from hami_py.devices.registry import FamilySwitches, build_vendors, config_sections

FIXTURE = Path(__file__).parent.parent / "manifests" / "device-config.yaml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "device-config.yaml"
    path.write_text(text)
    return path


def error_of(tmp_path: Path, text: str) -> str:
    """The message for a file that the loader, or one of the families reading it, refuses."""
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        build_vendors(load_device_config(path), FamilySwitches(enable_ascend=True, enable_iluvatar=True))
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    return message[len(f"{path}: "):]


# ---------------------------------------------------------------------------------------------
# chart defaults
# ---------------------------------------------------------------------------------------------

def test_the_shipped_manifest_carries_the_built_in_default():
    """One document, two places: the package's default and the ConfigMap ``kubectl apply`` ships."""
    configmap = next(d for d in yaml.safe_load_all(FIXTURE.read_text()) if d and d.get("kind") == "ConfigMap")
    shipped = configmap["data"]["device-config.yaml"]
    assert parse_device_config(shipped) == DeviceConfig.default()
    body = lambda text: [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]  # noqa: E731
    assert body(shipped) == body(CHART_DEFAULT_DEVICE_CONFIG)


def test_chart_default_nvidia_section():
    nvidia = nvidia_config(DeviceConfig.default())
    assert (nvidia.resource_count_name, nvidia.resource_memory_name, nvidia.resource_memory_percentage_name,
            nvidia.resource_core_name, nvidia.resource_priority_name) == (
        "nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores",
        "nvidia.com/priority")
    assert (nvidia.overwrite_env, nvidia.default_memory, nvidia.default_cores, nvidia.default_gpu_num,
            nvidia.memory_factor, nvidia.disable_core_limit, nvidia.gpu_core_policy, nvidia.runtime_class_name) == (
        False, 0, 0, 1, 1, False, "default", "")
    assert (nvidia.device_split_count, nvidia.device_memory_scaling, nvidia.device_core_scaling,
            nvidia.pre_configured_device_memory, nvidia.enable_numa_topology, nvidia.lib_cuda_log_level) == (
        10, 1.0, 1.0, 0, False, "1")
    assert MigProfileAllowlistEntry(["H200 NVL", "H200-SXM5"], ["1g.18gb", "2g.35gb", "3g.71gb", "7g.141gb"]) \
        in nvidia.mig_profile_allowlist
    assert len(nvidia.mig_profile_allowlist) == 9


def test_chart_default_sections():
    others = DeviceConfig.default().sections
    assert set(others) == {"nvidia", "cambricon", "hygon", "metax", "enflame", "mthreads", "iluvatars", "kunlun",
                           "awsneuron", "amd", "vastai", "biren", "vnpus"}
    assert others["hygon"] == {"resourceCountName": "hygon.com/hcunum", "resourceMemoryName": "hygon.com/hcumem",
                               "resourceCoreName": "hygon.com/hcucores", "memoryFactor": 1}
    assert [c["commonWord"] for c in others["vnpus"]["configs"]] == [
        "Ascend910A", "Ascend910B2", "Ascend910B3", "Ascend910B4-1", "Ascend910B4", "Ascend310P", "Ascend910C"]
    assert [i["commonWord"] for i in others["iluvatars"]] == ["MR-V100", "MR-V50", "BI-V150", "BI-V100"]


def test_every_family_declares_its_section_once():
    """A family's section is declared beside its build_family (CONFIG_SECTION) and reaches the
    file reader through the registry: the chart's sections are exactly the families'."""
    names = [section.name for section in config_sections()]
    assert len(names) == len(set(names))
    # remote GPUs are off in HAMi's chart (devices.remotegpu.enabled: false): no default section
    assert set(names) - {"remotegpu"} == set(DeviceConfig.default().sections)


def test_reading_a_file_needs_the_families_declarations_and_the_chart_default_does_not():
    code = ("from hami_py.config import DeviceConfig, parse_device_config\n"
            "assert 'nvidia' in DeviceConfig.default().sections\n"
            "parse_device_config('nvidia: {resourceCountName: x}')\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.rstrip().endswith("import hami_py.devices.registry before reading a device config")


def test_default_returns_independent_copies():
    first = DeviceConfig.default()
    first.sections["nvidia"]["migProfileAllowlist"].clear()
    assert len(nvidia_config(DeviceConfig.default()).mig_profile_allowlist) == 9


# ---------------------------------------------------------------------------------------------
# schema rules
# ---------------------------------------------------------------------------------------------

def test_missing_keys_are_zero_values_not_chart_defaults(tmp_path):
    config = load_device_config(write(tmp_path, "nvidia:\n  resourceCountName: nvidia.com/gpu\n"))
    nvidia = nvidia_config(config)
    assert nvidia == NvidiaConfig(resource_count_name="nvidia.com/gpu")
    assert nvidia.default_gpu_num == 0 and nvidia.memory_factor == 0
    assert nvidia.device_split_count is None
    assert config.sections == {"nvidia": {"resourceCountName": "nvidia.com/gpu"}}   # as written: it round-trips


def test_unknown_keys_are_ignored_and_keys_are_case_sensitive(tmp_path):
    config = load_device_config(write(tmp_path, (
        "nvidia:\n  resourceCountName: nvidia.com/gpu\n  ResourceMemoryName: ignored\n  futureKey: {a: 1}\n"
        "someOtherVendor:\n  x: 1\n")))
    assert nvidia_config(config).resource_memory_name == ""
    assert "someOtherVendor" not in config.sections


def test_scalars_fill_string_fields_with_their_text(tmp_path):
    config = load_device_config(write(tmp_path, (
        "nvidia:\n  resourceCountName: nvidia.com/gpu\n  libCudaLogLevel: 4\n  runtimeClassName: 0x10\n"
        "  gpuCorePolicy: force\n  resourcePriorityName:\n")))
    nvidia = nvidia_config(config)
    assert nvidia.lib_cuda_log_level == "4"
    assert nvidia.runtime_class_name == "0x10"
    assert nvidia.gpu_core_policy == "force"
    assert nvidia.resource_priority_name == ""


def test_typed_values(tmp_path):
    config = load_device_config(write(tmp_path, (
        "nvidia:\n  overwriteEnv: yes\n  defaultMemory: 4096\n  defaultCores: 2.0\n  memoryFactor: 1024\n"
        "  disableCoreLimit: true\n  deviceSplitCount: 20\n  deviceMemoryScaling: 1.5\n  deviceCoreScaling: 2\n"
        "  preConfiguredDeviceMemory: 131072\n  enableNumaTopology: true\n")))
    nvidia = nvidia_config(config)
    assert nvidia.overwrite_env is True  # YAML 1.1 "yes", as yaml.v2 reads it
    assert (nvidia.default_memory, nvidia.default_cores, nvidia.memory_factor) == (4096, 2, 1024)
    assert nvidia.disable_core_limit is True and nvidia.enable_numa_topology is True
    assert (nvidia.device_split_count, nvidia.device_memory_scaling, nvidia.device_core_scaling) == (20, 1.5, 2.0)
    assert nvidia.pre_configured_device_memory == 131072


def test_only_first_document_is_read(tmp_path):
    config = load_device_config(write(tmp_path, "nvidia:\n  defaultGPUNum: 3\n---\nnvidia: [broken\n"))
    assert nvidia_config(config).default_gpu_num == 3


def test_other_vendor_section_alone_is_enough(tmp_path):
    config = load_device_config(write(tmp_path, "hygon:\n  resourceCountName: hygon.com/dcunum\n"))
    assert nvidia_config(config) == NvidiaConfig()
    assert config.sections == {"hygon": {"resourceCountName": "hygon.com/dcunum"}}


# ---------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "", "# nothing\n", "nvidia:\n", "nvidia: {}\ncambricon: {}\n", "nvidia:\n  overwriteEnv: false\n",
    "iluvatars: []\nvnpus:\n  hamiVnpuCore: true\n", "amd:\n  unknownKey: x\n", "hygon:\n  memoryFactor: 0\n",
])
def test_all_empty(tmp_path, text):
    assert error_of(tmp_path, text) == "all configurations are empty"


# HAMi after v2.10 (#3010): values no request could use, and two backends claiming one resource,
# stop the scheduler at start, every problem named in one line.
NV = "nvidia:\n  resourceCountName: nvidia.com/gpu\n"
CORES_150 = "nvidia: defaultCores is a percentage and must be between 0 and 100, got 150"
BOTH_CLAIM = 'NVIDIA and {} both claim resource "{}"; a container requesting it would be allocated devices by both'


@pytest.mark.parametrize("text, problems", [
    (NV + "  defaultCores: 150\n", [CORES_150]),
    (NV + "  defaultCores: -1\n", ["nvidia: defaultCores is a percentage and must be between 0 and 100, got -1"]),
    (NV + "  defaultMemory: -1\n", ["nvidia: defaultMemory must not be negative, got -1"]),
    (NV + "  memoryFactor: -2\n", ["nvidia: memoryFactor must not be negative, got -2"]),
    ("hygon:\n  resourceCountName: hygon.com/dcunum\n  memoryFactor: -1\n",
     ["hygon: memoryFactor must not be negative, got -1"]),
    ("vnpus:\n  configs:\n    - {commonWord: Ascend910B3, resourceName: huawei.com/Ascend910B3, memoryFactor: -4}\n",
     ["vnpus Ascend910B3: memoryFactor must not be negative, got -4"]),
    (NV + "cambricon:\n  resourceCountName: nvidia.com/gpu\n", [BOTH_CLAIM.format("MLU", "nvidia.com/gpu")]),
    # two backends of one family too (Metax's whole cards and sGPUs)
    ("metax:\n  resourceCountName: metax-tech.com/gpu\n  resourceVCountName: metax-tech.com/gpu\n",
     ['Metax-GPU and Metax-SGPU both claim resource "metax-tech.com/gpu"; '
      "a container requesting it would be allocated devices by both"]),
    (NV + "  defaultCores: 150\n  defaultMemory: -5\nhygon:\n  resourceCountName: nvidia.com/gpu\n  memoryFactor: -1\n",
     [CORES_150, "nvidia: defaultMemory must not be negative, got -5", "hygon: memoryFactor must not be negative, got -1",
      BOTH_CLAIM.format("HCU", "nvidia.com/gpu")]),    # the section's names are the HCU generation's
])
def test_unusable_values_stop_the_scheduler_naming_every_problem(tmp_path, text, problems):
    assert error_of(tmp_path, text) == "invalid device configuration: " + "; ".join(problems)


def test_the_bounds_themselves_are_usable(tmp_path):
    for text in (NV + "  defaultCores: 0\n  defaultMemory: 0\n  memoryFactor: 0\n", NV + "  defaultCores: 100\n"):
        vendors = build_vendors(load_device_config(write(tmp_path, text)))
        assert vendors["NVIDIA"].request_resources()[0] == "nvidia.com/gpu"


def test_missing_file(tmp_path):
    path = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError) as err:
        load_device_config(path)
    assert str(err.value) == f"{path}: cannot read device config: No such file or directory"


def test_not_utf8(tmp_path):
    path = tmp_path / "device-config.yaml"
    path.write_bytes(b"nvidia:\n  resourceCountName: \xff\n")
    with pytest.raises(ConfigError, match=r": not UTF-8 text \(byte 29\)$"):
        load_device_config(path)


def test_yaml_syntax_error_names_line(tmp_path):
    message = error_of(tmp_path, "nvidia:\n  resourceCountName: nvidia.com/gpu\n  bad: [unclosed\n")
    assert message.startswith("line 4, column 1: YAML syntax error: ")
    message = error_of(tmp_path, "nvidia:\n  a: b: c\n")
    assert message == "line 2, column 7: YAML syntax error: mapping values are not allowed here"


@pytest.mark.parametrize("text, message", [
    ("- nvidia\n", "line 1: expected a mapping of vendor sections, got list"),
    ("nvidia: 5\n", "line 1: nvidia: expected a mapping, got integer"),
    ("nvidia:\n  resourceCountName: nvidia.com/gpu\n  defaultMemory: abc\n",
     'line 3: nvidia.defaultMemory: expected an integer, got string "abc"'),
    ("nvidia:\n  defaultMemory: 1.5\n", 'line 2: nvidia.defaultMemory: expected an integer, got number "1.5"'),
    ("nvidia:\n  defaultCores: true\n", 'line 2: nvidia.defaultCores: expected an integer, got boolean "true"'),
    ("nvidia:\n  memoryFactor: 3000000000\n",
     "line 2: nvidia.memoryFactor: 3000000000 is out of range for int32 (-2147483648..2147483647)"),
    ("nvidia:\n  deviceSplitCount: -1\n",
     "line 2: nvidia.deviceSplitCount: -1 is out of range for uint (0..18446744073709551615)"),
    ("nvidia:\n  overwriteEnv: \"false\"\n", 'line 2: nvidia.overwriteEnv: expected true or false, got string "false"'),
    ("nvidia:\n  resourceCountName: [a, b]\n", "line 2: nvidia.resourceCountName: expected a string, got list"),
    ("nvidia:\n  deviceMemoryScaling: lots\n",
     'line 2: nvidia.deviceMemoryScaling: expected a number, got string "lots"'),
    ("nvidia:\n  migProfileAllowlist: {models: [A30]}\n",
     "line 2: nvidia.migProfileAllowlist: expected a list of {models, profiles} entries, got mapping"),
    ("nvidia:\n  migProfileAllowlist:\n    - models: [A30]\n",
     "line 3: nvidia.migProfileAllowlist[0]: MIG profile allowlist entry must define models and profiles"),
    ("nvidia:\n  migProfileAllowlist:\n    - {models: [A30], profiles: []}\n",
     "line 3: nvidia.migProfileAllowlist[0]: MIG profile allowlist entry must define models and profiles"),
    ("nvidia:\n  migProfileAllowlist:\n    - {models: [A30], profiles: [1g.6gb]}\n"
     "    - models: [H200 NVL]\n      profiles: [1g.18gb, 3x.71gb]\n",
     "line 5: nvidia.migProfileAllowlist[1].profiles[1]: invalid MIG profile '3x.71gb': expected <n>g.<memory>, e.g. 1g.18gb"),
    ("nvidia:\n  migProfileAllowlist:\n    - {models: [A30], profiles: [g.6gb]}\n",
     "line 3: nvidia.migProfileAllowlist[0].profiles[0]: invalid MIG profile 'g.6gb': expected <n>g.<memory>, e.g. 1g.18gb"),
    ("nvidia:\n  migProfileAllowlist:\n    - {models: [A30], profiles: [1g6gb]}\n",
     "line 3: nvidia.migProfileAllowlist[0].profiles[0]: invalid MIG profile '1g6gb': expected <n>g.<memory>, e.g. 1g.18gb"),
    ("nvidia:\n  migProfileAllowlist:\n    - {models: A30, profiles: [1g.6gb]}\n",
     "line 3: nvidia.migProfileAllowlist[0].models: expected a list of strings, got string"),
    ("nvidia:\n  resourceCountName: x\niluvatars: {a: 1}\n", "line 3: iluvatars: expected a list, got mapping"),
    ("nvidia:\n  resourceCountName: x\nhygon: [a]\n", "line 3: hygon: expected a mapping, got list"),
])
def test_errors_name_line_and_field(tmp_path, text, message):
    assert error_of(tmp_path, text) == message


def test_valid_unusual_mig_profiles_pass(tmp_path):
    config = load_device_config(write(tmp_path, (
        "nvidia:\n  migProfileAllowlist:\n    - {models: [A100], profiles: [1g.5gb+me, 10g., xg.x]}\n")))
    assert nvidia_config(config).mig_profile_allowlist == [MigProfileAllowlistEntry(["A100"], ["1g.5gb+me", "10g.", "xg.x"])]


def test_parse_device_config_names_its_source():
    with pytest.raises(ConfigError) as err:
        nvidia_config(parse_device_config("nvidia:\n  defaultGPUNum: many\n", "configmap hami-scheduler-device"))
    assert str(err.value) == ('configmap hami-scheduler-device: line 2: nvidia.defaultGPUNum: '
                              'expected an integer, got string "many"')


# ---------------------------------------------------------------------------------------------
# the readers every family uses
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, message", [
    ("cambricon:\n  resourceCountName: cambricon.com/vmlu\n  resourceCoreName: [a]\n",
     "line 3: cambricon.resourceCoreName: expected a string, got list"),
    ("hygon:\n  resourceCountName: hygon.com/dcunum\n  memoryFactor: \"4\"\n",
     'line 3: hygon.memoryFactor: expected an integer, got string "4"'),
    ("kunlun:\n  resourceCountName: 7\n", 'line 2: kunlun.resourceCountName: expected a string, got integer "7"'),
    ("enflame:\n  resourceNameGCU: true\n", 'line 2: enflame.resourceNameGCU: expected a string, got boolean "true"'),
    ("iluvatars:\n  - commonWord: MR-V100\n  - commonWord: MR-V100\n",
     "line 3: iluvatars[1].commonWord: 'MR-V100' is already used by an earlier entry"),
    ("vnpus:\n  configs:\n    - commonWord: Ascend910B3\n      templates:\n        - name: vir05\n"
     "          memory: 16g\n", 'line 6: vnpus.configs[0].templates[0].memory: expected an integer, got string "16g"'),
])
def test_family_errors_name_line_and_field(tmp_path, text, message):
    assert error_of(tmp_path, text) == message


def test_a_config_built_in_memory_names_no_file():
    config = DeviceConfig(sections={"hygon": {"memoryFactor": 1.5}})
    with pytest.raises(ConfigError) as err:
        config.section("hygon").int32("memoryFactor")
    assert str(err.value) == 'device config: hygon.memoryFactor: expected an integer, got number "1.5"'


def test_section_readers():
    config = parse_device_config(
        "vnpus:\n  hamiVnpuCore: yes\n  configs:\n    - {commonWord: a, memoryFactor: 2.0, chipName: 910}\n    -\n",
        "f.yaml")
    vnpus = config.section("vnpus")
    assert vnpus.bool("hamiVnpuCore") is True and vnpus.bool("absent") is False
    first, second = vnpus.sections("configs")
    assert first.name == "vnpus.configs[0]" and first.int32("memoryFactor") == 2
    assert first.str("chipName") == "910"          # a scalar's text, as yaml.v2 fills a string
    assert vnpus.str("configs", 0, "commonWord") == "a"
    assert second.is_null and second.str("commonWord") == "" and second.int64("memoryCapacity") == 0
    assert config.section("cambricon").is_null and config.section("cambricon").str_list("x") == []
    with pytest.raises(ConfigError, match=r'^f.yaml: line 4: vnpus.configs\[0\].chipName: expected a string, '
                                          r'got integer "910"$'):
        first.str("chipName", only_strings=True)
    with pytest.raises(ConfigError, match=r"^f.yaml: line 2: vnpus.hamiVnpuCore: expected a mapping, got boolean$"):
        vnpus.section("hamiVnpuCore")
    with pytest.raises(ConfigError, match=r"^f.yaml: line 4: vnpus.configs: expected a mapping, got list$"):
        vnpus.str("configs", "x")


def test_a_plugin_only_key_set_to_zero_is_a_configuration(tmp_path):
    """The device plugin's keys are pointers upstream: present at all, the section is not empty."""
    assert nvidia_config(load_device_config(write(tmp_path, "nvidia:\n  deviceSplitCount: 0\n"))).device_split_count == 0


def test_a_configmap_given_as_the_device_config_says_which_key_holds_it():
    """manifests/device-config.yaml is the ConfigMap the Deployment mounts; passed as the file
    itself (as a user trying the scheduler locally would), the error says what it is and what to
    do, not upstream's "all configurations are empty" (issue 36)."""
    shipped = Path(__file__).resolve().parent.parent / "manifests" / "device-config.yaml"
    with pytest.raises(ConfigError) as caught:
        load_device_config(shipped)
    message = str(caught.value)
    assert "is a Kubernetes ConfigMap (hami-system/hami-scheduler-device)" in message
    assert "data key 'device-config.yaml'" in message and "--device-config-file out" in message
    assert "empty" not in message
