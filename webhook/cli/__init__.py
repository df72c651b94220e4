"""The ``gpushare-webhook`` command line: review, lint, serve, certs, manifests, uninstall,
verify, report, inspect.

Each subcommand lives in a module of its own with a ``register`` function; this one
assembles them and maps domain errors to one clear line on stderr and an exit code,
so no traceback reaches a user on bad input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from webhook.cli import certs, inspect, manifests, report, review, serve, uninstall, verify
from webhook.cli.common import EXIT_OK, EXIT_USAGE, Parser, UsageError
from webhook.core.policy import PolicyError
from webhook.version import version


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="gpushare-webhook",
        description="Admission webhook and policy enforcement for GPU sharing on Kubernetes.",
    )
    parser.add_argument("--version", action="version", version=f"gpushare-webhook {version()}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in (review, serve, certs, manifests, uninstall, verify, report, inspect):
        command.register(commands)
    return parser


def main(
    argv: Sequence[str] | None = None, *, parser: argparse.ArgumentParser | None = None
) -> int:
    """Run a command line; ``parser`` parses it instead of the full one (the kubectl plugin)."""
    parser = parser if parser is not None else build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args, sys.stdin, sys.stdout))
    except PolicyError as exc:
        for error in exc.errors:
            sys.stderr.write(f"{exc.source}: {error}\n")
        return EXIT_USAGE
    except UsageError as exc:
        sys.stderr.write(f"gpushare-webhook: {exc}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
