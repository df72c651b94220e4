"""``manifests``: the install objects as YAML, without kustomize."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Final, TextIO

from webhook.cli.common import Commands
from webhook.install.manifests import (
    BASE_NAMESPACE,
    DEFAULT_OVERLAY,
    OVERLAYS,
    ManifestError,
    render,
    to_yaml,
)

MANIFESTS_HELP: Final = "print the install manifests (what kubectl kustomize deploy/ renders)"
MANIFESTS_DESCRIPTION: Final = """\
Print every object of the install as multi-document YAML, for `kubectl apply -f -`:
the same objects `kubectl kustomize deploy/` renders for the chosen overlay, policy
ConfigMap included.

Certificates: with the self-managed overlay (the default) the webhook creates its
CA and serving certificate at start and writes the caBundle into its own webhook
configurations, so none is needed here. With --overlay cert-manager, cert-manager's
cainjector fills it. --ca-bundle FILE writes a PEM CA into the configurations now,
e.g. when you serve a certificate of your own."""


def register(commands: Commands) -> None:
    parser = commands.add_parser("manifests", help=MANIFESTS_HELP)
    parser.description = MANIFESTS_DESCRIPTION
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "--overlay",
        choices=OVERLAYS,
        default=DEFAULT_OVERLAY,
        help=f"certificate management (default: {DEFAULT_OVERLAY})",
    )
    parser.add_argument(
        "--namespace",
        default=BASE_NAMESPACE,
        help=f"namespace to install into (default: {BASE_NAMESPACE})",
    )
    parser.add_argument("--image", help="container image (default: this version's release image)")
    parser.add_argument("--ca-bundle", metavar="FILE", help="PEM CA to put into caBundle")
    parser.set_defaults(handler=command_manifests)


def command_manifests(args: argparse.Namespace, stdin: TextIO, stdout: TextIO) -> int:
    try:
        ca_bundle = None
        if args.ca_bundle:
            try:
                ca_bundle = Path(args.ca_bundle).read_bytes()
            except OSError as exc:
                raise ManifestError(f"{args.ca_bundle}: cannot read: {exc}") from None
        objects = render(
            overlay=args.overlay,
            namespace=args.namespace,
            image=args.image,
            ca_bundle=ca_bundle,
        )
    except ManifestError as exc:
        sys.stderr.write(f"gpushare-webhook: {exc}\n")
        return 2
    stdout.write(to_yaml(objects))
    return 0
