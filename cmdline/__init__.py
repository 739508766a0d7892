"""The argument parser every command behind a Makefile target uses: argparse, refusing in one line.

``--help`` prints the usage and exits 0 before the command does anything (no config read, no AWS
call, no synth). A mistake on the command line (an unknown flag, a missing argument, a bad value)
is refused with argparse's ``error:`` line alone, exit 2, so it is not buried under the usage.
"""

from __future__ import annotations

import argparse
from typing import NoReturn


class ArgumentParser(argparse.ArgumentParser):
    """argparse.ArgumentParser whose errors are one line on stderr (exit 2) that points at --help.

    A flag must be spelt out: argparse would otherwise take a prefix of one for the flag itself
    (``--api-key sk-…`` for ``--api-key-env``), and run with a value meant for something else."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (try --help)\n")
