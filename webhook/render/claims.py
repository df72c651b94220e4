"""gpu-claim in CEL: a pod asking for a GPU device class by its extended resource where DRA
claims are not allowed, and the written DRA objects (claims, templates, device classes).

Held equal to its core twins (:data:`CORE_TWINS`) by the differential tests.
"""

from __future__ import annotations

from typing import Final

from webhook.core import objects as core_objects
from webhook.core import rules as core_rules
from webhook.core.objects import DEVICE_CLASS
from webhook.core.policy import DEVICE_CLASS_RESOURCE, Policy
from webhook.render.cel import NamedExpression, cel_value, glob_test, guarded, literal, strings
from webhook.render.pod import names_test, zero

# The core functions this family renders: a rename there breaks the import here.
CORE_TWINS: Final = (
    core_rules.gpu_claims,
    core_objects.object_findings,
    core_objects.claim_classes,
)


def pod_claims(policy: Policy) -> str:
    """gpu-claim of a pod (or template): a GPU device class asked for by its extended
    resource outside the namespaces that may claim GPUs. A claim beside sharing resources
    is the webhook's with the cluster view (``context.claimed_gpus``): only the view knows
    the claim's device class."""
    if not policy.gpu_device_classes:
        return "true"
    classes = sorted(DEVICE_CLASS_RESOURCE + c for c in policy.gpu_device_classes)
    allowed = glob_test("request.namespace", policy.claim_namespaces)
    # By the amount of the class resource alone (rules._class_resources): a zero of
    # another GPU resource beside it leaves it asked.
    asked = (
        "variables.containers.exists(c, "
        + names_test("c", f"r in {strings(classes)} && !({zero('X[r]')})", bind=True)
        + ")"
    )
    return f"!(variables.created && !({allowed}) && {asked})"


def _written_claim_tests(policy: Policy) -> dict[str, str]:
    """gpu-claim's findings on a written DRA object by name, those the policy can have: a
    claim on a GPU device class, a claim configuring a GPU driver as dra.claimConfigs does
    not allow, a DeviceClass serving a sharing resource."""
    classes = strings(sorted(policy.gpu_device_classes))
    request = (
        f"(has(r.deviceClassName) && r.deviceClassName in {classes}) || "
        f"(has(r.exactly) && has(r.exactly.deviceClassName) && "
        f"r.exactly.deviceClassName in {classes}) || (has(r.firstAvailable) && "
        f"r.firstAvailable.exists(x, has(x.deviceClassName) && x.deviceClassName in {classes}))"
    )
    kinds = (("ResourceClaim", ("spec",)), ("ResourceClaimTemplate", ("spec", "spec")))
    tests: dict[str, str] = {}
    if policy.gpu_device_classes:
        tests["gpuClassClaim"] = " || ".join(
            f"(request.kind.kind == {literal(kind)} && "
            f"{guarded('object', (*path, 'devices', 'requests'))}.exists(r, {request}))"
            for kind, path in kinds
        )
    if policy.claim_configs:
        tests["unlistedClaimConfig"] = " || ".join(
            f"(request.kind.kind == {literal(kind)} && "
            f"{guarded('object', (*path, 'devices', 'config'))}.exists(c, "
            f"{_unlisted_config(policy)}))"
            for kind, path in kinds
        )
    # The sharing resources only: a MIG resource served by DRA is no slice.
    name = "object.spec.extendedResourceName"
    served = (
        f"{name} in {strings(sorted(policy.gpu_resources))}" if policy.gpu_resources else "false"
    )
    if policy.dra_resources:
        # wholeGpus.draResources: the policy says DRA serves these whole GPUs here.
        served += f" && !({name} in {strings(sorted(policy.dra_resources))})"
    tests["sharingDeviceClass"] = (
        f"request.kind.kind == {literal(DEVICE_CLASS)} && has(object.spec) && "
        f"has({name}) && {served}"
    )
    return tests


def written_claim_variables(policy: Policy) -> list[NamedExpression]:
    """What gpu-claim reads of a written DRA object (:func:`_written_claim_tests`)."""
    return [{"name": n, "expression": e} for n, e in _written_claim_tests(policy).items()]


def written_claims(policy: Policy) -> str:
    """gpu-claim of a ResourceClaim, ResourceClaimTemplate or DeviceClass
    (``objects.object_findings``): a claim on a GPU device class outside the allowed
    namespaces, or one of the other findings."""
    tests = _written_claim_tests(policy)
    allowed = glob_test("request.namespace", policy.claim_namespaces)
    terms = [
        f"(!({allowed}) && variables.{name})" if name == "gpuClassClaim" else f"variables.{name}"
        for name in tests
    ]
    # A ConfigMap or Secret (the policy's other kinds) reads none of them.
    return f"request.resource.group != 'resource.k8s.io' || !({' || '.join(terms)})"


def _unlisted_config(policy: Policy) -> str:
    """Config ``c`` of a claim gives a driver of ``dra.claimConfigs`` parameters its list
    does not hold (``objects._config_findings``)."""
    drivers = []
    for driver, allowed in sorted(policy.claim_configs.items()):
        listed = (
            f"has(c.opaque.parameters) && c.opaque.parameters in {cel_value(list(allowed))}"
            if allowed
            else "false"
        )
        drivers.append(f"(c.opaque.driver == {literal(driver)} && !({listed}))")
    return f"has(c.opaque) && has(c.opaque.driver) && ({' || '.join(drivers)})"
