"""``manifests``: the install objects as YAML, without kustomize."""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path
from typing import Final, TextIO

from webhook.certs.selfmanaged import SelfManagedError, api_client
from webhook.cli.common import Commands
from webhook.install.fingerprint import spec_fingerprint
from webhook.install.manifests import (
    BASE_NAMESPACE,
    OVERLAYS,
    ManifestError,
    cel_policies,
    conditions_text,
    helm_values_text,
    mutating_policies,
    overlay_for,
    render,
    set_namespace,
    to_yaml,
)
from webhook.install.mode import WEBHOOKS, Mode, ModeError, detect, install_mode
from webhook.policies import DEFAULT_SOURCE, load_policy, parse_policy
from webhook.render.scope import match_conditions

MANIFESTS_HELP: Final = "print the install manifests (what kubectl kustomize deploy/ renders)"
MANIFESTS_DESCRIPTION: Final = """\
Print every object of the install as multi-document YAML, for `kubectl apply -f -`:
the same objects `kubectl kustomize deploy/` renders for the chosen overlay, policy
ConfigMap included.

Which install: the one for what the cluster's apiserver serves, asked through the
kubeconfig (--kubeconfig, else $KUBECONFIG or ~/.kube/config, in-cluster in a Pod).
Where MutatingAdmissionPolicy v1 is served (Kubernetes 1.36+), the policy's mutation and
its CEL rules are in-apiserver policies and no webhook is registered
(deploy/overlays/apiserver); elsewhere (1.30-1.35) the webhooks plus the
ValidatingAdmissionPolicies. --kubernetes-version X.Y decides without a cluster (1.35 on
a 1.36 cluster keeps the webhooks). With no kubeconfig at all, the webhook install is
printed (it works on every supported version) and stderr says so.

--cluster-view prints the install with the cluster view and policy reports on (serve
--cluster --reports, its read-only RBAC and the report CRDs): deploy/cluster-view, or on
1.36+ deploy/overlays/apiserver-cluster-view, where the webhooks are registered only for
what the view decides, failing open.

Certificates: with the self-managed overlay (the default) the webhook creates its
CA and serving certificate at start and writes the caBundle into its own webhook
configurations, so none is needed here. With --overlay cert-manager, cert-manager's
cainjector fills it. --ca-bundle FILE writes a PEM CA into the configurations now,
e.g. when you serve a certificate of your own.

Policy and scope: both webhooks carry matchConditions generated from the policy,
so only objects the policy can act on reach the webhook (plain pods never do).
--policy FILE installs that policy: its text goes into the gpushare-policy
ConfigMap and both webhooks are scoped to it, so the two agree.
--print-match-conditions prints only the conditions (of --policy FILE, or of the
bundled default policy), e.g. to patch them into an overlay of your own.

In-apiserver policies: the install also carries the policy's rules CEL can express as
ValidatingAdmissionPolicies, one policy and binding per action some rule takes
(gpushare-deny, gpushare-warn, gpushare-audit; and gpushare-deny-sources, ... for the
ConfigMaps, Secrets and DRA objects pods take env and devices from), evaluated by the
apiserver itself; on 1.36+ also its mutation as the MutatingAdmissionPolicies
gpushare-mutate and gpushare-void. --only cel prints just the former and --only mutating
just the latter (of --policy FILE, in --namespace's scope).

Every in-apiserver policy and every matchConditions text carries the fingerprint of the
policy it was rendered from (annotation gpushare.io/policy-spec). --helm-values prints a
Helm values file with the policy and all of them, for `helm install --values`: the chart
refuses a policy whose admission objects were rendered from another one."""


def register(commands: Commands) -> None:
    parser = commands.add_parser("manifests", help=MANIFESTS_HELP)
    parser.description = MANIFESTS_DESCRIPTION
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "--overlay",
        choices=OVERLAYS,
        help="certificate management of the webhook install (default: self-managed)",
    )
    parser.add_argument(
        "--cluster-view",
        action="store_true",
        help="the install with the cluster view and policy reports on (deploy/cluster-view, "
        "or on 1.36+ deploy/overlays/apiserver-cluster-view)",
    )
    parser.add_argument(
        "--kubernetes-version",
        metavar="X.Y",
        help="render for this Kubernetes version instead of asking the cluster",
    )
    parser.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="the cluster to ask (default: in-cluster, else $KUBECONFIG or ~/.kube/config)",
    )
    parser.add_argument(
        "--namespace",
        default=BASE_NAMESPACE,
        help=f"namespace to install into (default: {BASE_NAMESPACE})",
    )
    parser.add_argument("--image", help="container image (default: this version's release image)")
    parser.add_argument("--ca-bundle", metavar="FILE", help="PEM CA to put into caBundle")
    parser.add_argument(
        "--policy",
        metavar="FILE",
        help="the policy to install (ConfigMap and matchConditions; default: the bundled one)",
    )
    parser.add_argument(
        "--print-match-conditions",
        action="store_true",
        help="print only the matchConditions (YAML) of the policy and exit",
    )
    parser.add_argument(
        "--only",
        choices=("cel", "mutating"),
        help="print only these objects: cel = the ValidatingAdmissionPolicies and bindings, "
        "mutating = the MutatingAdmissionPolicies and bindings (Kubernetes 1.36+)",
    )
    parser.add_argument(
        "--helm-values",
        action="store_true",
        help="print a Helm values file: the policy with every admission object rendered from it",
    )
    parser.set_defaults(handler=command_manifests)


def command_manifests(args: argparse.Namespace, stdin: TextIO, stdout: TextIO) -> int:
    policy_text = None
    if args.policy:
        try:
            policy_text = Path(args.policy).read_text("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            sys.stderr.write(f"gpushare-webhook: {args.policy}: cannot read: {exc}\n")
            return 2
    # A bad policy is a PolicyError: main() reports it line by line (exit 2).
    policy = (
        parse_policy(policy_text, source=args.policy)
        if policy_text is not None
        else load_policy(None)
    )
    # The fingerprint of the policy as written: what the chart computes from its values.
    fingerprint = spec_fingerprint(policy_text if policy_text is not None else _default_text())
    if args.print_match_conditions:
        stdout.write(conditions_text(match_conditions(policy), fingerprint=fingerprint))
        return 0
    if args.helm_values:
        source = args.policy or DEFAULT_SOURCE
        text = policy_text if policy_text is not None else _default_text()
        stdout.write(helm_values_text(policy, text, source=source))
        return 0
    if args.only:
        render_only = cel_policies if args.only == "cel" else mutating_policies
        objects = render_only(policy, fingerprint=fingerprint)
        try:
            set_namespace(objects, args.namespace)
        except ManifestError as exc:
            sys.stderr.write(f"gpushare-webhook: {exc}\n")
            return 2
        stdout.write(to_yaml(objects))
        return 0
    try:
        overlay = overlay_for(_mode(args), args.overlay, cluster_view=args.cluster_view)
        ca_bundle = None
        if args.ca_bundle:
            try:
                ca_bundle = Path(args.ca_bundle).read_bytes()
            except OSError as exc:
                raise ManifestError(f"{args.ca_bundle}: cannot read: {exc}") from None
        objects = render(
            overlay=overlay,
            namespace=args.namespace,
            image=args.image,
            ca_bundle=ca_bundle,
            # The ConfigMap gets the file as written, comments included.
            policy=policy if policy_text is not None else None,
            policy_text=policy_text,
        )
    except (ManifestError, ModeError) as exc:
        sys.stderr.write(f"gpushare-webhook: {exc}\n")
        return 2
    stdout.write(to_yaml(objects))
    return 0


def _default_text() -> str:
    return resources.files("webhook.policies").joinpath("default.yaml").read_text("utf-8")


def _mode(args: argparse.Namespace) -> Mode:
    """The install's mode: of --kubernetes-version, else of the cluster the kubeconfig
    names, else (no kubeconfig at all) the webhook install, which every version runs."""
    if args.kubernetes_version:
        return install_mode(kubernetes_version=args.kubernetes_version)
    try:
        client = api_client(args.kubeconfig)
    except SelfManagedError as exc:
        if args.kubeconfig:
            raise ManifestError(str(exc)) from None
        sys.stderr.write(
            "gpushare-webhook: no cluster to ask which install it gets (no kubeconfig): "
            "printing the webhook install; --kubernetes-version 1.36 prints the one for "
            "1.36+\n"
        )
        return WEBHOOKS
    try:
        return detect(client)
    except Exception as exc:  # any failure to ask is the same answer
        raise ManifestError(
            f"cannot ask the cluster which install it gets ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}); pass --kubernetes-version X.Y"
        ) from None
    finally:
        client.close()
