"""The README's quick start runs as written (issue 36): its commands, run from the repository's
root with the virtualenv that ``make setup`` made, succeed and print the output the README shows.

A sample line may elide a part that changes from run to run (how long a pod has been running)
with ``…``; every other character must be in one line of the command's output. The deploy step
(``kubectl apply -k manifests/``) needs a cluster: tests/test_real_k8s_admission_policy.py applies
it to a real API server; here it is rendered with ``kubectl kustomize``, which needs none.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hami_py.reasons import NAMES, NODE_INSUFFICIENT_DEVICE_TEXT, NODE_UNREGISTERED_TEXT

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()


def _section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end if end >= 0 else None]


QUICK = _section("Quick start")
# Each ```sh block followed by its ```text sample: (commands, sample lines).
STEPS = [(sh.strip().splitlines(), sample.strip().splitlines())
         for sh, sample in re.findall(r"```sh\n(.*?)```\s*\n```text\n(.*?)```", QUICK, re.S)]


def _shown_in(sample: str, output: str) -> bool:
    parts = [p.strip() for p in sample.split("…")]
    for line in output.splitlines():
        at = 0
        for part in parts:
            found = line.find(part, at)
            if found < 0:
                break
            at = found + len(part)
        else:
            return True
    return False


def test_the_quick_start_has_its_three_steps_in_order():
    assert [m for m in re.findall(r"\*\*(\d)\. (\w+)", QUICK)] == [("1", "Simulate"), ("2", "Defragment"),
                                                                   ("3", "Deploy")]
    assert len(STEPS) == 3
    assert README.index("## Quick start") < README.index("## What it does")


@pytest.mark.parametrize("step", range(3))
def test_each_quick_start_command_runs_as_written_and_prints_what_the_readme_shows(step):
    commands, sample = STEPS[step]
    binary = REPO / ".venv" / "bin" / "hami-scheduler"
    if not binary.exists():
        pytest.skip("no .venv/bin/hami-scheduler: run `make setup` first (the README's first command)")
    runnable = [c for c in commands if c.startswith(".venv/bin/hami-scheduler ")]
    assert runnable, commands
    for command in runnable:
        proc = subprocess.run(["bash", "-c", command], cwd=REPO, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, (command, proc.stderr[-2000:])
        if command is runnable[-1]:
            missing = [line for line in sample if not _shown_in(line, proc.stdout)]
            assert not missing, f"{command!r} no longer prints {missing}:\n{proc.stdout}"


def test_the_deploy_step_applies_manifests_that_render():
    assert "kubectl apply -k manifests/" in QUICK
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed; the deploy step's manifests cannot be rendered")
    proc = subprocess.run([kubectl, "kustomize", "manifests/"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "kind: Deployment" in proc.stdout and "name: hami-scheduler" in proc.stdout


def test_why_is_my_pod_pending_explains_every_reason_the_scheduler_gives():
    section = _section("Why is my pod Pending?")
    for reason in [*NAMES.values(), NODE_INSUFFICIENT_DEVICE_TEXT, NODE_UNREGISTERED_TEXT, "registration refused"]:
        assert f"`{reason}" in section, reason
