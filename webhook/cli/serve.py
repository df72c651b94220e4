"""``serve``: the HTTPS admission service."""

from __future__ import annotations

import argparse
import errno
import logging
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TextIO

from webhook.cli.common import Commands, UsageError

if TYPE_CHECKING:
    from webhook.certs.selfmanaged import SelfManagedConfig


_SELF_MANAGED_OPTIONS = (
    "namespace",
    "service",
    "secret",
    "webhook_config",
    "kubeconfig",
    "keep_scope",
    "interval",
    "lease_duration",
)


def _flag(option: str) -> str:
    """The command-line flag of a SelfManagedConfig field."""
    return "--check-interval" if option == "interval" else "--" + option.replace("_", "-")


def _self_managed(args: argparse.Namespace) -> SelfManagedConfig | None:
    given = {name: getattr(args, name) for name in _SELF_MANAGED_OPTIONS}
    given = {name: value for name, value in given.items() if value is not None}
    if not args.self_managed:
        if args.cluster:
            given.pop("kubeconfig", None)  # it also says where --cluster watches
        if given:
            flags = ", ".join(_flag(name) for name in given)
            raise UsageError(f"{flags}: only with --self-managed")
        return None
    if args.tls_cert or args.tls_key:
        raise UsageError("--self-managed issues its own certificate: drop --tls-cert/--tls-key")
    if not args.namespace:
        raise UsageError("--self-managed needs --namespace (where the Service and Secret live)")
    # Imported here: it loads the kubernetes client.
    from webhook.certs.issue import service_dns_names
    from webhook.certs.selfmanaged import SelfManagedConfig

    for name in ("interval", "lease_duration"):
        if name in given and not given[name] >= 1:
            raise UsageError(f"{_flag(name)} must be at least 1 second")
    config = SelfManagedConfig(**given)
    try:
        service_dns_names(config.service, config.namespace)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return config


def _cluster(args: argparse.Namespace) -> dict[str, Any]:
    """The ServerConfig fields of the cluster view options."""
    given = [
        flag
        for flag, value in (
            ("--cluster-stale-after", args.cluster_stale_after),
            ("--cluster-resync", args.cluster_resync),
        )
        if value is not None
    ]
    if not args.cluster:
        if args.reports:
            given.append("--reports")
        if given:
            raise UsageError(f"{', '.join(given)}: only with --cluster")
        return {}
    from webhook.cluster.client import ClusterAccessError, api_client
    from webhook.cluster.watch import Settings

    try:  # fail at start, in one line, rather than in every worker
        api_client(args.kubeconfig).close()
    except ClusterAccessError as exc:
        raise UsageError(f"--cluster: {exc}") from None
    settings = Settings()
    stale_after = args.cluster_stale_after or settings.stale_after
    resync = args.cluster_resync or settings.resync
    if stale_after < 10 or resync < 60:
        raise UsageError("--cluster-stale-after must be at least 10, --cluster-resync at least 60")
    return {
        "cluster": True,
        "reports": _reports(args),
        "cluster_kubeconfig": args.kubeconfig,
        "cluster_settings": replace(
            settings,
            stale_after=stale_after,
            resync=resync,
            # A quiet watch is reopened well before it could count as stale.
            read_timeout=min(settings.read_timeout, stale_after / 2),
        ),
    }


def _reports(args: argparse.Namespace) -> Any:
    """The policy reports' settings (``--reports``), or None."""
    given = [
        flag
        for flag, value in (
            ("--reports-policyreport", args.reports_policyreport or None),
            ("--reports-max-results", args.reports_max_results),
            ("--reports-interval", args.reports_interval),
            ("--reports-status", args.reports_status),
        )
        if value is not None
    ]
    if not args.reports:
        if given:
            raise UsageError(f"{', '.join(given)}: only with --reports")
        return None
    from webhook.cluster.reports import ReportSettings
    from webhook.core.scan import STATUSES

    settings = ReportSettings()
    asked = {s.strip() for s in (args.reports_status or "fail,warn").split(",")}
    statuses = tuple(s for s in STATUSES if s in asked)
    if not statuses or asked - set(STATUSES):
        raise UsageError("--reports-status takes fail, warn or both (fail,warn)")
    max_results = args.reports_max_results or settings.max_results
    interval = args.reports_interval or settings.interval
    if not 1 <= max_results <= 1000 or interval < 1:
        raise UsageError("--reports-max-results must be 1..1000, --reports-interval at least 1")
    return replace(
        settings,
        kinds=("openreports", "wgpolicyk8s") if args.reports_policyreport else ("openreports",),
        max_results=max_results,
        interval=interval,
        statuses=statuses,
    )


def command_serve(args: argparse.Namespace, stdin: TextIO, stdout: TextIO) -> int:
    # The server stack is imported here so review and lint start fast.
    from webhook.certs.material import CertificateError
    from webhook.service.limits import Limits
    from webhook.service.process import LOG_FORMAT, ListenError, ServerConfig, run

    logging.basicConfig(level=args.log_level, stream=sys.stderr, format=LOG_FORMAT)
    if args.workers < 1:
        raise UsageError("--workers must be at least 1")
    self_managed = _self_managed(args)
    try:
        limits = Limits(
            tls_handshake_timeout=args.tls_handshake_timeout,
            header_timeout=args.header_timeout,
            idle_timeout=args.idle_timeout,
            max_connections=args.max_connections,
            max_in_flight=args.max_in_flight,
        )
    except ValueError as exc:
        raise UsageError("--" + str(exc).replace("_", "-")) from None
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
        limits=limits,
        **_cluster(args),
    )
    try:
        return run(config)
    except CertificateError as exc:
        raise UsageError(str(exc)) from None
    except ListenError as exc:
        flag = "--port" if exc.listener == "webhook" else "--health-port"
        in_use = exc.errno == errno.EADDRINUSE
        hint = "stop what listens there or choose another" if in_use else "check"
        raise UsageError(f"{exc}; {hint} {flag}") from None
    except OSError as exc:
        raise UsageError(f"cannot serve: {exc}") from None


def register(commands: Commands) -> None:
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
    limits = serve.add_argument_group(
        "connection limits",
        "per worker process, the HTTPS and the health port each counted on their own; "
        "a connection over a time or size limit is reset, and counted in "
        "gpushare_connection_limits_total",
    )
    limits.add_argument(
        "--tls-handshake-timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="the TLS handshake must finish this long after the connect (default 5)",
    )
    limits.add_argument(
        "--header-timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="a request's headers must be complete this long after the handshake, or after "
        "the first byte of the next request on a kept-alive connection (default 5; "
        "the apiserver sends them at once; our webhooks time out after 3 s anyway)",
    )
    limits.add_argument(
        "--idle-timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="close a kept-alive connection idle this long (default 120: longer than the "
        "apiserver's own 90 s, so that it always closes first and never sends a review "
        "into a connection being closed)",
    )
    limits.add_argument(
        "--max-connections",
        type=int,
        default=512,
        metavar="N",
        help="open connections to the HTTPS port, handshakes included (default 512; the "
        "health port takes at most 64); at the cap a new connection evicts the one waiting "
        "longest without a request in progress, and is refused only when every connection "
        "has one",
    )
    limits.add_argument(
        "--max-in-flight",
        type=int,
        default=16,
        metavar="N",
        help="requests in progress (default 16); over it, a request whose body is still "
        "arriving is answered 429 with Retry-After: 1, which the apiserver retries within "
        "its timeout; a request whose body is complete is always answered",
    )
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
        "--no-keep-scope",
        dest="keep_scope",
        action="store_false",
        default=None,
        help="leave the webhooks' matchConditions and the CEL policies as installed; by "
        "default the leader re-renders them from the policy in force whenever it changes",
    )
    managed.add_argument(
        "--check-interval",
        dest="interval",
        type=float,
        metavar="SECONDS",
        help="check the Secret and the caBundle this often (default 60)",
    )
    managed.add_argument(
        "--lease-duration",
        type=float,
        metavar="SECONDS",
        help="the leader Lease's duration: a leader that stops without giving it up is "
        "replaced this long after its last renewal (default 30, renewed every third)",
    )
    managed.add_argument(
        "--kubeconfig",
        help="kubeconfig file, for --self-managed and --cluster (default: in-cluster "
        "service account, else $KUBECONFIG or ~/.kube/config)",
    )
    view = serve.add_argument_group(
        "cluster view",
        "watch Nodes, Namespaces, ResourceQuotas and ConfigMaps (read-only) so decisions "
        "can use them: ConfigMap env values, gpumem-percentage in MiB, no-fitting-node, "
        "Pod Security of the namespace, GPU quotas, MIG translation. While the view is not "
        "synced, decisions fall back to the pod spec; nothing waits for the API",
    )
    view.add_argument("--cluster", action="store_true", help="turn the cluster view on")
    view.add_argument(
        "--cluster-stale-after",
        type=float,
        metavar="SECONDS",
        help="fall back to the pod spec when a watched kind has heard nothing from the API "
        "this long (default 120)",
    )
    view.add_argument(
        "--cluster-resync",
        type=float,
        metavar="SECONDS",
        help="relist every kind this often, even while its watch is healthy (default 1800)",
    )
    reports = serve.add_argument_group(
        "policy reports",
        "with --cluster: judge every running and pending pod under the policy in force and "
        "write what it would refuse as one openreports.io Report per namespace (only the "
        "replica that leads the --self-managed Lease writes)",
    )
    reports.add_argument("--reports", action="store_true", help="turn policy reports on")
    reports.add_argument(
        "--reports-policyreport",
        action="store_true",
        help="also write wgpolicyk8s.io/v1alpha2 PolicyReports (for Policy Reporter)",
    )
    reports.add_argument(
        "--reports-max-results",
        type=int,
        metavar="N",
        help="results per report; the summary counts the rest (default 100)",
    )
    reports.add_argument(
        "--reports-interval",
        type=float,
        metavar="SECONDS",
        help="judge changes and write changed reports at most this often (default 10)",
    )
    reports.add_argument(
        "--reports-status",
        metavar="LIST",
        help="results to report: fail, warn or fail,warn (default fail,warn)",
    )
    serve.set_defaults(handler=command_serve)
