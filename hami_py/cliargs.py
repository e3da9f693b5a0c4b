"""What every ``hami-scheduler`` command line shares: a bad flag is one line and exit status 2.

``hami_py/cli.py`` (the scheduler's flags) and the offline subcommands it hands over to
(``simulate``, ``defrag``) all parse with these, so they live below all three: the top-level
command imports its subcommands, and none of them imports it back.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130      # Ctrl-C: 128 + SIGINT, as a shell reports it


class UsageError(Exception):
    pass


class OneLineParser(argparse.ArgumentParser):
    """No abbreviations: ``--compare`` is an unknown flag, not ``--compare-policies`` (a flag added
    later must not change what an abbreviation in someone's script means; upstream's Go flags take
    none either)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_args(self, args=None, namespace=None):
        # An unknown long flag is named first, before "--cluster is required": with abbreviations
        # off it is most often a shortened flag, and the missing ones are not the mistake.
        args = list(sys.argv[1:] if args is None else args)
        unknown = [a for a in args[:args.index("--") if "--" in args else len(args)]
                   if a.startswith("--") and a.split("=", 1)[0] not in self._option_string_actions]
        if unknown:
            self.error(f"unrecognized arguments: {' '.join(unknown)}")
        return super().parse_args(args, namespace)

    def error(self, message: str):  # one line, exit 2, no usage dump
        raise UsageError(message)


def check_node_policy(value: str, choices: Iterable[str]) -> None:
    """``--node-scheduler-policy``: one of ``choices``, or a one-line error listing them."""
    choices = list(choices)
    if value not in choices:
        raise UsageError(f'--node-scheduler-policy: unknown node policy "{value}" (choose from {", ".join(choices)})')


def check_gpu_policy(value: str, choices: Iterable[str], *, chain: bool, first: Iterable[str] = ()) -> None:
    """``--gpu-scheduler-policy``: one of ``choices`` or, with ``chain``, a comma list of them
    (each token trimmed); else a one-line error naming the unknown ones and listing the choices,
    ``first`` first (the node policies, say), then the rest alphabetically."""
    first = [c for c in first if c in set(choices)]
    listed = [*first, *sorted(set(choices) - set(first))]
    tokens = [t.strip() for t in value.split(",")] if chain else [value]
    unknown = list(dict.fromkeys(t for t in tokens if t not in listed))
    if not unknown:
        return
    names = ", ".join(f'"{t}"' for t in unknown)
    within = f' in "{value}"' if len(tokens) > 1 else ""
    how = ", or a comma list of them such as numa,binpack" if chain else ""
    raise UsageError(f"--gpu-scheduler-policy: unknown GPU polic{'ies' if len(unknown) > 1 else 'y'} "
                     f"{names}{within} (choose from {', '.join(listed)}{how})")
