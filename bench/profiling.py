"""Profiling the scheduler process while a benchmark drives it, with py-spy.

py-spy samples another process's Python stacks from outside, so the scheduler runs unmodified
and the profile shows exactly the run the numbers came from. ``python -m bench --profile NAME``
attaches it to the scheduler for each measured stretch (not start-up, seeding or clean-up, so
they do not drown the hot path), or with ``--profile-startup`` launches the scheduler under it
and records its whole life, start-up included. With the default ``raw`` format (collapsed
stacks, one ``frame;frame;… count`` per line, which speedscope and flamegraph.pl read as well)
the top functions are printed too.
"""
from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from bench.procs import BenchError

SUFFIX = {"raw": "txt", "flamegraph": "svg", "speedscope": "json", "chrometrace": "json"}


def py_spy_path() -> str | None:
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


def attach_command(pid: int | str, output: str = "profile.svg") -> str:
    """What to type to profile a running scheduler by hand."""
    return f"py-spy record --pid {pid} --rate 250 --output {output}"


@dataclass
class Profiler:
    output_dir: Path
    label: str
    fmt: str = "raw"
    rate: int = 250
    native: bool = False
    outputs: list[Path] = field(default_factory=list)
    _proc: subprocess.Popen | None = None

    def __post_init__(self):
        if self.fmt not in SUFFIX:
            raise BenchError(f"unknown profile format {self.fmt!r}; one of {', '.join(SUFFIX)}")
        if py_spy_path() is None:
            raise BenchError("py-spy is not installed (pip install -r requirements-dev.txt)")
        self.output_dir.mkdir(parents=True, exist_ok=True)

    def _record_args(self, part: str) -> list[str]:
        out = self.output_dir / f"{self.label}-{part}.{SUFFIX[self.fmt]}"
        self.outputs.append(out)
        # Blocking mode (py-spy pauses the process for each sample): a little slower, but a
        # stack read while the process runs can mix two stacks, and that misleads more than it saves.
        args = [py_spy_path(), "record", "--rate", str(self.rate), "--format", self.fmt, "--output", str(out)]
        if self.native:
            args.append("--native")
        return args

    def wrap_startup(self) -> list[str]:
        """Command prefix that starts the scheduler under py-spy (the start-up profile)."""
        return [*self._record_args("startup"), "--"]

    def attach(self, pid: int) -> None:
        """Start sampling ``pid``; each attach writes its own file (``run1``, ``run2``, …)."""
        part = f"run{sum(1 for o in self.outputs if '-run' in o.name) + 1}"
        self._proc = subprocess.Popen([*self._record_args(part), "--pid", str(pid)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    async def detach(self) -> None:
        """Stop sampling; py-spy writes its output on SIGINT."""
        if self._proc is None:
            return
        proc, self._proc = self._proc, None
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        for _ in range(300):
            if proc.poll() is not None:
                break
            await asyncio.sleep(0.1)
        else:
            proc.kill()
        if proc.returncode not in (0, -signal.SIGINT, 130):
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise BenchError(f"py-spy failed ({proc.returncode}): {err.strip()[:500]}")


def _function(frame: str) -> str:
    """``name (file.py:123)`` → ``name (file.py)``: lines of one function are one function."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rsplit(':', 1)[0]})" if where else name


def merge_collapsed(paths: list[Path], into: Path) -> Path:
    """Collapsed stacks add up: one file for all the measured stretches of a run."""
    counts: Counter = Counter()
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text(errors="replace").splitlines():
            stack, _, count = line.rpartition(" ")
            if stack and count.isdigit():
                counts[stack] += int(count)
    into.write_text("".join(f"{stack} {n}\n" for stack, n in counts.most_common()))
    return into


def _stacks(path: Path):
    """(the stack's frames, its sample count) for each line of a collapsed-stack profile."""
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            yield stack.split(";"), int(count)


def summarize_collapsed(path: Path, *, top: int = 25) -> str:
    """The functions with most samples on top of the stack (self) and anywhere on it (total)."""
    own: Counter = Counter()
    total: Counter = Counter()
    samples = 0
    for stack, n in _stacks(path):
        samples += n
        frames = [_function(f) for f in stack]
        own[frames[-1]] += n
        for f in set(frames):
            total[f] += n
    if not samples:
        return f"{path}: no samples"
    lines = [f"{path}: {samples} samples", f"{'self %':>7}  {'total %':>7}  function"]
    for func, n in own.most_common(top):
        lines.append(f"{100 * n / samples:7.1f}  {100 * total[func] / samples:7.1f}  {func}")
    lines.append("")
    lines.append(f"{'total %':>7}  function (inclusive, top {top})")
    for func, n in total.most_common(top):
        lines.append(f"{100 * n / samples:7.1f}  {func}")
    return "\n".join(lines)


# Where a /filter's time goes (docs/BENCHMARKS.md, issue 35): each sample goes to the stage of the
# innermost of these functions on its stack; the order is only the table's.
FILTER_STAGES = (
    ("aiohttp: socket read, HTTP parse", ("_SelectorSocketTransport._read_ready",)),
    ("aiohttp: request loop", ("RequestHandler.start",)),
    ("body read and decoded (the pod; NodeNames when new)", ("read_json", "NodeNamesDecoder.loads")),
    ("request shape checks", ("extender_args_error",)),
    ("the pod's device requests", ("parse_pod_requests",)),
    ("service: identity, pod lock, gang and hold checks", ("SchedulerService.filter", "SchedulerService._filter_live")),
    ("decide: policies, candidates, mask, query", ("Filterer.evaluate", "device_mask", "FitQuery.__init__",
                                                   "Filterer.policies", "CandidateLists.indices")),
    ("kernel (Cython: Filterer.evaluate's own time)", ()),
    ("decide: the winner's devices, annotations", ("Filterer.decide", "Filterer._allocation")),
    ("books: the reservation", ("PodLedger.charge_of", "PodLedger.add_pod_usage", "PodLedger.release_pod")),
    ("answer encoded, metrics", ("_respond", "build_app.<locals>.filter_handler")),
    ("aiohttp: dispatch, answer written", ("RequestHandler._handle_request",)),
    ("after the answer: FilteringSucceed, outcome", ("SchedulerService._placed",)),
    ("after the answer: young garbage collection", ("collect_young",)),
    ("idle (waiting for the next request)", ("EpollSelector.select",)),
)
KERNEL_STAGE = "kernel (Cython: Filterer.evaluate's own time)"
OTHER_STAGE = "background: watches, registration upkeep, Events"


def filter_stages(path: Path) -> list[tuple[str, float]]:
    """(stage, share of the busy samples) for a profile of the /filter phase, idle last (its
    share of all samples)."""
    owner = {name: label for label, names in FILTER_STAGES for name in names}
    counts: Counter = Counter()
    samples = 0
    for stack, n in _stacks(path):
        samples += n
        names = [f.split(" (", 1)[0] for f in stack]
        label = OTHER_STAGE
        if names[-1] == "Filterer.evaluate":
            label = KERNEL_STAGE
        else:
            for name in reversed(names):
                if name in owner:
                    label = owner[name]
                    break
        counts[label] += n
    idle_label = FILTER_STAGES[-1][0]
    busy = samples - counts[idle_label]
    if not busy:
        return []
    order = [label for label, _ in FILTER_STAGES[:-1]] + [OTHER_STAGE]
    rows = [(label, counts[label] / busy) for label in order]
    return rows + [(idle_label, counts[idle_label] / samples)]


def render_filter_stages(path: Path, cpu_ms_per_request: float) -> str:
    rows = filter_stages(path)
    if not rows:
        return f"{path}: no samples"
    lines = [f"where a /filter's CPU goes ({path.name}; µs = share of the busy samples × "
             f"{cpu_ms_per_request * 1000:.0f} µs of scheduler CPU per request)",
             f"{'share':>7}  {'µs':>6}  stage"]
    for label, share in rows[:-1]:
        lines.append(f"{100 * share:6.1f}%  {share * cpu_ms_per_request * 1000:6.0f}  {label}")
    lines.append(f"{100 * rows[-1][1]:6.1f}%  {'':>6}  {rows[-1][0]} (share of all samples)")
    return "\n".join(lines)
