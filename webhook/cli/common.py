"""What every subcommand shares: exit codes, the usage error, the argument parser class."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn, TypeAlias

EXIT_OK = 0
EXIT_DENIED = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """Bad input or usage: exit 2 with one line on stderr."""


class Parser(argparse.ArgumentParser):
    """Usage errors exit 2, like every other bad input."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


# argparse's own type for the object add_subparsers returns; it has no public name.
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
