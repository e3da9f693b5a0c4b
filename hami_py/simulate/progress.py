"""A one-line progress bar on stderr, so a long simulation visibly moves.

Drawn only on a terminal (a log file or a CI capture would fill with carriage returns) and at
most ten times a second; :meth:`ProgressBar.finish` wipes the line so the report starts clean.
"""
from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    def __init__(self, *, stream: TextIO | None = None, enabled: bool | None = None, width: int = 28,
                 min_interval_s: float = 0.1):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.width = width
        self.min_interval_s = min_interval_s
        self.label = ""
        self._last_draw = 0.0
        self._drawn = 0

    def start(self, label: str) -> None:
        self.label = label
        self._last_draw = 0.0

    def update(self, done: int, total: int, placed: int, pending: int, replaced: int = 0) -> None:
        """``done`` of ``total`` pods arrived; ``placed`` of them placed (each once), ``pending``
        waiting; ``replaced``: binds of pods placed again after the defragmenter moved them."""
        if not self.enabled:
            return
        now = time.monotonic()
        if done < total and now - self._last_draw < self.min_interval_s:
            return
        self._last_draw = now
        filled = self.width * done // total if total else self.width
        bar = "#" * filled + "-" * (self.width - filled)
        moved = f", {replaced} re-placed after moves" if replaced else ""
        line = f"{self.label} [{bar}] {done}/{total} pods arrived, {placed} placed{moved}, {pending} pending"
        self._write("\r" + line + " " * max(0, self._drawn - len(line)))
        self._drawn = len(line)

    def finish(self) -> None:
        if self.enabled and self._drawn:
            self._write("\r" + " " * self._drawn + "\r")
            self._drawn = 0

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()
