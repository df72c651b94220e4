"""What the apiserver holds of the install, kept in step with the policy in force.

The webhooks' ``matchConditions`` (:mod:`webhook.render.scope`) and the
ValidatingAdmissionPolicies (:mod:`webhook.render.validating`) are rendered from a
policy. When the policy's ConfigMap changes, a running self-managed install must follow,
or the apiserver skips objects the new policy acts on (conditions too narrow) and keeps
enforcing rules the new policy switched off or softened (stale CEL policies).

:class:`ScopeKeeper` is run by the holder of the self-managed Lease (one writer), at each
certificate check and at once when the policy changes:

- every webhook of the two configurations gets the policy's conditions, by a JSON patch
  that tests each webhook's name first (it fails rather than land on a reordered list);
- the CEL policies and bindings (one per action: ``gpushare-deny``, ``-warn``,
  ``-audit``) are replaced by what the policy renders (created when missing) and those
  the policy no longer renders (no rule takes that action any more) are deleted. Only
  when the install carries them: an install without any of them (``manifests`` without
  the CEL part, or a cluster older than 1.30) chose not to have them, and none is
  created. Labelled objects under other names (an older install's one policy per rule)
  are reported, not deleted: the install's RBAC reaches the rendered names only;
- the MutatingAdmissionPolicies and bindings (``gpushare-mutate``, ``gpushare-void``) the
  same way, where the apiserver serves them (:mod:`webhook.install.mode`) and the install
  carries them (the 1.36+ install). Such an install registers the webhooks only with the
  cluster view, for what the view decides, so their conditions are then
  :func:`~webhook.render.scope.view_conditions`: the install's objects, not the
  apiserver's version, say which, so a webhook install on 1.36 keeps its full scope.

Writes happen only on a difference, so a check in a quiet cluster reads and writes nothing
else. Blocking calls (the ``kubernetes`` client): run it in a thread.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, NamedTuple

import orjson

from webhook.core.policy import Policy
from webhook.install.fingerprint import spec_fingerprint, stamp
from webhook.install.mode import APISERVER, install_mode, served_kinds
from webhook.render.admission import LABELS
from webhook.render.scope import MatchCondition, match_conditions, view_conditions
from webhook.render.targets import MUTATING, VALIDATING, Target

log = logging.getLogger(__name__)

# The digest of the object as rendered: a field the policy no longer sets is a change
# too, which comparing only the fields it does set would miss.
RENDERED: Final = "gpushare.io/rendered"
_NOT_FOUND: Final = 404
_FORBIDDEN: Final = 403
_SELECTOR: Final = ",".join(f"{key}={value}" for key, value in sorted(LABELS.items()))

Obj = dict[str, Any]


def conditions_patch(config: Mapping[str, Any], conditions: Sequence[MatchCondition]) -> list[Obj]:
    """The JSON patch giving every webhook of ``config`` exactly ``conditions``."""
    wanted = [dict(c) for c in conditions]
    operations: list[Obj] = []
    for index, hook in enumerate(config.get("webhooks") or []):
        if (hook.get("matchConditions") or []) == wanted:
            continue
        operations.append({"op": "test", "path": f"/webhooks/{index}/name", "value": hook["name"]})
        if wanted:
            operations.append(
                {"op": "add", "path": f"/webhooks/{index}/matchConditions", "value": wanted}
            )
        else:
            operations.append({"op": "remove", "path": f"/webhooks/{index}/matchConditions"})
    return operations


def _read(response: Any) -> Any:
    return orjson.loads(response.data)


class _KindApi(NamedTuple):
    list: Callable[..., Any]
    create: Callable[..., Any]
    replace: Callable[..., Any]
    delete: Callable[..., Any]


class _Family(NamedTuple):
    """One kind of in-apiserver policy the install renders from the policy."""

    policy_kind: str
    binding_kind: str
    names: tuple[str, ...]
    render: Callable[..., list[Obj]]
    apis: dict[str, _KindApi]


class ScopeKeeper:
    """Brings the webhook configurations' conditions and the in-apiserver policies in line
    with a policy."""

    def __init__(
        self,
        api_client: Any,
        *,
        webhook_config: str,
        namespace: str,
        request_timeout: float = 10.0,
    ) -> None:
        from kubernetes import client

        self._api_client = api_client
        self._api: Any = client.AdmissionregistrationV1Api(api_client)
        self.webhook_config = webhook_config
        # The webhook's own namespace: the CEL policies leave it alone, like kube-system.
        self.namespace = namespace
        self._timeout = request_timeout
        self._missing: set[str] = set()
        self._foreign: set[tuple[str, str]] = set()

    def reconcile(self, policy: Policy, *, text: str | None = None) -> list[str]:
        """Bring the cluster in line with ``policy`` (whose YAML is ``text``, when known:
        what is rendered carries its fingerprint, as the install's objects do); what was
        changed, one line each."""
        mark = spec_fingerprint(text) if text is not None else None
        changes = self._reconcile_family(self._validating(), policy, mark)[1]
        mutating: list[str] = []
        carried = False
        if install_mode(served_kinds(self._api_client, timeout=self._timeout)) == APISERVER:
            carried, mutating = self._reconcile_family(self._mutating(), policy, mark)
        changes.extend(mutating)
        changes[:0] = self._reconcile_conditions(
            view_conditions(policy) if carried else match_conditions(policy),
            # The 1.36+ install registers the webhooks only with the cluster view.
            registered=not carried,
        )
        for change in changes:
            log.info("policy %s (%s): %s", policy.name, policy.digest, change)
        return changes

    # -- matchConditions -------------------------------------------------------------

    def _reconcile_conditions(
        self, conditions: Sequence[MatchCondition], *, registered: bool
    ) -> list[str]:
        """``registered``: the install registers the webhooks, so a missing one is worth
        a warning."""
        changes = []
        for kind, read, patch in (
            (
                "MutatingWebhookConfiguration",
                self._api.read_mutating_webhook_configuration,
                self._api.patch_mutating_webhook_configuration,
            ),
            (
                "ValidatingWebhookConfiguration",
                self._api.read_validating_webhook_configuration,
                self._api.patch_validating_webhook_configuration,
            ),
        ):
            config = self._get(kind, read, self.webhook_config, registered=registered)
            if config is None:
                continue
            operations = conditions_patch(config, conditions)
            if not operations:
                continue
            patch(
                self.webhook_config,
                operations,
                _content_type="application/json-patch+json",
                _preload_content=False,
                _request_timeout=self._timeout,
            )
            changes.append(
                f"{kind} {self.webhook_config}: matchConditions of "
                f"{len(operations) // 2} webhooks rewritten"
            )
        return changes

    def _get(
        self, kind: str, read: Callable[..., Any], name: str, *, registered: bool
    ) -> Obj | None:
        from kubernetes.client.exceptions import ApiException

        try:
            config: Obj = _read(read(name, _preload_content=False, _request_timeout=self._timeout))
        except ApiException as exc:
            if exc.status != _NOT_FOUND:
                raise
            if kind not in self._missing:
                self._missing.add(kind)
                log.log(
                    logging.WARNING if registered else logging.DEBUG,
                    "%s %s does not exist: its matchConditions are not kept",
                    kind,
                    name,
                )
            return None
        self._missing.discard(kind)
        return config

    # -- Validating- and MutatingAdmissionPolicies -----------------------------------

    def _family(self, target: Target) -> _Family:
        api = self._api
        calls = {
            target.policy_kind: f"{target.family}_admission_policy",
            target.binding_kind: f"{target.family}_admission_policy_binding",
        }
        return _Family(
            target.policy_kind,
            target.binding_kind,
            target.names,
            target.render,
            {
                k: _KindApi(
                    getattr(api, f"list_{suffix}"),
                    getattr(api, f"create_{suffix}"),
                    getattr(api, f"replace_{suffix}"),
                    getattr(api, f"delete_{suffix}"),
                )
                for k, suffix in calls.items()
            },
        )

    def _validating(self) -> _Family:
        return self._family(VALIDATING)

    def _mutating(self) -> _Family:
        return self._family(MUTATING)

    def _reconcile_family(
        self, family: _Family, policy: Policy, mark: str | None = None
    ) -> tuple[bool, list[str]]:
        """Whether the install carries ``family``, and what was changed of it."""
        from kubernetes.client.exceptions import ApiException

        kinds = family.apis
        present: dict[str, dict[str, Obj]] = {}
        for kind, calls in kinds.items():
            try:
                listed = _read(
                    calls.list(
                        label_selector=_SELECTOR,
                        _preload_content=False,
                        _request_timeout=self._timeout,
                    )
                )
            except ApiException as exc:
                # The webhook install's RBAC reaches no MutatingAdmissionPolicy (it has
                # none to keep): such an install does not carry them.
                if exc.status != _FORBIDDEN or family.policy_kind == VALIDATING.policy_kind:
                    raise
                if kind not in self._missing:
                    self._missing.add(kind)
                    log.info("%s: not allowed to list them, so none is kept", kind)
                return False, []
            present[kind] = {o["metadata"]["name"]: o for o in listed.get("items") or []}
        if not any(present.values()):
            return False, []
        # Rendered on today: an exception past its last day leaves the apiserver at the
        # first reconcile after it (the leader's duty runs at each certificate check).
        today = time.strftime("%Y-%m-%d", time.gmtime())
        rendered = family.render(policy, namespace=self.namespace, today=today)
        if mark is not None:
            stamp(rendered, mark)
        wanted = [_stamped(obj) for obj in rendered]
        changes = []
        # Policies before their bindings when applying; bindings first when deleting, so
        # that a binding never names a policy that is gone.
        for obj in wanted:
            kind, name = obj["kind"], obj["metadata"]["name"]
            before = present[kind].get(name)
            if before is not None and _holds(before, obj):
                continue
            calls = kinds[kind]
            # A replace, not an apply: the whole object as rendered (an apply would merge
            # set-like lists such as validationActions with what another manager wrote).
            if before is None:
                calls.create(obj, _preload_content=False, _request_timeout=self._timeout)
            else:
                obj["metadata"]["resourceVersion"] = before["metadata"]["resourceVersion"]
                calls.replace(name, obj, _preload_content=False, _request_timeout=self._timeout)
            changes.append(f"{kind} {name} {'created' if before is None else 'updated'}")
        names = {(o["kind"], o["metadata"]["name"]) for o in wanted}
        for kind in (family.binding_kind, family.policy_kind):
            for name in sorted(present[kind]):
                if (kind, name) in names:
                    continue
                if name not in family.names:
                    self._report_foreign(kind, name, family.names)
                    continue
                kinds[kind].delete(name, _preload_content=False, _request_timeout=self._timeout)
                changes.append(f"{kind} {name} deleted: the policy no longer renders it")
        return True, changes

    def _report_foreign(self, kind: str, name: str, rendered: Sequence[str]) -> None:
        if (kind, name) in self._foreign:
            return
        self._foreign.add((kind, name))
        log.warning(
            "%s %s carries the install's labels but is not a name it renders (%s): it is "
            "left alone and still enforced; delete it (kubectl delete %s %s) if an older "
            "install left it",
            kind,
            name,
            ", ".join(rendered),
            kind.lower(),
            name,
        )


def _stamped(obj: Obj) -> Obj:
    digest = hashlib.sha256(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]
    metadata = obj["metadata"]
    metadata["annotations"] = {**(metadata.get("annotations") or {}), RENDERED: digest}
    return obj


def _holds(stored: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether ``stored`` is ``wanted`` as rendered, unedited since: same digest, and every
    field ``wanted`` sets still set (the apiserver's own defaults are no difference)."""
    annotations = (stored.get("metadata") or {}).get("annotations") or {}
    if annotations.get(RENDERED) != wanted["metadata"]["annotations"][RENDERED]:
        return False
    return _covers(stored.get("spec"), wanted.get("spec")) and _covers(
        (stored.get("metadata") or {}).get("labels"), (wanted.get("metadata") or {}).get("labels")
    )


def _covers(stored: Any, wanted: Any) -> bool:
    if isinstance(wanted, Mapping):
        return isinstance(stored, Mapping) and all(
            _covers(stored.get(key), value) for key, value in wanted.items()
        )
    if isinstance(wanted, list):
        return (
            isinstance(stored, list)
            and len(stored) == len(wanted)
            and all(_covers(s, w) for s, w in zip(stored, wanted, strict=True))
        )
    return bool(stored == wanted)
