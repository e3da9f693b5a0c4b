#!/usr/bin/env python3
"""Rewrite overlays/kube-scheduler-in-the-loop/scheduler-config.yaml from manifests/scheduler-config.yaml.

The overlay's KubeSchedulerConfiguration is the base's with ``prioritizeVerb: prioritize`` added
and any other verb the overlay adds (kustomize cannot patch inside the ConfigMap's config.yaml
string). Run this after changing the
base (a family's managed resources, a timeout); tests/test_manifests_in_the_loop.py fails until
they agree. The overlay's own header comment is kept.
"""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASE = ROOT / "manifests" / "scheduler-config.yaml"
OVERLAY = ROOT / "overlays" / "kube-scheduler-in-the-loop" / "scheduler-config.yaml"
START = "apiVersion: v1\n"
FILTER = "        filterVerb: filter\n"


def main() -> None:
    current = OVERLAY.read_text()
    header = current.split(START, 1)[0]
    # The verbs the overlay adds (prioritizeVerb, and preemptVerb once device preemption is on).
    verbs = [line + "\n" for line in current.splitlines() if re.match(r"        (prioritizeVerb|preemptVerb): ", line)]
    if not any("prioritizeVerb" in v for v in verbs):
        verbs.insert(0, "        prioritizeVerb: prioritize\n")
    body = BASE.read_text().split(START, 1)[1]
    if body.count(FILTER) != 1:
        raise SystemExit(f"{BASE}: expected one line {FILTER.strip()!r}")
    OVERLAY.write_text(header + START + body.replace(FILTER, FILTER + "".join(verbs)))


if __name__ == "__main__":
    main()
