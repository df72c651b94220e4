"""Which install a cluster gets: decided by what its apiserver serves.

- ``webhooks`` (Kubernetes 1.30-1.35): the mutating and validating webhooks, plus the
  ValidatingAdmissionPolicies of :mod:`webhook.render.validating`.
- ``apiserver`` (1.36+, where MutatingAdmissionPolicy v1 is served): the mutation as
  MutatingAdmissionPolicies (:mod:`webhook.render.mutating`) plus the
  ValidatingAdmissionPolicies, and no webhook in the pod path unless the cluster view is
  on; then one registration, failing open, for only what the view decides
  (:func:`webhook.render.scope.view_conditions`).

The served kind decides, not the version number, because a 1.36 apiserver can be run
with the API switched off (``--runtime-config``) and then has no MutatingAdmissionPolicy
to hold the mutation. A version (``manifests --kubernetes-version``) stands in for
discovery when no cluster is at hand. Used by ``manifests``, the self-managed leader and
the dev cluster; the Helm chart asks the same question with
``.Capabilities.APIVersions.Has`` of :data:`~webhook.render.mutating.SERVED_AS`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Final, Literal

import orjson

from webhook.render.admission import API_VERSION
from webhook.render.mutating import POLICY_KIND, SERVED_AS

Mode = Literal["webhooks", "apiserver"]
WEBHOOKS: Final = "webhooks"
APISERVER: Final = "apiserver"
MODES: Final[tuple[Mode, ...]] = (WEBHOOKS, APISERVER)
# The first release that serves MutatingAdmissionPolicy v1 by default, and the oldest the
# install supports at all (ValidatingAdmissionPolicy v1, matchConditions, preStop sleep).
FIRST_APISERVER: Final = (1, 36)
OLDEST: Final = (1, 30)

_VERSION: Final = re.compile(r"^v?(\d+)\.(\d+)(?:\.\d+)?(?:[-+].*)?$")


class ModeError(ValueError):
    """A Kubernetes version that cannot be read or that the install does not support."""


def parse_version(text: str) -> tuple[int, int]:
    """``(major, minor)`` of ``1.36``, ``v1.36.3`` or ``1.36.0-rc.1``."""
    match = _VERSION.match(text.strip())
    if match is None:
        raise ModeError(f"not a Kubernetes version: {text!r} (expected e.g. 1.36 or v1.36.3)")
    version = (int(match.group(1)), int(match.group(2)))
    if version < OLDEST:
        raise ModeError(f"Kubernetes {text} is older than 1.30, which the install needs")
    return version


def install_mode(
    served: Iterable[str] | None = None, *, kubernetes_version: str | None = None
) -> Mode:
    """The mode of a cluster whose apiserver serves ``served`` (``group/version/Kind``
    strings, as Helm's ``.Capabilities.APIVersions`` holds them), else of
    ``kubernetes_version`` with its default APIs. One of the two must be given."""
    if served is not None:
        return APISERVER if SERVED_AS in set(served) else WEBHOOKS
    if kubernetes_version is None:
        raise ValueError("give what the apiserver serves or a Kubernetes version")
    return APISERVER if parse_version(kubernetes_version) >= FIRST_APISERVER else WEBHOOKS


def served_kinds(api_client: Any, *, timeout: float = 10.0) -> set[str]:
    """What the apiserver behind ``api_client`` serves of the kinds that decide the mode,
    as ``group/version/Kind`` (discovery of admissionregistration.k8s.io/v1 only: one
    request, allowed to every authenticated user)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api: Any = client.AdmissionregistrationV1Api(api_client)
    try:
        response = api.get_api_resources(_preload_content=False, _request_timeout=timeout)
    except ApiException as exc:
        if exc.status == 404:  # the group version is not served at all
            return set()
        raise
    resources = orjson.loads(response.data).get("resources") or []
    return {
        f"{API_VERSION}/{r['kind']}"
        for r in resources
        if "/" not in r.get("name", "") and r.get("kind") == POLICY_KIND
    }


def detect(api_client: Any, *, timeout: float = 10.0) -> Mode:
    """The mode of the cluster behind ``api_client``, by discovery."""
    return install_mode(served_kinds(api_client, timeout=timeout))
