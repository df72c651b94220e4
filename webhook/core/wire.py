"""The admission wire format (admission.k8s.io/v1 and v1beta1 share it) and its parsing.

Plain TypedDicts over the JSON the apiserver sends: building client model objects
would cost ~20x a dict and drop fields the models do not know.
"""

from __future__ import annotations

from typing import Any, Final, Literal, TypedDict

Endpoint = Literal["mutate", "validate"]
API_VERSIONS: Final = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")


class GroupVersionKind(TypedDict, total=False):
    group: str
    version: str
    kind: str


class GroupVersionResource(TypedDict, total=False):
    group: str
    version: str
    resource: str


class UserInfo(TypedDict, total=False):
    username: str
    uid: str
    groups: list[str]
    extra: dict[str, list[str]]


class AdmissionRequest(TypedDict, total=False):
    uid: str
    kind: GroupVersionKind
    resource: GroupVersionResource
    subResource: str
    requestKind: GroupVersionKind
    name: str
    namespace: str
    operation: str
    userInfo: UserInfo
    object: dict[str, Any] | None
    oldObject: dict[str, Any] | None
    dryRun: bool
    options: dict[str, Any] | None


class Status(TypedDict, total=False):
    code: int
    message: str
    reason: str


class AdmissionResponse(TypedDict, total=False):
    uid: str
    allowed: bool
    status: Status
    patch: str
    patchType: str
    warnings: list[str]
    auditAnnotations: dict[str, str]


class AdmissionReview(TypedDict, total=False):
    apiVersion: str
    kind: str
    request: AdmissionRequest
    response: AdmissionResponse


class PatchOp(TypedDict, total=False):
    """One RFC 6902 JSON Patch operation."""

    op: str
    path: str
    value: Any


class ReviewError(Exception):
    """A request that is not a usable AdmissionReview; the HTTP edge answers 400."""


def parse_review(body: Any) -> tuple[str, AdmissionRequest]:
    """The apiVersion and request of an AdmissionReview, or :class:`ReviewError`."""
    if not isinstance(body, dict):
        raise ReviewError("body is not a JSON object")
    version = body.get("apiVersion")
    if version not in API_VERSIONS:
        raise ReviewError(f"apiVersion {version!r} is not one of {', '.join(API_VERSIONS)}")
    if body.get("kind") != "AdmissionReview":
        raise ReviewError(f"kind {body.get('kind')!r} is not AdmissionReview")
    request = body.get("request")
    if not isinstance(request, dict):
        raise ReviewError("AdmissionReview has no request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ReviewError("request has no uid")
    operation = request.get("operation")
    if operation in ("CREATE", "UPDATE") and not isinstance(request.get("object"), dict):
        raise ReviewError(f"{operation} request has no object")
    for key in ("kind", "userInfo"):
        if key in request and not isinstance(request[key], dict):
            raise ReviewError(f"request.{key} is not an object")
    return version, request  # type: ignore[return-value]  # shape checked above
