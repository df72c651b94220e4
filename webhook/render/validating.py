"""The deny rules CEL can express, as ValidatingAdmissionPolicies: no webhook needed.

For clusters that want no webhook in the validation path at all (or a second line
behind it): the apiserver itself evaluates these policies, so they hold while the
webhook is down, unregistered or not installed. They are rendered from a compiled
:class:`~webhook.core.policy.Policy`, one ``ValidatingAdmissionPolicy`` and one
``ValidatingAdmissionPolicyBinding`` per action some rule takes (``gpushare-deny``,
``gpushare-warn``, ``gpushare-audit``): ``validationActions`` belong to a binding, so
the action maps to them (deny -> Deny, warn -> Warn, audit -> Audit; a rule that is
off is not rendered), and each rule of that action is one of the policy's
``validations``. Per action, not per rule, because the apiserver converts the whole
object to unstructured once per policy and filter (matchConditions, then validations):
seven policies converted every pod about fourteen times, which cost each pod create
~2 ms. Each validation's message starts with the rule id in brackets, as the webhook's
denials do (``[privileged-gpu] ...``); a container rule's ``messageExpression`` then names
the first container that breaks it and the field, in the core's redacted words
(:func:`message_expressions`). A Deny names only the first failing validation (in
:data:`RULES` order); Warn sends one warning per failing validation. ``gpushare-overrides``
warns what the MutatingAdmissionPolicy replaced (:func:`_override_policies`).

Rendered (each equals the decision core's verdict on the objects the apiserver admits;
tests/e2e/test_celpolicy.py compares the two on generated objects):

- privileged-gpu: a GPU pod (or template) with any privileged container, init or
  ephemeral container.
- node-name-pinning: a GPU pod created with spec.nodeName (or a template with one).
- raw-visible-devices: NVIDIA_VISIBLE_DEVICES from valueFrom, or a value other than
  void/none/empty (case and surrounding space ignored).
- limit-tampering (its env switches only): CUDA_DISABLE_CONTROL truthy,
  GPU_CORE_UTILIZATION_POLICY=disable (unless the policy allows it), CUDA_REDIRECT
  non-empty, ACTIVE_OOM_KILLER false/0, CGPU_DISABLE other than false/0, any of them
  from valueFrom or with $(VAR), in a GPU pod. Limits above the request stay the webhook's (they need the parsed request).
- scheduler-bypass: a GPU-sharing pod (or template) in mode vgpu or mps naming a
  scheduler other than the one that accounts for its resources (the policy's
  per-resource schedulerName, else its per-mode one, else its default),
  default-scheduler, empty or an allowed one; the mode is chosen as the core chooses
  it (mode annotations, node selectors, MIG resources, the namespace's mode, the
  default).
- forged-allocation: a reserved annotation on a created pod or template; on a pod
  UPDATE, a reserved annotation added, changed or removed. The policy's
  reservedAnnotationWriters are matched on ``request.userInfo``.
- host-device-access: hostPath volumes (any pod) that are protected (device nodes and
  their parents, the kubelet's state, /proc, runtime sockets, the libvgpu, lock and MPS
  pipe directories, the policy's protected paths, and the directories above them), that
  hold the GPU runtime's configuration or the GPU stack (the driver's libraries and tools,
  sysfs, the policy's hostPaths.driverRoots) and are mounted writable, or (allowlist mode, GPU
  pods) that lie outside the allowed paths, unless the volume is exactly one the
  mutation injects into this pod; mounts of the injected shared volumes without
  readOnly; mountPaths that /var/run/nvidia-container-devices (or /run/...) starts, raw
  or cleaned (the toolkit's string prefix), and mountPaths at or below a path the GPU
  stack reads inside the container (``rules.read_paths``: /etc/ld.so.preload,
  /overrideEnv, /usr/local/vgpu, the lock and MPS pipe directories, the policy's
  containerPaths.protected) that are not a mount the mutation injects into this pod, of
  the volume it injects; any CDI annotation key, CRI-O's devices annotation
  naming a device off runtimeAnnotations.allowedDevices, and a key with one of its
  refusedPrefixes. Paths are compared after dropping ``//``, ``.``
  and trailing slashes (strings' split/join), as the core's normalisation does: the
  apiserver refuses a hostPath with a ``..`` segment. A mountPath may hold ``..``, which
  CEL cannot resolve (it takes a stack): a mountPath with a ``..`` segment is the
  webhook's alone. On a pod UPDATE the old pod is judged in the new
  pod's mode (see :func:`_host_device_access`).

- invalid-gpu-request: per container, as ``resources.read_container`` reads the
  quantities (CEL's ``isQuantity``/``quantity()`` on the canonical text the apiserver
  hands admission): a GPU resource in requests but not limits, or whose request is
  another quantity than its limit; a value outside its unit's range (counts and MIG
  instances 1..64, MiB 1..512 Gi, GiB 1..1024 and above that MiB up to 512 Gi,
  percentages 1..100), with a binary
  suffix or a fraction; a priority that is no integer; memory asked twice.
- mode-conflict: in the mode chosen as above, a mode annotation whose value is no mode
  (before the first that is one), MIG and shared-GPU resources in one container, MIG in
  a pod of another mode, slices in a MIG pod (or in mode none not by default), a node
  selector of another mode, an MPS node selector with another value, a mode the
  namespace may not use (the policy's globs), and an mps container asking for memory as
  a percentage only. The last is what the core decides without the cluster view (which
  alone knows the card to turn it into MiB): the policy refuses it even where the
  webhook's view would have resolved it.
- gpu-quota (only when the policy sets a maximum): per container its GPU devices,
  memory times its (v)GPUs and cores; per pod the peak of what runs together, main
  containers beside the sidecar init containers, or a plain init container beside the
  sidecars declared before it (``rules.pod_totals``). ResourceQuotas are the cluster
  view's.
- unmutated-gpu-pod: a created GPU-sharing pod or template lacking what
  ``mutation.first_missing`` asks for: in mode vgpu or mps the scheduler, the mode
  annotation, the injected volumes, hostIPC and the MPS node selector (mps), and in each
  sharing container and init container the last env entry of each wanted name with the
  wanted value (no valueFrom; LD_PRELOAD may keep the user's libraries after ours, a user's
  ``force`` or ``1`` stays), no stray vGPU limit variable, the injected mounts exactly,
  the count resource the slices imply; in every mode ``NVIDIA_VISIBLE_DEVICES`` in each
  container that asks for no GPU. A ValidatingAdmissionPolicy sees the object after every
  mutation, the webhook's (1.30-1.35) or the MutatingAdmissionPolicies' (1.36), so it
  refuses what another mutator changed afterwards as /validate does. One thing it reads
  more loosely than the core, so as never to be stricter than the webhook with its
  cluster view: a container asking for memory as a percentage gets no per-GPU memory
  limit without the view (CEL has none), and with it the limits of the MiB the view
  resolves; so ``CUDA_DEVICE_MEMORY_LIMIT_<i>`` (i below its GPU count) there is neither
  asked for nor refused as stray, whatever its value.

Quantities are read in name order over limits and requests where the core reads limits
in key order and then what is only in requests; the two differ only for a GPU resource in
requests alone, which the apiserver refuses.

Left to the webhook: what needs the cluster view (no-fitting-node, ResourceQuotas,
percentages resolved to MiB, MIG translation, ConfigMap env), limit-tampering's limits
above the request, and a mountPath with ``..``.

Scope as the webhooks': their matchCondition comes first (no validation runs on an
object outside it); pods (CREATE, UPDATE) and the workload kinds (CREATE, UPDATE),
namespaces other than kube-system and the install's; the policy's exemptions
(namespaces, users, groups, service accounts) are matchConditions. On a pod UPDATE a
rule refuses only what the old object did not already break, as the core judges an
update by what it adds.

Pure: a policy in, a list of objects out. CEL sees the objects without assuming any
optional field: each one is guarded by ``has()`` before it is read. Names and mountPaths
of containers, env entries, volumes and mounts are read as they are: the apiserver
validates the object before validating admission, and refuses one without them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from webhook.core.policy import Action, Policy
from webhook.render.admission import (
    API_VERSION,
    LABELS,
    NAME_PREFIX,
    OVERRIDES_ANNOTATION,
    OVERRIDES_LABEL_VALUE,
    SYSTEM_NAMESPACES,
    AuditAnnotation,
    ValidatingSpec,
    Validation,
    exemption_conditions,
    match_constraints,
    readable,
)
from webhook.render.cel import NamedExpression, literal, text
from webhook.render.claims import pod_claims, written_claim_variables, written_claims
from webhook.render.env import (
    env_tables,
    limit_tampering,
    raw_visible_devices,
    tampering_pieces,
    visible_pieces,
    written_env,
    written_env_variables,
)
from webhook.render.exception import excepted, unless_excepted
from webhook.render.forged import forged_allocation, forged_variables
from webhook.render.messages import MESSAGES, SOURCE_MESSAGES, message_expressions
from webhook.render.modes import conflict_variables, mode_conflict
from webhook.render.mutated import unmutated, unmutated_variables
from webhook.render.paths import host_access_variables, host_device_access
from webhook.render.pod import Obj, PodTest, pod_pieces
from webhook.render.privilege import node_name_pinning, privileged_gpu
from webhook.render.requests import (
    gpu_quota,
    invalid_gpu_request,
    request_problem_variables,
    request_variables,
)
from webhook.render.scheduling import scheduler_bypass
from webhook.render.scope import match_conditions as scope_conditions
from webhook.render.variables import variables

POLICY_KIND: Final = "ValidatingAdmissionPolicy"


BINDING_KIND: Final = "ValidatingAdmissionPolicyBinding"


KINDS: Final = (POLICY_KIND, BINDING_KIND)


# Warn also records the failure in the apiserver's audit log, as the webhook records a warn
# violation in its own: an audit-first rollout reads either (`report --audit-log`).
VALIDATION_ACTIONS: Final[Mapping[Action, list[str]]] = {
    "deny": ["Deny"],
    "warn": ["Warn", "Audit"],
    "audit": ["Audit"],
}


# The actions whose failures an audit-first rollout counts: their policies also carry one
# auditAnnotation per rule (audit_annotations), because the apiserver's own
# validation_failure annotation keeps only the request's first failure.
RECORDED_ACTIONS: Final = ("warn", "audit")


def holds_variable(rule: str) -> str:
    """The variable that holds whether the object keeps ``rule`` (``holds_privileged_gpu``)."""
    return "holds_" + rule.replace("-", "_")


def audit_annotations(
    rules: Mapping[str, str], messages: Mapping[str, str]
) -> tuple[list[NamedExpression], list[AuditAnnotation]]:
    """One auditAnnotation per rule of ``rules`` (rule id -> its validation expression):
    the apiserver records ``<policy name>/<rule id>`` with the rule's message when the
    object breaks it (and nothing when not), whatever else it breaks. Returns the
    variables they read (a valueExpression may hold 5120 bytes, less than some rules
    take) and the annotations."""
    held = [NamedExpression(name=holds_variable(rule), expression=e) for rule, e in rules.items()]
    annotations = [
        AuditAnnotation(
            key=rule,
            # An empty string is no annotation, as null is; the apiserver's type check
            # refuses a conditional of a string and null.
            valueExpression=f"!variables.{holds_variable(rule)} ? "
            + text(f"[{rule}] {messages[rule]}")
            + " : ''",
        )
        for rule in rules
    ]
    return held, annotations


def _pod_rule(test: PodTest) -> str:
    """``test`` of the object; on a pod UPDATE only when the old pod passed it."""
    new = test("variables.containers", "variables.gpu", "variables.spec")
    old = test("variables.oldContainers", "variables.oldGpu", "variables.oldSpec")
    return f"!(({new}) && !(variables.podUpdate && ({old})))"


def rule_expressions(policy: Policy) -> dict[str, str]:
    """Each rendered rule's validation expression (true: admitted), in RULE_IDS order;
    gpu-quota only when the policy sets a maximum."""
    expressions = {
        "privileged-gpu": _pod_rule(privileged_gpu),
        "node-name-pinning": _pod_rule(node_name_pinning),
        "raw-visible-devices": _pod_rule(raw_visible_devices(policy)),
        "host-device-access": _pod_rule(host_device_access(policy)),
        "limit-tampering": _pod_rule(limit_tampering(policy)),
        "invalid-gpu-request": invalid_gpu_request(policy),
        "mode-conflict": mode_conflict(policy),
    }
    quota = gpu_quota(policy)
    if quota is not None:
        expressions["gpu-quota"] = quota
    expressions.update(
        {
            "scheduler-bypass": scheduler_bypass(policy),
            "forged-allocation": forged_allocation(policy),
            "gpu-claim": pod_claims(policy),
            "unmutated-gpu-pod": unmutated(policy),
        }
    )
    return expressions


RULES: Final = tuple(MESSAGES)


def rule_variables(policy: Policy) -> dict[str, list[NamedExpression]]:
    """The variables each rule's validation and message read beyond the shared ones (in
    the order they read each other), rendered only where the rule is: each a piece a
    person reads by its name, evaluated once per object, when first read."""
    return {
        "raw-visible-devices": [*env_tables(), *pod_pieces(visible_pieces(policy))],
        "host-device-access": host_access_variables(policy),
        "limit-tampering": [*env_tables(), *pod_pieces(tampering_pieces(policy))],
        "invalid-gpu-request": request_problem_variables(policy),
        "mode-conflict": conflict_variables(policy),
        "forged-allocation": forged_variables(policy),
        "unmutated-gpu-pod": unmutated_variables(policy),
    }


def _rule_variables(policy: Policy, rules: Iterable[str]) -> list[NamedExpression]:
    """The variables of ``rules`` (:func:`rule_variables`), one of each name."""
    found: dict[str, NamedExpression] = {}
    every = rule_variables(policy)
    for rule in rules:
        for variable in every.get(rule, ()):
            kept = found.setdefault(variable["name"], variable)
            if kept["expression"] != variable["expression"]:
                raise ValueError(f"two variables named {variable['name']}")
    return list(found.values())


def policy_name(action: Action, *, sources: bool = False) -> str:
    """The ValidatingAdmissionPolicy (and binding) holding the rules of ``action`` on pods
    and workloads, or (``sources``) on what pods take env and devices from."""
    return NAME_PREFIX + action + (SOURCES_SUFFIX if sources else "")


SOURCES_SUFFIX: Final = "-sources"


# Every name validating_policies can render, whatever the policy: the install's RBAC
# lets the webhook update and delete these and no other.
POLICY_NAMES: Final = (
    *(
        policy_name(action, sources=sources)
        for sources in (False, True)
        for action in VALIDATION_ACTIONS
    ),
    f"{NAME_PREFIX}overrides",
)


# The policy that warns what the MutatingAdmissionPolicy replaced (_override_policies).
OVERRIDES_POLICY: Final = POLICY_NAMES[-1]


def validating_policies(
    policy: Policy, *, namespace: str = SYSTEM_NAMESPACES[1], today: str = ""
) -> list[Obj]:
    """Per action some rendered rule takes (deny, warn, audit; off is left out): one
    ValidatingAdmissionPolicy holding each such rule as a validation, and its binding;
    the policy's exceptions as they stand on ``today`` (:mod:`webhook.render.exception`)."""
    by_action: dict[Action, list[Validation]] = {}
    expressions: dict[Action, dict[str, str]] = {}
    messages = message_expressions(policy)
    for rule, expression in rule_expressions(policy).items():
        action = policy.action(rule)
        if action == "off":
            continue
        expression = unless_excepted(policy, rule, expression, today=today)
        expressions.setdefault(action, {})[rule] = expression
        validation: Validation = {
            # A recorded rule's expression is its audit variable's (audit_annotations).
            "expression": (
                f"variables.{holds_variable(rule)}" if action in RECORDED_ACTIONS else expression
            ),
            "message": f"[{rule}] {MESSAGES[rule]}",
            "reason": "Forbidden",
        }
        if rule in messages:
            validation["messageExpression"] = messages[rule]
        by_action.setdefault(action, []).append(validation)
    objects: list[Obj] = []
    shared = [*variables(policy), *request_variables(policy)]
    # The webhooks' scope first: a pod or workload outside it breaks no rule (scope is a
    # superset of what the core judges), and the apiserver then evaluates no validation.
    # On a plain pod create the policy's cost fell from 0.57 ms (no scope) and 0.42 ms
    # (scope as a variable each validation checks first) to 0.18 ms, measured side by
    # side: the apiserver pays per expression evaluated. A GPU pod pays the condition's
    # conversion more: +0.04 and +0.16 ms (of ~1 ms) in two side-by-side runs.
    conditions = [*scope_conditions(policy), *exemption_conditions(policy)]
    for action, validation_actions in VALIDATION_ACTIONS.items():
        validations = by_action.get(action)
        if not validations:
            continue
        name = policy_name(action)
        spec: ValidatingSpec = {
            "failurePolicy": "Fail",
            "matchConstraints": match_constraints(namespace),
            "matchConditions": [c.copy() for c in conditions],
            "variables": [
                *(v.copy() for v in shared),
                *_rule_variables(policy, expressions[action]),
            ],
            "validations": validations,
        }
        if not conditions:
            del spec["matchConditions"]
        if action in RECORDED_ACTIONS:
            held, spec["auditAnnotations"] = audit_annotations(expressions[action], MESSAGES)
            spec["variables"].extend(held)
        objects += _policy_and_binding(
            name, spec, actions=validation_actions, resources=match_constraints(namespace)
        )
    objects.extend(_source_policies(policy, namespace, today=today))
    objects.extend(_override_policies(policy, namespace, today=today))
    return readable(objects)


# One warning per line, as the webhook's; past this many the last names the annotation.
MAX_OVERRIDE_WARNINGS: Final = 8


_OVERRIDE_ACTIONS: Final[Mapping[Action, list[str]]] = {
    "deny": ["Warn"],
    "warn": ["Warn"],
    "audit": ["Audit"],
}


def _override_policies(policy: Policy, namespace: str, *, today: str) -> list[Obj]:
    """The warnings of what the MutatingAdmissionPolicy replaced, as the webhook's (the
    core warns under limit-tampering, at most: deny and warn warn, audit records, off is
    silent). Only an object whose annotation this request wrote or changed is evaluated:
    a pod is mutated when created, a workload again when updated."""
    action = policy.action("limit-tampering")
    if action == "off":
        return []
    key = literal(OVERRIDES_ANNOTATION)
    new = "object.metadata"
    old = "oldObject.metadata"
    written = (
        f"has({new}.annotations) && {key} in {new}.annotations && (oldObject == null || "
        f"!(has({old}.annotations) && {key} in {old}.annotations && "
        f"{old}.annotations[{key}] == {new}.annotations[{key}]))"
    )
    last = MAX_OVERRIDE_WARNINGS - 1
    more = (
        f"(size(variables.overrides) > {MAX_OVERRIDE_WARNINGS} ? ' (and ' + "
        f"string(size(variables.overrides) - {MAX_OVERRIDE_WARNINGS}) + "
        f"{literal(f' more in annotation {OVERRIDES_ANNOTATION})')} : '')"
    )
    validations: list[Validation] = [
        {
            "expression": f"size(variables.overrides) <= {i}",
            "messageExpression": f"'[limit-tampering] ' + variables.overrides[{i}]"
            + (f" + {more}" if i == last else ""),
            "message": "[limit-tampering] the gpushare mutation replaced a value the pod set; "
            f"see annotation {OVERRIDES_ANNOTATION}",
        }
        for i in range(MAX_OVERRIDE_WARNINGS)
    ]
    name = OVERRIDES_POLICY
    conditions = [
        *exemption_conditions(policy),
        NamedExpression(name="gpushare.io/overridden", expression=written),
    ]
    exception = excepted(policy, "limit-tampering", today=today)
    if exception is not None:
        # The core warns an override as a limit-tampering finding, which an exception
        # takes off.
        conditions.append(
            NamedExpression(name="gpushare.io/not-excepted", expression=f"!({exception})")
        )
    constraints = match_constraints(namespace)
    constraints["objectSelector"] = {"matchLabels": {OVERRIDES_ANNOTATION: OVERRIDES_LABEL_VALUE}}
    spec: ValidatingSpec = {
        "failurePolicy": "Ignore",
        "matchConstraints": constraints,
        "matchConditions": conditions,
        "variables": [
            NamedExpression(
                name="overrides", expression=f"object.metadata.annotations[{key}].split('\\n')"
            )
        ],
        "validations": validations,
    }
    return _policy_and_binding(name, spec, actions=_OVERRIDE_ACTIONS[action], resources=constraints)


def _policy_and_binding(
    name: str, spec: ValidatingSpec, *, actions: Iterable[str], resources: Obj
) -> list[Obj]:
    """A ValidatingAdmissionPolicy ``name`` of ``spec`` and its binding, taking
    ``actions`` on what ``resources`` matches."""
    binding = {"policyName": name, "validationActions": list(actions), "matchResources": resources}
    bodies: tuple[tuple[str, ValidatingSpec | Obj], ...] = (
        (POLICY_KIND, spec),
        (BINDING_KIND, binding),
    )
    return [
        {
            "apiVersion": API_VERSION,
            "kind": kind,
            "metadata": {"name": name, "labels": dict(LABELS)},
            "spec": body,
        }
        for kind, body in bodies
    ]


# The written objects pods take env and devices from (objects.JUDGED_KINDS).
_SOURCE_RULES: Final = (
    ("", ("configmaps", "secrets"), "Namespaced"),
    ("resource.k8s.io", ("resourceclaims", "resourceclaimtemplates"), "Namespaced"),
    ("resource.k8s.io", ("deviceclasses",), "Cluster"),
)


def _source_constraints(namespace: str) -> Obj:
    constraints = match_constraints(namespace)
    constraints["resourceRules"] = [
        {
            "apiGroups": [group],
            "apiVersions": ["v1"],
            "resources": list(resources),
            "operations": ["CREATE", "UPDATE"],
            "scope": scope,
        }
        for group, resources, scope in _SOURCE_RULES
    ]
    return constraints


def _source_policies(policy: Policy, namespace: str, *, today: str) -> list[Obj]:
    """Per action: the write-time guards on ConfigMaps, Secrets and DRA objects, in a
    policy of their own so that a ConfigMap write evaluates two expressions, not the pod
    rules' variables."""
    expressions = {
        "raw-visible-devices": written_env(policy),
        "gpu-claim": written_claims(policy),
    }
    own = {
        "raw-visible-devices": written_env_variables(policy),
        "gpu-claim": written_claim_variables(policy),
    }
    by_action: dict[Action, list[Validation]] = {}
    recorded: dict[Action, dict[str, str]] = {}
    for rule, unexcepted in expressions.items():
        action = policy.action(rule)
        expression = unless_excepted(policy, rule, unexcepted, today=today)
        if action != "off":
            recorded.setdefault(action, {})[rule] = expression
            by_action.setdefault(action, []).append(
                {
                    "expression": (
                        f"variables.{holds_variable(rule)}"
                        if action in RECORDED_ACTIONS
                        else expression
                    ),
                    "message": f"[{rule}] {SOURCE_MESSAGES[rule]}",
                    "reason": "Forbidden",
                }
            )
    # Only what could break a rule is evaluated: data to judge, or a DRA object.
    relevant = NamedExpression(
        name="gpushare.io/source-relevant",
        expression="has(object.data) || request.resource.group == 'resource.k8s.io'",
    )
    conditions = [relevant, *exemption_conditions(policy)]
    objects: list[Obj] = []
    for action, validation_actions in VALIDATION_ACTIONS.items():
        validations = by_action.get(action)
        if not validations:
            continue
        name = policy_name(action, sources=True)
        spec: ValidatingSpec = {
            "failurePolicy": "Fail",
            "matchConstraints": _source_constraints(namespace),
            "matchConditions": [c.copy() for c in conditions],
            "variables": [v for rule in recorded[action] for v in own[rule]],
            "validations": validations,
        }
        if action in RECORDED_ACTIONS:
            held, spec["auditAnnotations"] = audit_annotations(recorded[action], SOURCE_MESSAGES)
            spec["variables"].extend(held)
        objects += _policy_and_binding(
            name, spec, actions=validation_actions, resources=_source_constraints(namespace)
        )
    return objects
