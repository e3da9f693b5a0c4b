"""What every ``hami-scheduler`` command line shares: a bad flag is one line and exit status 2.

``hami_py/cli.py`` (the scheduler's flags) and the offline subcommands it hands over to
(``simulate``, ``defrag``) all parse with these, so they live below all three: the top-level
command imports its subcommands, and none of them imports it back.
"""
from __future__ import annotations

import argparse

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130      # Ctrl-C: 128 + SIGINT, as a shell reports it


class UsageError(Exception):
    pass


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, no usage dump
        raise UsageError(message)
