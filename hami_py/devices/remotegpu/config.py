"""The device config section of remote GPUs ("lupine"), and the server nodes' label.

Upstream (HAMi after v2.10, #3004/#3013) reads ``resourceCountName``, ``resourceMemoryName``,
``defaultPort``, ``libImage`` and ``sessionImage`` into its ``RemoteGPUConfig``. The name of the
section holding them was not found in the changes we track; ``remotegpu`` follows upstream's
habit of one lower-case word per family (``awsneuron``, ``vastai``) and is documented as ours
(docs/devices/remotegpu.md). An empty count name turns the family off, as upstream: its section
is absent from the chart's default device config, so a cluster opts in.

``readServerMetrics`` (ours, default true) turns off the poll of the servers' ``/metrics``: the
offline tools (simulate, defrag) set it false, since their servers are made up or a dump's, and
their usage is what the books say.
"""
from __future__ import annotations

from dataclasses import dataclass

from hami_py.config import ConfigSection, Section

SECTION = "remotegpu"
KEYS = ("resourceCountName", "resourceMemoryName", "defaultPort", "libImage", "sessionImage", "readServerMetrics")
READ_METRICS_KEY = "readServerMetrics"
CONFIG_SECTION = ConfigSection(SECTION, KEYS)

# A node serving its GPUs over the network carries this label; its value is the port lupine
# listens on (empty, not a number or out of range: ``defaultPort``).
SERVER_LABEL = "hami.io/lupine-server"
DEFAULT_PORT = 14833


@dataclass(slots=True, frozen=True)
class RemoteGPUConfig:
    """The ``remotegpu`` section; a missing key is Go's zero value, as upstream."""
    resource_count_name: str = ""
    resource_memory_name: str = ""
    default_port: int = 0            # 0 or out of range: 14833
    lib_image: str = ""              # HAMi-core for the client pods (the webhook's injection)
    session_image: str = ""          # the leader's session stubs (hami_py/k8s/lupine_sessions.py)
    read_server_metrics: bool = True  # poll the servers' /metrics for busy cards (off offline)

    @classmethod
    def from_section(cls, section: Section) -> RemoteGPUConfig:
        return cls(resource_count_name=section.str("resourceCountName", only_strings=True),
                   resource_memory_name=section.str("resourceMemoryName", only_strings=True),
                   default_port=section.int32("defaultPort"),
                   lib_image=section.str("libImage", only_strings=True),
                   session_image=section.str("sessionImage", only_strings=True),
                   read_server_metrics=section.optional_bool(READ_METRICS_KEY) is not False)

    @property
    def port(self) -> int:
        """The port of a server whose label names none (upstream: 14833 unless 1..65535)."""
        return self.default_port if 0 < self.default_port <= 65535 else DEFAULT_PORT


def server_port(label_value: str, default: int) -> int:
    """A server node's port from its label: a whole number in 1..65535, else ``default``."""
    text = label_value.strip()
    if text.isdigit() and text.isascii():
        port = int(text)
        if 0 < port <= 65535:
            return port
    return default
