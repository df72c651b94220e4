"""``certs generate``: a CA and serving certificate for the webhook's Service."""

from __future__ import annotations

import argparse
from datetime import timedelta
from typing import TextIO

from webhook.cli.common import EXIT_OK, Commands, UsageError


def command_certs_generate(args: argparse.Namespace, stdin: TextIO, stdout: TextIO) -> int:
    # Imported here, like the server stack, so review and lint do not load cryptography.
    from webhook.certs.files import issue_service_certificates
    from webhook.certs.issue import service_dns_names
    from webhook.certs.material import CertificateError

    if args.days < 1:
        raise UsageError("--days must be at least 1")
    try:
        paths, serving = issue_service_certificates(
            args.out,
            service=args.service,
            namespace=args.namespace,
            valid_for=timedelta(days=args.days),
            key_type=args.key_type,
        )
    except (CertificateError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    names = ", ".join(service_dns_names(args.service, args.namespace))
    stdout.write(f"wrote {paths.ca_file} (CA; base64 of it is the webhooks' caBundle)\n")
    stdout.write(
        f"wrote {paths.cert_file} ({args.key_type}, expires {serving.not_after:%Y-%m-%d}, {names})\n"
    )
    stdout.write(f"wrote {paths.key_file} (mode 0600)\n")
    return EXIT_OK


def register(commands: Commands) -> None:
    certs = commands.add_parser("certs", help="TLS certificates for the webhook")
    certs_commands = certs.add_subparsers(dest="certs_command", required=True)
    generate = certs_commands.add_parser(
        "generate", help="issue a CA and a serving certificate for the webhook's Service"
    )
    generate.add_argument("--service", required=True, help="the webhook's Service name")
    generate.add_argument("--namespace", required=True, help="the Service's namespace")
    generate.add_argument(
        "--out", required=True, metavar="DIR", help="where ca.crt, tls.crt, tls.key are written"
    )
    # Spelled out rather than imported from webhook.certs.issue, which loads cryptography.
    generate.add_argument("--key-type", choices=["ecdsa-p256", "rsa-2048"], default="ecdsa-p256")
    generate.add_argument("--days", type=int, default=365, help="validity (default 365)")
    generate.set_defaults(handler=command_certs_generate)
