"""The install manifests, rendered from the kustomize files in ``deploy/``.

``deploy/`` is the single source of every Kubernetes object: ``kubectl kustomize
deploy/`` renders it, and so does :func:`render`, with a small kustomize subset
(resources, ``configMapGenerator``, ``generatorOptions`` and JSON 6902 ``patches``
with a target). Anything else in a kustomization is refused rather than half
understood; ``tests/install/test_manifests.py`` checks both renders give the same objects.

Used by ``gpushare-webhook manifests`` (:mod:`webhook.cli.manifests`), by :func:`webhook_configurations` (the local
test cluster registers the real webhook configurations against a loopback URL),
and by anything that wants the install as dicts, e.g. a server-side dry run.

Wheels carry ``deploy/`` as ``webhook/_deploy`` (hatch ``force-include``); a source
checkout or editable install reads the repository's ``deploy/``.
"""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Final

import jsonpatch
import yaml

from webhook.core.policy import API_VERSION, KIND, Policy
from webhook.install.fingerprint import CONDITIONS_KEY, fingerprint_loader, spec_fingerprint, stamp
from webhook.install.mode import APISERVER, WEBHOOKS, Mode
from webhook.render import mutating, validating
from webhook.render.scope import MatchCondition, match_conditions, view_conditions
from webhook.render.targets import TARGETS

Obj = dict[str, Any]

BASE_NAMESPACE: Final = "gpushare-system"
POLICY_CONFIG_MAP: Final = "gpushare-policy"
POLICY_KEY: Final = "policy.yaml"
DEFAULT_OVERLAY: Final = "self-managed"
# The webhook mode's overlays (Kubernetes 1.30-1.35), one per way of getting certificates.
OVERLAYS: Final = ("self-managed", "cert-manager")
# The 1.36+ install (webhook.install.mode): no webhook, so no choice of certificates.
APISERVER_OVERLAY: Final = "apiserver"
# The installs with the cluster view on (serve --cluster --reports), per mode: deploy/cluster-view
# (the self-managed webhook install) and overlays/apiserver-cluster-view.
VIEW_OVERLAYS: Final = {"webhooks": "cluster-view", "apiserver": "apiserver-cluster-view"}
CONTAINER: Final = "webhook"
WEBHOOK_KINDS: Final = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")

_KUSTOMIZATION_FILES: Final = ("kustomization.yaml", "kustomization.yml", "Kustomization")
_SUPPORTED_FIELDS: Final = frozenset(
    {"apiVersion", "kind", "resources", "configMapGenerator", "generatorOptions", "patches"}
)
# kustomize's "legacy" output order: what must exist first comes first, and the
# webhook registrations come last, once the Service behind them exists.
_ORDER_FIRST: Final = (
    "Namespace",
    "ResourceQuota",
    "StorageClass",
    "CustomResourceDefinition",
    "ServiceAccount",
    "PodSecurityPolicy",
    "Role",
    "ClusterRole",
    "RoleBinding",
    "ClusterRoleBinding",
    "ConfigMap",
    "Secret",
    "Endpoints",
    "Service",
    "LimitRange",
    "PriorityClass",
    "PersistentVolume",
    "PersistentVolumeClaim",
    "Deployment",
    "StatefulSet",
    "CronJob",
    "PodDisruptionBudget",
)
_ORDER_LAST: Final = WEBHOOK_KINDS


class ManifestError(Exception):
    """The deploy files cannot be rendered, or an argument does not fit them."""


# --------------------------------------------------------------------------- files


def deploy_root() -> Path:
    """The ``deploy/`` directory: packaged in a wheel, else the source checkout's."""
    package = Path(__file__).resolve().parents[1]
    for candidate in (package / "_deploy", package.parent / "deploy"):
        if (candidate / "base").is_dir():
            return candidate
    raise ManifestError(f"no deploy files found next to {package} (broken installation)")


def report_crds() -> list[Obj]:
    """The report CRDs of ``deploy/reports`` (openreports.io Report, wgpolicyk8s.io PolicyReport)."""
    return _load_documents(deploy_root() / "reports" / "crds.yaml")


def overlay_dir(overlay: str = DEFAULT_OVERLAY) -> Path:
    if overlay == VIEW_OVERLAYS[WEBHOOKS]:
        return deploy_root() / overlay
    if overlay not in (*OVERLAYS, APISERVER_OVERLAY, VIEW_OVERLAYS[APISERVER]):
        raise ManifestError(f"unknown overlay {overlay!r}; choose one of {', '.join(OVERLAYS)}")
    return deploy_root() / "overlays" / overlay


def overlay_for(mode: Mode, overlay: str | None = None, *, cluster_view: bool = False) -> str:
    """The overlay that installs ``mode``: ``overlay`` (the certificates' choice, default
    self-managed) in the webhook mode; in the apiserver mode its own, which registers no
    webhook and so has no certificates to choose. ``cluster_view``: that mode's install
    with the cluster view on (self-managed certificates)."""
    if cluster_view:
        if overlay not in (None, DEFAULT_OVERLAY):
            raise ManifestError(
                f"--overlay {overlay} with --cluster-view: the cluster view's install keeps "
                "its own certificates (self-managed); the Helm chart has it with cert-manager"
            )
        return VIEW_OVERLAYS[mode]
    if mode == WEBHOOKS:
        return overlay or DEFAULT_OVERLAY
    if overlay not in (None, DEFAULT_OVERLAY):
        raise ManifestError(
            f"--overlay {overlay}: the install for Kubernetes 1.36+ registers no webhook, so "
            "it has no certificates to manage; for the webhooks on 1.36 pass "
            "--kubernetes-version 1.35"
        )
    return APISERVER_OVERLAY


def _load_documents(path: Path) -> list[Obj]:
    try:
        text = path.read_text("utf-8")
        documents = list(yaml.safe_load_all(text))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ManifestError(f"{path}: {exc}") from None
    objects = []
    for number, document in enumerate(documents, 1):
        if document is None:
            continue
        if not isinstance(document, dict) or not isinstance(document.get("kind"), str):
            raise ManifestError(f"{path}: document {number} is not a Kubernetes object")
        objects.append(document)
    return objects


def _inside(root: Path, relative: str) -> Path:
    """``root/relative``, refused (as kustomize does) when it resolves outside root."""
    path = (root / relative).resolve()
    if not path.is_relative_to(root.resolve()):
        raise ManifestError(f"{root}: file {relative!r} is not in or below {root}")
    return path


# ------------------------------------------------------------------ kustomize subset


def _gvk(obj: Obj) -> tuple[str, str, str]:
    group, _, version = str(obj.get("apiVersion", "")).rpartition("/")
    return group, version, str(obj["kind"])


def _identity(obj: Obj) -> tuple[str, str, str, str]:
    group, _, kind = _gvk(obj)
    metadata = obj.get("metadata") or {}
    return group, kind, str(metadata.get("namespace") or ""), str(metadata.get("name") or "")


def _sort_key(obj: Obj) -> tuple[int, str, str, str]:
    group, version, kind = _gvk(obj)
    if kind in _ORDER_FIRST:
        rank = _ORDER_FIRST.index(kind) - len(_ORDER_FIRST)
    elif kind in _ORDER_LAST:
        rank = 1 + _ORDER_LAST.index(kind)
    else:
        rank = 0
    gvk = "_".join((group or "~G", version or "~V", kind))
    metadata = obj.get("metadata") or {}
    return rank, gvk, str(metadata.get("namespace") or ""), str(metadata.get("name") or "")


def _config_map(root: Path, spec: Obj, options: Obj) -> Obj:
    unknown = set(spec) - {"name", "namespace", "files", "options"}
    if unknown:
        raise ManifestError(f"{root}: configMapGenerator field(s) not supported: {sorted(unknown)}")
    if options.get("disableNameSuffixHash") is not True:
        raise ManifestError(f"{root}: generatorOptions.disableNameSuffixHash must be true")
    data: dict[str, str] = {}
    for entry in spec.get("files") or []:
        key, _, source = str(entry).rpartition("=")
        key = key or Path(source).name
        try:
            data[key] = _inside(root, source).read_text("utf-8")
        except OSError as exc:
            raise ManifestError(f"{root}: configMapGenerator file {source!r}: {exc}") from None
    metadata: Obj = {"name": spec["name"]}
    if spec.get("namespace"):
        metadata["namespace"] = spec["namespace"]
    extra = spec.get("options") or {}
    if set(extra) - {"labels", "annotations"}:
        raise ManifestError(f"{root}: configMapGenerator options other than labels/annotations")
    for field in ("labels", "annotations"):
        if extra.get(field):
            metadata[field] = dict(extra[field])
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}


def _matches(obj: Obj, target: Obj) -> bool:
    group, version, kind = _gvk(obj)
    metadata = obj.get("metadata") or {}
    wanted = {
        "group": group,
        "version": version,
        "kind": kind,
        "name": metadata.get("name"),
        "namespace": metadata.get("namespace"),
    }
    unknown = set(target) - set(wanted)
    if unknown:
        raise ManifestError(f"patch target field(s) not supported: {sorted(unknown)}")
    return all(wanted[field] == value for field, value in target.items())


def _apply_patches(root: Path, objects: list[Obj], patches: Sequence[Obj]) -> list[Obj]:
    for number, spec in enumerate(patches, 1):
        where = f"{root}: patch {number}"
        if set(spec) - {"target", "patch", "path"} or "target" not in spec:
            raise ManifestError(f"{where}: only JSON 6902 patches with a target are supported")
        if "path" in spec:
            try:
                text = _inside(root, spec["path"]).read_text("utf-8")
            except OSError as exc:
                raise ManifestError(f"{where}: {exc}") from None
        else:
            text = str(spec.get("patch", ""))
        try:
            operations = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ManifestError(f"{where}: {exc}") from None
        if not isinstance(operations, list):
            raise ManifestError(f"{where}: not a JSON 6902 operation list")
        hits = 0
        for index, obj in enumerate(objects):
            if _matches(obj, spec["target"]):
                try:
                    objects[index] = jsonpatch.apply_patch(obj, operations)
                except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                    raise ManifestError(f"{where}: {exc}") from None
                hits += 1
        if not hits:
            raise ManifestError(f"{where}: target {spec['target']} matches no object")
    return objects


def build(directory: Path) -> list[Obj]:
    """The objects ``kubectl kustomize DIRECTORY`` renders, in the same order."""
    root = directory.resolve()
    file = next((root / name for name in _KUSTOMIZATION_FILES if (root / name).is_file()), None)
    if file is None:
        raise ManifestError(f"{root}: no kustomization.yaml")
    try:
        spec = yaml.safe_load(file.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ManifestError(f"{file}: {exc}") from None
    if not isinstance(spec, dict):
        raise ManifestError(f"{file}: not a Kustomization")
    unknown = set(spec) - _SUPPORTED_FIELDS
    if unknown:
        raise ManifestError(f"{file}: kustomize field(s) not supported here: {sorted(unknown)}")
    objects: list[Obj] = []
    for entry in spec.get("resources") or []:
        path = (root / str(entry)).resolve()
        if path.is_dir():
            objects.extend(build(path))
        else:
            objects.extend(_load_documents(_inside(root, str(entry))))
    options = spec.get("generatorOptions") or {}
    if set(options) - {"disableNameSuffixHash"}:
        raise ManifestError(f"{file}: generatorOptions other than disableNameSuffixHash")
    for generator in spec.get("configMapGenerator") or []:
        objects.append(_config_map(root, generator, options))
    objects = _apply_patches(root, objects, spec.get("patches") or [])
    seen: set[tuple[str, str, str, str]] = set()
    for obj in objects:
        identity = _identity(obj)
        if identity in seen:
            raise ManifestError(f"{root}: object defined twice: {identity}")
        seen.add(identity)
    return sorted(objects, key=_sort_key)


# ------------------------------------------------------------------ customisation


def _check_pem(ca_bundle: bytes) -> str:
    if b"-----BEGIN CERTIFICATE-----" not in ca_bundle:
        raise ManifestError("the CA bundle is not PEM (no BEGIN CERTIFICATE block)")
    return base64.b64encode(ca_bundle).decode("ascii")


def set_ca_bundle(objects: Iterable[Obj], ca_bundle: bytes) -> None:
    """Put the PEM ``ca_bundle`` (base64-encoded) into every webhook's clientConfig.

    An empty ``ca_bundle`` leaves caBundle out (the apiserver then trusts its system roots).
    """
    if not ca_bundle:
        return
    encoded = _check_pem(ca_bundle)
    for obj in objects:
        if obj["kind"] in WEBHOOK_KINDS:
            for hook in obj.get("webhooks") or []:
                hook.setdefault("clientConfig", {})["caBundle"] = encoded


def set_image(objects: Iterable[Obj], image: str) -> None:
    if not image or any(c.isspace() for c in image):
        raise ManifestError(f"not an image reference: {image!r}")
    for obj in objects:
        if obj["kind"] == "Deployment":
            for container in obj["spec"]["template"]["spec"]["containers"]:
                if container["name"] == CONTAINER:
                    container["image"] = image


_DNS_LABEL: Final = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def set_namespace(objects: Iterable[Obj], namespace: str) -> None:
    """Move the install from :data:`BASE_NAMESPACE` to ``namespace``, every reference included.

    Namespaced objects, the Namespace itself, RBAC subjects, the webhooks' Service
    reference and namespaceSelector exclusion, cert-manager's ``inject-ca-from`` and
    DNS names, and the ``--namespace`` argument of the self-managed mode.
    """
    if not _DNS_LABEL.match(namespace):
        raise ManifestError(f"not a valid namespace name: {namespace!r}")
    old = BASE_NAMESPACE
    dns_old = re.compile(rf"(?<=\.){re.escape(old)}(?=\.|$)")
    for obj in objects:
        kind = obj["kind"]
        metadata = obj.setdefault("metadata", {})
        if metadata.get("namespace") == old:
            metadata["namespace"] = namespace
        if kind == "Namespace" and metadata.get("name") == old:
            metadata["name"] = namespace
        annotations = metadata.get("annotations") or {}
        inject = annotations.get("cert-manager.io/inject-ca-from", "")
        if inject.startswith(f"{old}/"):
            annotations["cert-manager.io/inject-ca-from"] = namespace + inject[len(old) :]
        for subject in obj.get("subjects") or []:
            if subject.get("namespace") == old:
                subject["namespace"] = namespace
        hooks = (obj.get("webhooks") or []) if kind in WEBHOOK_KINDS else []
        for hook in hooks:
            service = (hook.get("clientConfig") or {}).get("service") or {}
            if service.get("namespace") == old:
                service["namespace"] = namespace
            selector = hook.get("namespaceSelector") or {}
            for expression in selector.get("matchExpressions") or []:
                expression["values"] = [
                    namespace if value == old else value for value in expression.get("values", [])
                ]
        if any(kind in target.kinds for target in TARGETS):
            spec = obj.get("spec") or {}
            for field in ("matchConstraints", "matchResources"):
                selector = (spec.get(field) or {}).get("namespaceSelector") or {}
                for expression in selector.get("matchExpressions") or []:
                    expression["values"] = [
                        namespace if value == old else value
                        for value in expression.get("values", [])
                    ]
        if kind == "Certificate":
            spec = obj.get("spec") or {}
            spec["dnsNames"] = [dns_old.sub(namespace, name) for name in spec.get("dnsNames", [])]
        if kind == "Deployment":
            for container in obj["spec"]["template"]["spec"]["containers"]:
                args = container.get("args") or []
                for index, arg in enumerate(args):
                    if arg == f"--namespace={old}":
                        args[index] = f"--namespace={namespace}"
                    elif arg == old and index and args[index - 1] == "--namespace":
                        args[index] = namespace


def set_match_conditions(objects: Iterable[Obj], policy: Policy) -> None:
    """Scope every webhook to what ``policy`` acts on (:mod:`webhook.render.scope`).

    ``deploy/webhooks`` already holds the default policy's conditions; a different policy
    needs its own, or an object it acts on could be skipped.
    """
    for obj in objects:
        if obj["kind"] in WEBHOOK_KINDS:
            for hook in obj.get("webhooks") or []:
                hook["matchConditions"] = [dict(c) for c in match_conditions(policy)]


def set_cel_policies(
    objects: list[Obj], policy: Policy, *, fingerprint: str, today: str | None = None
) -> None:
    """Replace the Validating- and MutatingAdmissionPolicies and their bindings in
    ``objects`` (in place) by those of ``policy`` (:mod:`webhook.render.validating`,
    :mod:`webhook.render.mutating`), each kind where its first one stood, marked
    with the policy's ``fingerprint`` (:mod:`webhook.install.fingerprint`), with the
    exceptions that stand on ``today`` (default: today, UTC); a kind ``objects`` does not
    hold stays out."""
    if today is None:
        today = time.strftime("%Y-%m-%d", time.gmtime())
    for target in TARGETS:
        kinds, rendered = target.kinds, target.render
        positions = [i for i, obj in enumerate(objects) if obj["kind"] in kinds]
        if not positions:
            continue
        at = positions[0]
        kept = [obj for obj in objects if obj["kind"] not in kinds]
        fresh = rendered(policy, today=today)
        stamp(fresh, fingerprint)
        kept[at:at] = fresh
        # Stable: the rest keeps its order, the new objects take kustomize's.
        objects[:] = sorted(kept, key=_sort_key)


def set_view_scope(objects: Iterable[Obj], policy: Policy) -> None:
    """Register the webhooks of ``objects`` only for what the cluster view decides, failing
    open: the apiserver mode with the view on (:func:`webhook.render.scope.view_conditions`).
    Every security rule holds in the apiserver there, so a webhook outage only loses the
    view's early refusals and conveniences, and refuses no pod."""
    for obj in objects:
        if obj["kind"] in WEBHOOK_KINDS:
            for hook in obj.get("webhooks") or []:
                hook["matchConditions"] = [dict(c) for c in view_conditions(policy)]
                hook["failurePolicy"] = "Ignore"


def cel_policies(
    policy: Policy, *, fingerprint: str | None = None, today: str | None = None
) -> list[Obj]:
    """The ValidatingAdmissionPolicies and bindings of ``policy``, as the install has
    them (what the dev cluster creates; :mod:`webhook.render.validating`), marked with
    ``fingerprint`` when given, with the exceptions that stand on ``today`` (default:
    today, UTC: rendered again after an exception's last day, it is gone)."""
    if today is None:
        today = time.strftime("%Y-%m-%d", time.gmtime())
    objects = validating.validating_policies(policy, today=today)
    if fingerprint is not None:
        stamp(objects, fingerprint)
    return objects


def mutating_policies(policy: Policy, *, fingerprint: str | None = None) -> list[Obj]:
    """The MutatingAdmissionPolicies and bindings of ``policy``, as the 1.36+ install has
    them (what the dev cluster creates there; :mod:`webhook.render.mutating`),
    marked with ``fingerprint`` when given."""
    objects = mutating.mutating_policies(policy)
    if fingerprint is not None:
        stamp(objects, fingerprint)
    return objects


def conditions_text(conditions: Sequence[MatchCondition], *, fingerprint: str) -> str:
    """matchConditions as ``manifests --print-match-conditions`` prints them and the chart
    reads them (policy.matchConditions): with the fingerprint of the policy they scope."""
    return to_yaml(
        [{CONDITIONS_KEY: fingerprint, "matchConditions": [dict(c) for c in conditions]}]
    )


CEL_POLICIES_FILE: Final = "celpolicies.yaml"
CEL_POLICIES_HEADER: Final = """\
# GENERATED by hack/update-match-conditions from the default policy
# (webhook/render/validating.py); do not edit. tests/render/test_validating.py fails
# when this file and the generator disagree.
#
# The deny rules CEL can express, as ValidatingAdmissionPolicies the apiserver itself
# evaluates: they hold while the webhook is down or not installed. One policy and one
# binding per action the policy's rules take (gpushare-deny, gpushare-warn,
# gpushare-audit), each rule one validation; validationActions follow the action.
# `gpushare-webhook manifests --only cel` prints only these; --policy FILE renders them
# for another policy.
"""


MUTATING_POLICIES_FILE: Final = "mutatingpolicies.yaml"
MUTATING_POLICIES_HEADER: Final = """\
# GENERATED by hack/update-match-conditions from the default policy
# (webhook/render/mutating.py); do not edit. tests/install/test_modes.py fails
# when this file and the generator disagree.
#
# The policy's mutation as MutatingAdmissionPolicies the apiserver itself applies
# (admissionregistration.k8s.io/v1, Kubernetes 1.36+): gpushare-mutate (fails closed)
# for objects that ask for a GPU of the policy, gpushare-void (fails open) for those that
# ask for none but name NVIDIA env. --policy FILE renders them for another policy.
"""


def mutating_policies_text(policy: Policy, *, fingerprint: str) -> str:
    """The text of deploy/mutatingpolicies/mutatingpolicies.yaml for ``policy`` (whose
    document's fingerprint is ``fingerprint``)."""
    objects = mutating_policies(policy, fingerprint=fingerprint)
    return MUTATING_POLICIES_HEADER + "---\n" + to_yaml(objects)


VIEW_PATCH_FILE: Final = "view-scope.yaml"
VIEW_PATCH_HEADER: Final = """\
# GENERATED by hack/update-match-conditions from the default policy
# (webhook/render/scope.py, view_conditions); do not edit. tests/install/test_modes.py
# fails when this file and the generator disagree.
#
# A JSON 6902 patch for each webhook configuration of the 1.36+ install with the cluster
# view: the webhook is sent only what the view decides, and fails open.
"""


def view_patch_text(policy: Policy) -> str:
    """The text of deploy/overlays/apiserver-cluster-view/view-scope.yaml for ``policy``: what
    :func:`set_view_scope` does, as a patch kustomize applies to each configuration."""
    operations = [
        {
            "op": "replace",
            "path": "/webhooks/0/matchConditions",
            "value": [dict(c) for c in view_conditions(policy)],
        },
        {"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Ignore"},
    ]
    return VIEW_PATCH_HEADER + yaml.dump(
        operations, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100
    )


def cel_policies_text(policy: Policy, *, fingerprint: str) -> str:
    """The text of deploy/base/celpolicies.yaml for ``policy`` (whose document's
    fingerprint is ``fingerprint``)."""
    return CEL_POLICIES_HEADER + "---\n" + to_yaml(cel_policies(policy, fingerprint=fingerprint))


HELM_VALUES_HEADER: Final = """\
# GENERATED by `gpushare-webhook manifests --helm-values --policy {source}`.
# The policy and every admission object rendered from it (the webhooks' scope, the
# cluster view's, the ValidatingAdmissionPolicies, the MutatingAdmissionPolicies), for
#   helm install ... --values THIS-FILE
# The chart refuses a policy whose admission objects were rendered from another one:
# after editing the policy, render this file again.
"""


def helm_values_text(
    policy: Policy,
    text: str,
    *,
    source: str,
    as_spec: bool = False,
    existing_config_map: str | None = None,
) -> str:
    """Helm values that install ``policy`` (its YAML ``text``, from ``source``) with every
    admission object rendered from it, each marked with its fingerprint, which the chart
    checks against the policy it installs. The policy goes in as ``policy.file``, with
    ``as_spec`` as a ``policy.spec`` values block, with ``existing_config_map`` not at all
    (that ConfigMap of the user's holds it). The in-apiserver policies are rendered for
    the base namespace; the chart moves them to the release's."""
    fingerprint = spec_fingerprint(text)
    given: Obj
    if existing_config_map is not None:
        given = {"existingConfigMap": existing_config_map}
    elif as_spec:
        document = yaml.load(text, Loader=fingerprint_loader())  # noqa: S506 - a SafeLoader
        given = {"spec": (document.get("spec") if isinstance(document, dict) else None) or {}}
    else:
        given = {"file": text}
    values = {
        "policy": {
            **given,
            "matchConditions": conditions_text(match_conditions(policy), fingerprint=fingerprint),
            "viewMatchConditions": conditions_text(
                view_conditions(policy), fingerprint=fingerprint
            ),
        },
        "celPolicies": {"manifests": to_yaml(cel_policies(policy, fingerprint=fingerprint))},
        "mutatingPolicies": {
            "manifests": to_yaml(mutating_policies(policy, fingerprint=fingerprint))
        },
    }
    body = yaml.dump(values, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100)
    return HELM_VALUES_HEADER.format(source=source) + body


def policy_yaml(policy: Policy) -> str:
    """A complete policy document for ``policy`` (its compiled spec: same digest)."""
    document = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": policy.name},
        "spec": policy.spec,
    }
    return yaml.dump(document, Dumper=_Dumper, sort_keys=False, default_flow_style=False)


def set_policy(objects: Iterable[Obj], policy: Policy, text: str | None = None) -> None:
    """Install ``policy``: the policy ConfigMap serves it (``text``, its YAML as written,
    else :func:`policy_yaml`), and both webhooks are scoped to it, so the two agree."""
    objects = list(objects)
    found = False
    for obj in objects:
        if obj["kind"] == "ConfigMap" and obj["metadata"].get("name") == POLICY_CONFIG_MAP:
            obj.setdefault("data", {})[POLICY_KEY] = (
                text if text is not None else policy_yaml(policy)
            )
            found = True
    if not found:
        raise ManifestError(f"no ConfigMap {POLICY_CONFIG_MAP} to put the policy into")
    set_match_conditions(objects, policy)


def render(
    *,
    overlay: str = DEFAULT_OVERLAY,
    namespace: str | None = None,
    image: str | None = None,
    ca_bundle: bytes | None = None,
    policy: Policy | None = None,
    policy_text: str | None = None,
) -> list[Obj]:
    """The whole install as dicts, in apply order: what ``manifests`` prints.

    This is the hook for checks against a real apiserver (server-side dry run):
    every object here is exactly what a user applies. ``policy`` is the policy to
    install (its YAML ``policy_text``, when there is one as written): in the policy
    ConfigMap, and as the webhooks' matchConditions. Default: the bundled policy.
    """
    if policy_text is not None and policy is None:
        raise ValueError("policy_text needs the policy it parses to")
    objects = build(overlay_dir(overlay))
    if policy is not None:
        set_policy(objects, policy, policy_text)
        text = policy_text if policy_text is not None else policy_yaml(policy)
        set_cel_policies(objects, policy, fingerprint=spec_fingerprint(text))
        if overlay == VIEW_OVERLAYS[APISERVER]:
            # Registered only for what the view decides there, failing open.
            set_view_scope(objects, policy)
    if namespace is not None and namespace != BASE_NAMESPACE:
        set_namespace(objects, namespace)
    if image is not None:
        set_image(objects, image)
    if ca_bundle is not None:
        set_ca_bundle(objects, ca_bundle)
    return objects


def webhook_configurations(
    *,
    ca_bundle: bytes,
    url: str | None = None,
    service: tuple[str, str] | None = None,
    policy: Policy | None = None,
    mode: Mode = WEBHOOKS,
) -> list[Obj]:
    """The Mutating- and ValidatingWebhookConfiguration of ``deploy/base``, ready to create.

    ``ca_bundle`` is the PEM CA the apiserver trusts for the webhook (empty: none). With ``url``
    (e.g. ``https://127.0.0.1:8443``) each webhook calls ``url`` + its path
    (``/mutate``, ``/validate``); with ``service=(name, namespace)`` it calls that
    Service on port 443 (and excludes that namespace instead of gpushare-system);
    with neither, the Service of the install. ``policy`` scopes both webhooks to what
    it acts on (default: the default policy's scope of ``deploy/webhooks``); in the
    apiserver ``mode`` to what the cluster view decides under ``policy`` (then required),
    failing open (:func:`set_view_scope`).
    Returns [mutating, validating].
    """
    if url is not None and service is not None:
        raise ValueError("give url or service, not both")
    if url is not None and not url.startswith("https://"):
        raise ValueError(f"webhook URLs must be https: {url!r}")
    configurations = build(deploy_root() / "webhooks")
    if service is not None:
        set_namespace(configurations, service[1])
    if mode == APISERVER:
        if policy is None:
            raise ValueError("the view's scope is the policy's: give the policy")
        set_view_scope(configurations, policy)
    elif policy is not None:
        set_match_conditions(configurations, policy)
    for obj in configurations:
        for hook in obj["webhooks"]:
            reference = hook["clientConfig"]["service"]
            if url is not None:
                hook["clientConfig"] = {"url": url.rstrip("/") + reference["path"]}
            elif service is not None:
                reference["name"] = service[0]
    set_ca_bundle(configurations, ca_bundle)
    return sorted(configurations, key=_sort_key)


# ------------------------------------------------- generated matchConditions in deploy/

GENERATED_BEGIN: Final = "# BEGIN generated matchConditions"
GENERATED_END: Final = "# END generated matchConditions"


def with_match_conditions(text: str, conditions: Sequence[MatchCondition]) -> str:
    """``text`` (deploy/webhooks/webhookconfigurations.yaml) with every region between the
    generated-region markers replaced by ``conditions``, indented like its marker.

    kustomize cannot run the generator, so the default policy's conditions are written
    into the file; ``hack/update-match-conditions`` calls this, and a test checks the file
    holds what the generator makes.
    """
    block = yaml.dump(
        {"matchConditions": [dict(c) for c in conditions]},
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        width=100,
    )
    out: list[str] = []
    inside = False
    regions = 0
    for line in text.splitlines(keepends=True):
        stripped = line.strip()
        if stripped.startswith(GENERATED_BEGIN):
            if inside:
                raise ManifestError(f"{GENERATED_BEGIN} twice without {GENERATED_END}")
            inside = True
            regions += 1
            out.append(line)
            indent = line[: len(line) - len(line.lstrip())]
            out.extend(indent + generated + "\n" for generated in block.splitlines())
        elif stripped.startswith(GENERATED_END):
            if not inside:
                raise ManifestError(f"{GENERATED_END} without {GENERATED_BEGIN}")
            inside = False
            out.append(line)
        elif not inside:
            out.append(line)
    if inside or not regions:
        raise ManifestError(f"no complete {GENERATED_BEGIN} ... {GENERATED_END} region")
    return "".join(out)


# ------------------------------------------------------------------ YAML and CLI


class _Dumper(yaml.SafeDumper):
    """Block style, multi-line strings (the policy file) as literal blocks, no aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


def to_yaml(objects: Iterable[Obj]) -> str:
    """A multi-document YAML stream of ``objects``."""
    return "---\n".join(
        yaml.dump(obj, Dumper=_Dumper, sort_keys=False, default_flow_style=False) for obj in objects
    )
