"""``uninstall``: remove the install and what its leader wrote, never shared CRDs."""

from __future__ import annotations

import argparse
import sys
from typing import Final, TextIO

from webhook.certs.selfmanaged import SelfManagedError, api_client
from webhook.cli.common import EXIT_DENIED, EXIT_OK, Commands, UsageError
from webhook.install.manifests import BASE_NAMESPACE
from webhook.install.uninstall import POD_WAIT, Uninstaller, UninstallError

UNINSTALL_HELP: Final = "remove the install and everything its leader created (never CRDs)"
UNINSTALL_DESCRIPTION: Final = """\
Delete what `manifests` (or the Helm chart) installed in --namespace and what the
running leader wrote since: the webhook configurations, the Deployment (waiting for
its pods to stop), the CEL policies and bindings (every name the install renders,
and any labelled app.kubernetes.io/part-of=gpushare), the Secret gpushare-webhook-tls,
the Lease gpushare-webhook-tls-leader, the RBAC, Service, ConfigMap,
PodDisruptionBudget and the chart's optional objects. The Namespace goes too when the
install created it (it carries the part-of label). CustomResourceDefinitions are
never deleted: other tools own them.

A Helm release is left to Helm first: while its record is in --namespace, nothing is
deleted and the order is printed (helm uninstall, then this command for what Helm never
knew).

--dry-run asks the apiserver to check every delete (permissions, existence) without
doing it, and prints what would go. Exit status: 0 when nothing of the install is
left, 1 when something could not be deleted (each named on stderr), 2 on bad usage
or no API access. See docs/uninstall.md."""


def register(commands: Commands) -> None:
    parser = commands.add_parser("uninstall", help=UNINSTALL_HELP)
    parser.description = UNINSTALL_DESCRIPTION
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "--namespace",
        default=BASE_NAMESPACE,
        help=f"namespace the install is in (default: {BASE_NAMESPACE})",
    )
    parser.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="kubeconfig file (default: in-cluster, else $KUBECONFIG or ~/.kube/config)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print what would be deleted, delete nothing"
    )
    parser.add_argument(
        "--wait",
        type=float,
        default=POD_WAIT,
        metavar="SECONDS",
        help=f"how long to wait for the webhook's pods to stop (default: {POD_WAIT:.0f})",
    )
    parser.set_defaults(handler=command_uninstall)


def command_uninstall(args: argparse.Namespace, stdin: TextIO, stdout: TextIO) -> int:
    if args.wait < 0:
        raise UsageError("--wait must not be negative")
    try:
        client = api_client(args.kubeconfig)
    except SelfManagedError as exc:
        raise UsageError(str(exc)) from None
    try:
        uninstaller = Uninstaller(
            client, namespace=args.namespace, dry_run=args.dry_run, pod_wait=args.wait
        )
        outcome = uninstaller.run()
    except UninstallError as exc:
        raise UsageError(str(exc)) from None
    finally:
        client.close()
    for line in outcome.done:
        stdout.write(line + "\n")
    if not outcome.done:
        stdout.write(f"nothing of the install found in {args.namespace} or cluster-wide\n")
    for line in outcome.kept:
        stdout.write(f"kept {line}\n")
    for line in outcome.problems:
        sys.stderr.write(f"gpushare-webhook: {line}\n")
    return EXIT_DENIED if outcome.problems else EXIT_OK
