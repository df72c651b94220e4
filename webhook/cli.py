"""The ``gpushare-webhook`` command line: review, lint, serve, certs, manifests.

Every subcommand maps domain errors to one clear line on stderr and an exit code;
no traceback reaches a user on bad input.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

import orjson
import yaml

from webhook import manifests
from webhook.admission import ReviewEntry, review_object
from webhook.policy import PolicyError, load_policy

if TYPE_CHECKING:
    from webhook.selfmanaged import SelfManagedConfig

EXIT_OK = 0
EXIT_DENIED = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """Bad input or usage: exit 2 with one line on stderr."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _read_text(path: str, stdin: TextIO) -> str:
    if path == "-":
        return stdin.read()
    try:
        return Path(path).read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read: {exc}") from None


def read_manifests(paths: Sequence[str], stdin: TextIO) -> Iterator[dict[str, Any]]:
    """Every object of every (multi-document YAML or JSON) file; ``List`` kinds expanded."""
    for path in paths:
        text = _read_text(path, stdin)
        try:
            documents = list(yaml.safe_load_all(text))
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark is not None else ""
            raise UsageError(f"{path}:{where} not valid YAML or JSON") from None
        for number, document in enumerate(documents, 1):
            if document is None:
                continue
            if not isinstance(document, dict) or not isinstance(document.get("kind"), str):
                raise UsageError(f"{path}: document {number} is not a Kubernetes object (no kind)")
            if document["kind"].endswith("List") and isinstance(document.get("items"), list):
                for item in document["items"]:
                    if isinstance(item, dict) and isinstance(item.get("kind"), str):
                        yield item
                    else:
                        raise UsageError(f"{path}: document {number} has an item with no kind")
                continue
            yield document


def _text_report(entries: Sequence[ReviewEntry]) -> str:
    lines = []
    for entry in entries:
        verdict = "ALLOWED" if entry["allowed"] else "DENIED"
        where = f"{entry['namespace']}/{entry['name']}" if entry["namespace"] else entry["name"]
        lines.append(
            f"{entry['kind']} {where}: {verdict}  mode={entry['mode']}  "
            f"patch={len(entry['patch'])} ops"
        )
        for violation in entry["violations"]:
            lines.append(f"  {violation['action']:<5} {violation['rule']}: {violation['message']}")
        for warning in entry["warnings"]:
            if not any(warning.endswith(v["message"]) for v in entry["violations"]):
                lines.append(f"  note  {warning}")
        for op in entry["patch"]:
            value = orjson.dumps(op.get("value")).decode() if "value" in op else ""
            lines.append(f"  patch {op['op']} {op['path']} {value}".rstrip())
    return "\n".join(lines) + "\n"


def command_review(args: argparse.Namespace, stdin: TextIO, stdout: TextIO) -> int:
    policy = load_policy(args.policy)
    entries = [
        review_object(
            obj,
            policy,
            namespace=args.namespace,
            username=args.user or "",
            groups=args.group or (),
            operation=args.operation,
        )
        for obj in read_manifests(args.file, stdin)
    ]
    if args.output == "json":
        stdout.write(orjson.dumps(entries, option=orjson.OPT_INDENT_2).decode() + "\n")
    elif args.output == "yaml":
        stdout.write(yaml.safe_dump(orjson.loads(orjson.dumps(entries)), sort_keys=False))
    else:
        stdout.write(_text_report(entries))
    return EXIT_OK if all(e["allowed"] for e in entries) else EXIT_DENIED


def command_lint(args: argparse.Namespace, stdin: TextIO, stdout: TextIO) -> int:
    status = EXIT_OK
    for path in args.files:
        try:
            policy = load_policy(path)
        except PolicyError as exc:
            status = EXIT_DENIED
            for error in exc.errors:
                sys.stderr.write(f"{path}: {error}\n")
            continue
        stdout.write(f"{path}: ok (policy {policy.name}, hash {policy.digest})\n")
    return status


_SELF_MANAGED_OPTIONS = ("namespace", "service", "secret", "webhook_config", "kubeconfig")


def _self_managed(args: argparse.Namespace) -> SelfManagedConfig | None:
    given = {name: getattr(args, name) for name in _SELF_MANAGED_OPTIONS}
    given = {name: value for name, value in given.items() if value is not None}
    if not args.self_managed:
        if given:
            flags = ", ".join("--" + name.replace("_", "-") for name in given)
            raise UsageError(f"{flags}: only with --self-managed")
        return None
    if args.tls_cert or args.tls_key:
        raise UsageError("--self-managed issues its own certificate: drop --tls-cert/--tls-key")
    if not args.namespace:
        raise UsageError("--self-managed needs --namespace (where the Service and Secret live)")
    # Imported here: it loads the kubernetes client.
    from webhook.selfmanaged import SelfManagedConfig
    from webhook.tls import service_dns_names

    config = SelfManagedConfig(**given)
    try:
        service_dns_names(config.service, config.namespace)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return config


def command_serve(args: argparse.Namespace, stdin: TextIO, stdout: TextIO) -> int:
    # The server stack is imported here so review and lint start fast.
    from webhook.server import LOG_FORMAT, ServerConfig, run
    from webhook.tls import CertificateError

    logging.basicConfig(level=args.log_level, stream=sys.stderr, format=LOG_FORMAT)
    if args.workers < 1:
        raise UsageError("--workers must be at least 1")
    self_managed = _self_managed(args)
    config = ServerConfig(
        host=args.host,
        port=args.port,
        health_port=args.health_port,
        policy=args.policy,
        cert_dir=args.cert_dir,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        client_ca=args.client_ca,
        audit_log=args.audit_log,
        audit_max_bytes=args.audit_max_bytes,
        workers=args.workers,
        sans=args.san,
        self_managed=self_managed,
    )
    try:
        return run(config)
    except CertificateError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"cannot serve: {exc}") from None


def command_certs_generate(args: argparse.Namespace, stdin: TextIO, stdout: TextIO) -> int:
    # Imported here, like the server stack, so review and lint do not load cryptography.
    from webhook.tls import CertificateError, issue_service_certificates, service_dns_names

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


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gpushare-webhook",
        description="Admission webhook and policy enforcement for GPU sharing on Kubernetes.",
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    review = commands.add_parser(
        "review", help="run manifests through mutation and validation offline"
    )
    review.add_argument(
        "-f", "--file", action="append", required=True, help="YAML/JSON file, - for stdin"
    )
    review.add_argument("--policy", help="policy file (default: the bundled default policy)")
    review.add_argument("-o", "--output", choices=["json", "yaml", "text"], default="text")
    review.add_argument("--namespace", help="namespace to review in (default: the object's)")
    review.add_argument("--user", help="requesting user, to test exemptions")
    review.add_argument("--group", action="append", help="requesting user's group (repeatable)")
    review.add_argument(
        "--operation", choices=["CREATE", "UPDATE"], default="CREATE", help="admission operation"
    )
    review.set_defaults(handler=command_review)

    serve = commands.add_parser("serve", help="run the HTTPS admission service")
    serve.add_argument("--host", default="0.0.0.0", help="listen address (default 0.0.0.0)")  # noqa: S104
    serve.add_argument("--port", type=int, default=8443, help="HTTPS port (default 8443)")
    serve.add_argument(
        "--health-port", type=int, default=8080, help="plain HTTP /healthz /readyz /metrics"
    )
    serve.add_argument("--policy", help="policy file, watched for changes (default: bundled)")
    serve.add_argument(
        "--cert-dir",
        default="certs",
        help="where development certificates are generated when no --tls-cert is given, "
        "or where --self-managed writes its pair (must be writable)",
    )
    serve.add_argument("--tls-cert", help="serving certificate (PEM), reloaded when it changes")
    serve.add_argument("--tls-key", help="its private key (PEM)")
    serve.add_argument("--client-ca", help="require client certificates signed by this CA")
    serve.add_argument(
        "--san",
        action="append",
        default=[],
        help="extra DNS name or IP for the development certificate (repeatable)",
    )
    serve.add_argument("--audit-log", default="-", help="- for stdout (default) or a file")
    serve.add_argument(
        "--audit-max-bytes", type=int, default=100 << 20, help="rotate the audit file at this size"
    )
    serve.add_argument("--workers", type=int, default=1, help="processes sharing the port")
    serve.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    managed = serve.add_argument_group(
        "self-managed certificates",
        "keep a CA and serving certificate in a Secret, renew them and write the caBundle "
        "into the webhook configurations; one replica at a time (a Lease) does the writing",
    )
    managed.add_argument("--self-managed", action="store_true", help="turn this mode on")
    managed.add_argument("--namespace", help="namespace of the Service, Secret and Lease")
    managed.add_argument("--service", help="the webhook's Service (default gpushare-webhook)")
    managed.add_argument("--secret", help="the Secret (default gpushare-webhook-tls)")
    managed.add_argument(
        "--webhook-config",
        help="name of the Mutating and ValidatingWebhookConfiguration (default gpushare-webhook)",
    )
    managed.add_argument(
        "--kubeconfig",
        help="kubeconfig file (default: in-cluster service account, else $KUBECONFIG "
        "or ~/.kube/config)",
    )
    serve.set_defaults(handler=command_serve)

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
    # Spelled out rather than imported from webhook.tls, which loads cryptography.
    generate.add_argument("--key-type", choices=["ecdsa-p256", "rsa-2048"], default="ecdsa-p256")
    generate.add_argument("--days", type=int, default=365, help="validity (default 365)")
    generate.set_defaults(handler=command_certs_generate)

    lint = commands.add_parser("lint", help="validate policy files")
    lint.add_argument("files", nargs="+", metavar="FILE")
    lint.set_defaults(handler=command_lint)

    manifests.configure_parser(commands.add_parser("manifests", help=manifests.MANIFESTS_HELP))

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
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
