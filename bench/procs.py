"""The two server processes a benchmark drives: the cluster (fake API server) and hami-scheduler.

The scheduler is started exactly as an operator starts it (``python -m hami_py`` with upstream's
flags), so its resident memory, its start-up time and its event loop are its own. Its logs go to
a file next to the run (``--log-format json``), never to the benchmark's terminal.
"""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson

from hami_py.fakeapi import write_kubeconfig

REPO_ROOT = Path(__file__).resolve().parent.parent
STOP_GRACE_S = 10.0


class BenchError(RuntimeError):
    """A benchmark could not run (a process died, a request failed): the message says which."""


def free_port() -> int:
    """A port nobody listens on right now (the CLI needs a fixed one, so we pick it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class ClusterProcess:
    """``python -m bench.cluster``: the API server and its control port."""

    def __init__(self, *, workdir: Path, session: aiohttp.ClientSession):
        self.workdir = workdir
        self.session = session
        self.log_path = workdir / "cluster.log"
        self.proc: asyncio.subprocess.Process | None = None
        self.api_url = ""
        self.control_url = ""
        self.kubeconfig = workdir / "kubeconfig"

    async def start(self, *, timeout: float = 30.0) -> None:
        log = open(self.log_path, "ab")
        try:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bench.cluster", cwd=REPO_ROOT, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=log)
        finally:
            log.close()
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        except asyncio.TimeoutError:
            raise BenchError(f"the cluster process did not start within {timeout}s; "
                             f"log {self.log_path}:\n{_tail(self.log_path)}") from None
        if not line:
            raise BenchError(f"the cluster process exited at start; log {self.log_path}:\n{_tail(self.log_path)}")
        urls = orjson.loads(line)
        self.api_url, self.control_url = urls["api"], urls["control"]
        write_kubeconfig(self.kubeconfig, self.api_url)

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def call(self, method: str, path: str, body: dict | None = None, *, timeout: float = 600.0):
        """One control request; BenchError when the cluster answers with an error."""
        async with self.session.request(method, f"{self.control_url}{path}",
                                        data=orjson.dumps(body) if body is not None else None,
                                        timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            data = await r.read()
        decoded = orjson.loads(data) if data else {}
        if r.status >= 300:
            raise BenchError(f"cluster {method} {path} answered {r.status}: {decoded}")
        return decoded

    async def stop(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), STOP_GRACE_S)
        except asyncio.TimeoutError:
            self.proc.kill()
            await self.proc.wait()


@dataclass
class MemorySample:
    rss_mb: float
    peak_mb: float     # VmHWM: the most the process has ever had resident


@dataclass
class SchedulerProcess:
    """``python -m hami_py`` against the cluster; ``wrap`` prefixes the command (a profiler)."""
    kubeconfig: Path
    log_path: Path
    wrap: list[str] = field(default_factory=list)
    extra_args: list[str] = field(default_factory=list)
    # False: neither --kube-qps nor --kube-burst, as HAMi's chart starts it (the defaults apply).
    budget_flags: bool = True
    extra_env: dict[str, str] = field(default_factory=dict)
    port: int = 0
    metrics_port: int = 0
    proc: subprocess.Popen | None = None
    t_spawn: float = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def command(self) -> list[str]:
        return [*self.wrap, sys.executable, "-m", "hami_py", "--kubeconfig", str(self.kubeconfig),
                "--http_bind", f"127.0.0.1:{self.port}", "--metrics-bind-address", f"127.0.0.1:{self.metrics_port}",
                *(("--kube-qps", "0", "--kube-burst", "1000") if self.budget_flags else ()),
                "--log-format", "json", *self.extra_args]

    def start(self) -> None:
        self.port, self.metrics_port = free_port(), free_port()
        with open(self.log_path, "ab") as log:
            self.t_spawn = time.monotonic()
            self.proc = subprocess.Popen(self.command(), cwd=REPO_ROOT, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **self.extra_env})

    @property
    def pid(self) -> int:
        """The scheduler's own pid (the wrapped child when a profiler launched it)."""
        if not self.wrap:
            return self.proc.pid
        try:
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        except OSError:
            children = []
        return int(children[0]) if children else self.proc.pid

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise BenchError(f"hami-scheduler exited with code {self.proc.returncode}; "
                             f"log {self.log_path}:\n{_tail(self.log_path)}")

    async def wait_ready(self, session: aiohttp.ClientSession, *, timeout: float = 120.0) -> float:
        """Poll /readyz until 200; seconds from spawn to ready."""
        deadline = self.t_spawn + timeout
        while True:
            self.check_alive()
            try:
                async with session.get(f"{self.url}/readyz", timeout=aiohttp.ClientTimeout(total=2)) as r:
                    if r.status == 200:
                        return time.monotonic() - self.t_spawn
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise BenchError(f"hami-scheduler not ready after {timeout}s; log {self.log_path}:\n"
                                 f"{_tail(self.log_path)}")
            await asyncio.sleep(0.01)

    def memory(self) -> MemorySample:
        values = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0]) / 1024.0   # kB → MiB
        return MemorySample(rss_mb=values["VmRSS"], peak_mb=values["VmHWM"])

    async def metrics(self, session: aiohttp.ClientSession) -> dict[str, float]:
        async with session.get(self.metrics_url, timeout=aiohttp.ClientTimeout(total=10)) as r:
            return parse_prometheus(await r.text())

    async def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        # The scheduler itself: under a profiler, the profiler then ends with it and writes.
        os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while self.proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def parse_prometheus(text: str) -> dict[str, float]:
    """``name{labels}`` → value for every sample line of the text exposition format."""
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        try:
            samples[key] = float(value)
        except ValueError:
            continue
    return samples


def process_cpu_seconds(pid: int) -> float:
    """CPU time a process has used, to the nanosecond where the kernel says so.

    /proc/<pid>/stat counts in clock ticks (10 ms), which rounds a short measuring window to zero:
    ten /filter cycles of 0.4 ms each read as 0 or 10 ms. Each thread's schedstat keeps its run time
    in nanoseconds, so the sum over the live threads is used; the process's threads (event loop,
    executor pool, Go runtime) live as long as it does. Without schedstat, the ticks are all there is.
    """
    total_ns = read = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                total_ns += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
                read += 1
            except FileNotFoundError:
                continue                    # the thread ended between the listing and the read
    except (OSError, ValueError, IndexError):
        return _stat_cpu_seconds(pid)
    return total_ns / 1e9 if read else _stat_cpu_seconds(pid)


def _stat_cpu_seconds(pid: int) -> float:
    """User + system CPU time from /proc/<pid>/stat, in whole clock ticks."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks
