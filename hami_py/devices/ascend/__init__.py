"""Huawei Ascend NPUs: one vendor per ``vnpus.configs`` entry, only with ``--enable-ascend``.

See :mod:`.vendor` for the annotations and the webhook, :mod:`.modes` for the three vNPU modes
(template, hami-core, ENPU) and who may share a node and an NPU, :mod:`.charger` for what an NPU
costs on each candidate node (a mode-less pod's memory, HAMi #3107), :mod:`.chooser` and
:mod:`.topology` for the choice of NPUs (oversell, 910C module pairs, NetworkID groups) and
:mod:`.config` for the ``vnpus`` section.
"""
from __future__ import annotations

from hami_py.devices.ascend.config import CONFIG_SECTION, VnpuConfig, VnpusConfig, VnpuTemplate, parse_vnpus
from hami_py.devices.ascend.vendor import AscendVendor

__all__ = ["CONFIG_SECTION", "AscendVendor", "VnpuConfig", "VnpuTemplate", "VnpusConfig", "build_family", "parse_vnpus"]


def build_family(config, switches) -> list[AscendVendor]:
    """Nothing unless ``switches.enable_ascend`` (upstream's ``--enable-ascend``); then one vendor
    per chip kind of the ``vnpus`` section, in file order.

    The section is checked even when Ascend is off, as upstream decodes the whole file at start:
    ConfigError for a malformed ``vnpus`` section either way."""
    vnpus = parse_vnpus(config.section(CONFIG_SECTION.name))
    if not switches.enable_ascend:
        return []
    names = tuple(r for chip in vnpus.configs
                  for r in (chip.resource_name, chip.resource_memory_name, chip.resource_core_name) if r)
    return [AscendVendor(chip, mode=vnpus.mode, enpu_policy=vnpus.enpu_policy, family_resources=names)
            for chip in vnpus.configs]
