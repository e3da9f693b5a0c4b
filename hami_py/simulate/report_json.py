"""``--output json``: one object for scripts and dashboards.

``summary`` (placed, pending, gangs placed and waiting, and the utilisation figures), ``nodes``
(per node and per GPU) and ``pods`` (one entry per workload pod: namespace, name, node or null,
the devices it got, its gang, and the reason when pending) describe the chosen policies;
``comparison`` lists every policy pair's summary when --compare-policies was given. Nothing time-dependent goes in, so two runs of the
same files give the same bytes and can be diffed.
"""
from __future__ import annotations

import orjson

from hami_py.simulate.results import Report


def report_object(report: Report) -> dict:
    r = report.primary
    out = {
        "cluster": {"file": report.cluster_file, "description": report.cluster},
        "workload": {"file": report.workload_file, "description": report.workload},
        "notes": report.notes,
        "summary": r.summary(),
        "nodes": r.nodes_json(),
        "pods": [p.as_json() for p in r.pods],
    }
    if report.comparison:
        out["comparison"] = [x.summary() for x in report.comparison]
    return out


def render_json(report: Report) -> str:
    return orjson.dumps(report_object(report), option=orjson.OPT_INDENT_2).decode() + "\n"
