"""``verify``: inside a GPU pod, check that the memory cap the webhook set is enforced."""

from __future__ import annotations

from webhook.cli.common import Commands
from webhook.node import verify


def register(commands: Commands) -> None:
    verify.add_arguments(commands.add_parser("verify", help=verify.HELP))
