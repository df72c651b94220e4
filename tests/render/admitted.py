"""What kube-apiserver hands a ValidatingAdmissionPolicy: the object decoded, defaulted
and validated, as unstructured JSON. A stand-in for the e2e test's round trip (a dry-run
create, whose answer is what the policies saw), for the shapes tests/core/strategies.py and
tests/e2e/test_celpolicy.py generate.

It answers as kubernetes/kubernetes does at v1.36.3 (the e2e kube-apiserver) for what it
models, and refuses the rest:

- Decoding: quantities as ``Quantity.UnmarshalJSON`` reads them and written back in their
  canonical text (tests/render/kubequantity.py), rounded up to 1m
  (pkg/apis/core/v1/defaults.go:39-48); an annotation or label of null is "", of another
  type a 400; fields Go leaves out when empty (omitempty) left out: empty strings, false
  booleans, empty lists and maps; ``resources`` written always (a struct); the keys of
  maps (annotations, labels, nodeSelector, limits, requests) in order, as Go's JSON
  encoder writes a map: where a container asks for two resources of one kind, the
  mutation and the core read the later key, so the order is part of the verdict.
- Defaulting (defaults.go): requests from limits in a Pod's containers and init
  containers (164-190, not templates), enableServiceLinks (201-204), the pod spec's
  dnsPolicy, restartPolicy, securityContext, terminationGracePeriodSeconds and
  schedulerName (211-232), each container's imagePullPolicy and termination message
  (82-100), a hostPath's type (408-413), a configMap volume's defaultMode (253-258), a
  fieldRef's apiVersion (355-359); and, for Pods, the ServiceAccount admission plugin's
  token volume and mounts (plugin/pkg/admission/serviceaccount/admission.go) and the
  namespace.
- Validation (pkg/apis/core/validation/validation.go): container names (DNS labels,
  unique), images; quantities non-negative (373-380), whole for extended resources
  (8222-8231), requests equal to limits for them and not above limits for the others
  (7935-7990); env entries (2754-2860: valueFrom with one source, no value beside it, the
  downward API's field paths); volumes (one source, a hostPath without ``..``, 809-830,
  1385-1425), mounts of existing volumes at unique paths (3098-3144), block devices of
  PVCs (3146-3190); ephemeral containers not on create (5607-5614, 7186-7188); a
  template's restartPolicy Always, a Job's Never or OnFailure; a runtime class that
  exists; claims the pod declares.

:class:`Refused` says why an object does not reach the policies; a shape not modelled
here is refused too (``unmodelled: ...``), so that nothing is compared on an object the
apiserver might have changed in a way not followed here.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Collection, Mapping
from typing import Any, Final

from tests.core.strategies import CONTAINER_KINDS, TEMPLATE_PATHS
from tests.render import kubequantity

Obj = dict[str, Any]

_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SUBDOMAIN: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_NAME: Final = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_ENV_NAME: Final = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
_CONFIG_KEY: Final = re.compile(r"[-._a-zA-Z0-9]+")
_FIELD_PATHS: Final = frozenset(
    (
        "metadata.name",
        "metadata.namespace",
        "metadata.uid",
        "spec.nodeName",
        "spec.serviceAccountName",
        "status.hostIP",
        "status.hostIPs",
        "status.podIP",
        "status.podIPs",
    )
)
_KEYED_FIELD: Final = re.compile(r"metadata\.(labels|annotations)\['([^']*)'\]")
_VOLUME_SOURCES: Final = frozenset(
    ("emptyDir", "configMap", "persistentVolumeClaim", "hostPath", "secret", "projected")
)
_HOST_PATH_TYPES: Final = frozenset(
    (
        "",
        "DirectoryOrCreate",
        "Directory",
        "FileOrCreate",
        "File",
        "Socket",
        "CharDevice",
        "BlockDevice",
    )
)
_NATIVE_PREFIX: Final = "kubernetes.io/"
_STANDARD: Final = frozenset(("cpu", "memory", "ephemeral-storage"))
_JOB_KINDS: Final = ("Job", "CronJob")
_TOKEN_VOLUME: Final = "kube-api-access-cel00"
_TOKEN_PATH: Final = "/var/run/secrets/kubernetes.io/serviceaccount"
_SERVICE_ACCOUNT_DEFAULT: Final = "default"


class Refused(ValueError):
    """The apiserver refuses the object (or it takes a shape not modelled here)."""


def _refuse(reason: str) -> Refused:
    return Refused(reason)


def _qualified(key: Any) -> bool:
    if not isinstance(key, str) or not key:
        return False
    prefix, _, name = key.rpartition("/")
    if "/" in key and not (prefix and len(prefix) <= 253 and _SUBDOMAIN.fullmatch(prefix)):
        return False
    return len(name) <= 63 and bool(_NAME.fullmatch(name))


def _string_map(value: Any, where: str, *, labels: bool = False) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _refuse(f"{where} is not a map")
    result = {}
    for key, item in value.items():
        if not _qualified(key):
            raise _refuse(f"{where}: key {key!r}")
        text = "" if item is None else item
        if not isinstance(text, str):
            raise _refuse(f"{where}[{key}] is not a string")
        if labels and text and not (len(text) <= 63 and _NAME.fullmatch(text)):
            raise _refuse(f"{where}[{key}]: label value {text!r}")
        result[key] = text
    return dict(sorted(result.items()))


def _metadata(meta: Any, where: str) -> Obj:
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise _refuse(f"{where} is not a map")
    out = copy.deepcopy(meta)
    for key, labels in (("annotations", False), ("labels", True)):
        values = _string_map(out.pop(key, None), f"{where}.{key}", labels=labels)
        if values:
            out[key] = values
    return out


def _quantities(values: Any, where: str) -> dict[str, kubequantity.Quantity]:
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise _refuse(f"{where} is not a map")
    result = {}
    for name, raw in values.items():
        try:
            parsed = kubequantity.decode(raw)
        except kubequantity.Unmodelled as error:
            raise _refuse(f"unmodelled: {where}[{name}] {raw!r}") from error
        if parsed is None:
            raise _refuse(f"{where}[{name}]: {raw!r} is no quantity")
        if (parsed.value * 1000).denominator != 1:
            raise _refuse(f"unmodelled: {where}[{name}] {raw!r} is rounded up to 1m")
        if abs(parsed.value * 1000) > kubequantity.INT64_MAX:
            raise _refuse(f"unmodelled: {where}[{name}] {raw!r} overflows MilliValue")
        if parsed.fast is not None and parsed.fast[1] < -3:
            # RoundUp(-3) rescales and forgets the text as written (quantity.go:582-597).
            parsed = kubequantity.Quantity(
                parsed.value, parsed.format, (int(parsed.value * 1000), -3), None
            )
        result[str(name)] = parsed
    return result


def _resource_name(name: str, where: str) -> tuple[bool, bool]:
    """(native, extended) for a container's resource ``name``, refusing an invalid one."""
    if "/" not in name:
        if name not in _STANDARD:
            raise _refuse(f"{where}: {name} is no standard resource")
        return True, False
    if _NATIVE_PREFIX in name:
        return True, False
    if name.startswith("requests.") or not _qualified("requests." + name):
        raise _refuse(f"{where}: {name} is no extended resource name")
    return False, True


def _resources(block: Any, *, pod: bool, claims: Collection[str], where: str) -> Obj:
    if block is None:
        return {}
    if not isinstance(block, dict) or set(block) - {"limits", "requests", "claims"}:
        raise _refuse(f"unmodelled: {where}")
    limits = _quantities(block.get("limits"), f"{where}.limits")
    requests = _quantities(block.get("requests"), f"{where}.requests")
    if pod:
        for name, value in limits.items():
            requests.setdefault(name, value)
    for part, values in (("limits", limits), ("requests", requests)):
        for name, value in values.items():
            _native, extended = _resource_name(name, f"{where}.{part}")
            if value.value < 0:
                raise _refuse(f"{where}.{part}[{name}] is negative")
            if extended and value.value.denominator != 1:
                raise _refuse(f"{where}.{part}[{name}] must be an integer")
    for name, value in requests.items():
        native, _extended = _resource_name(name, where)
        limit = limits.get(name)
        if limit is None:
            if not native:
                raise _refuse(f"{where}: {name} without a limit")
        elif (value.cmp(limit) != 0 and not native) or value.cmp(limit) > 0:
            raise _refuse(f"{where}: {name} request {value.text()} against limit {limit.text()}")
    out: Obj = {}
    if limits:
        out["limits"] = {name: q.text() for name, q in sorted(limits.items())}
    if requests:
        out["requests"] = {name: q.text() for name, q in sorted(requests.items())}
    named = block.get("claims")
    if named:
        if not isinstance(named, list) or not all(isinstance(c, dict) for c in named):
            raise _refuse(f"{where}.claims")
        names = [c.get("name") for c in named]
        if len(set(names)) != len(names) or not set(names) <= set(claims):
            raise _refuse(f"{where}.claims: {names} against the pod's {sorted(claims)}")
        out["claims"] = copy.deepcopy(named)
    return out


def _env(entries: Any, where: str) -> list[Obj]:
    if not isinstance(entries, list):
        raise _refuse(f"{where} is not a list")
    out = []
    for entry in entries:
        if not isinstance(entry, dict) or set(entry) - {"name", "value", "valueFrom"}:
            raise _refuse(f"unmodelled: {where} entry {entry!r}")
        name = entry.get("name")
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            raise _refuse(f"{where}: env name {name!r}")
        value = entry.get("value")
        if value is not None and not isinstance(value, str):
            raise _refuse(f"{where}[{name}].value is not a string")
        item: Obj = {"name": name}
        if value:
            item["value"] = value
        source = entry.get("valueFrom")
        if source is not None:
            if value:
                raise _refuse(f"{where}[{name}]: valueFrom beside a value")
            item["valueFrom"] = _value_from(source, f"{where}[{name}].valueFrom")
        out.append(item)
    return out


def _value_from(source: Any, where: str) -> Obj:
    if not isinstance(source, dict) or len(source) != 1:
        raise _refuse(f"{where}: one source")
    ((kind, ref),) = source.items()
    if not isinstance(ref, dict):
        raise _refuse(f"{where}.{kind}")
    ref = copy.deepcopy(ref)
    if kind == "fieldRef":
        path = ref.get("fieldPath")
        keyed = _KEYED_FIELD.fullmatch(path) if isinstance(path, str) else None
        if path not in _FIELD_PATHS and not (keyed and _qualified(keyed.group(2))):
            raise _refuse(f"{where}: fieldPath {path!r}")
        ref.setdefault("apiVersion", "v1")
    elif kind in ("configMapKeyRef", "secretKeyRef"):
        key, name = ref.get("key"), ref.get("name")
        if not (isinstance(key, str) and _CONFIG_KEY.fullmatch(key)):
            raise _refuse(f"{where}: key {key!r}")
        if not (isinstance(name, str) and name):
            raise _refuse(f"{where}: name {name!r}")
        if ref.get("optional") is False:
            del ref["optional"]
    else:
        raise _refuse(f"unmodelled: {where}.{kind}")
    return {kind: ref}


def _env_from(sources: Any, where: str) -> list[Obj]:
    if not isinstance(sources, list):
        raise _refuse(f"{where} is not a list")
    out = []
    for source in sources:
        if not isinstance(source, dict) or set(source) - {"prefix", "configMapRef", "secretRef"}:
            raise _refuse(f"unmodelled: {where} {source!r}")
        item = copy.deepcopy(source)
        prefix = item.pop("prefix", "")
        if prefix:
            if not (isinstance(prefix, str) and _ENV_NAME.fullmatch(prefix)):
                raise _refuse(f"{where}: prefix {prefix!r}")
            item["prefix"] = prefix
        if len([k for k in item if k != "prefix"]) != 1:
            raise _refuse(f"{where}: one source")
        out.append(item)
    return out


def _no_backsteps(path: str) -> bool:
    return ".." not in path.replace("\\", "/").split("/")


def _mounts(
    mounts: Any, volumes: Mapping[str, Obj], devices: Collection[str], where: str
) -> list[Obj]:
    if not isinstance(mounts, list):
        raise _refuse(f"{where} is not a list")
    seen: set[str] = set()
    out = []
    for mount in mounts:
        if not isinstance(mount, dict) or set(mount) - {
            "name",
            "mountPath",
            "readOnly",
            "subPath",
            "subPathExpr",
        }:
            raise _refuse(f"unmodelled: {where} {mount!r}")
        name, path = mount.get("name"), mount.get("mountPath")
        if name not in volumes:
            raise _refuse(f"{where}: volume {name!r} not found")
        if not isinstance(path, str) or not path or path in seen or path in devices:
            raise _refuse(f"{where}: mountPath {path!r}")
        seen.add(path)
        item: Obj = {"name": name, "mountPath": path}
        read_only = mount.get("readOnly")
        if read_only not in (None, True, False):
            raise _refuse(f"{where}: readOnly {read_only!r}")
        if read_only:
            item["readOnly"] = True
        sub, expression = mount.get("subPath") or "", mount.get("subPathExpr") or ""
        if sub and expression:
            raise _refuse(f"{where}: subPath beside subPathExpr")
        for key, value in (("subPath", sub), ("subPathExpr", expression)):
            if value:
                if not isinstance(value, str) or value.startswith("/") or not _no_backsteps(value):
                    raise _refuse(f"{where}: {key} {value!r}")
                item[key] = value
        out.append(item)
    return out


def _devices(devices: Any, volumes: Mapping[str, Obj], where: str) -> list[Obj]:
    if not isinstance(devices, list):
        raise _refuse(f"{where} is not a list")
    out = []
    seen: set[str] = set()
    for device in devices:
        if not isinstance(device, dict) or set(device) != {"name", "devicePath"}:
            raise _refuse(f"unmodelled: {where} {device!r}")
        name, path = device["name"], device["devicePath"]
        if "persistentVolumeClaim" not in volumes.get(name, {}):
            raise _refuse(f"{where}: {name!r} is no PVC volume")
        if not isinstance(path, str) or not path or path in seen or not _no_backsteps(path):
            raise _refuse(f"{where}: devicePath {path!r}")
        seen.add(path)
        out.append({"name": name, "devicePath": path})
    return out


def _pull_policy(image: str) -> str:
    """defaults.go:83-92: Always for the tag latest (or none), else IfNotPresent."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    tag = last.split(":", 1)[1] if ":" in last else "latest"
    return "Always" if tag == "latest" and "@" not in image else "IfNotPresent"


_CONTAINER_FIELDS: Final = frozenset(
    (
        "name",
        "image",
        "command",
        "args",
        "env",
        "envFrom",
        "resources",
        "securityContext",
        "volumeMounts",
        "volumeDevices",
        "restartPolicy",
    )
)


def _container(
    container: Any,
    kind: str,
    *,
    volumes: Mapping[str, Obj],
    claims: Collection[str],
    pod: bool,
    where: str,
) -> Obj:
    if not isinstance(container, dict) or set(container) - _CONTAINER_FIELDS:
        raise _refuse(
            f"unmodelled: {where} fields {sorted(container) if isinstance(container, dict) else container!r}"
        )
    name, image = container.get("name"), container.get("image")
    if not (isinstance(name, str) and len(name) <= 63 and _LABEL.fullmatch(name)):
        raise _refuse(f"{where}: name {name!r}")
    if not (isinstance(image, str) and image.strip()):
        raise _refuse(f"{where}: image {image!r}")
    out: Obj = {"name": name, "image": image}
    for key in ("command", "args"):
        value = container.get(key)
        if value:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise _refuse(f"{where}.{key}")
            out[key] = list(value)
    if container.get("env"):
        out["env"] = _env(container["env"], f"{where}.env")
    if container.get("envFrom"):
        out["envFrom"] = _env_from(container["envFrom"], f"{where}.envFrom")
    if kind == "ephemeralContainers" and container.get("resources"):
        raise _refuse(f"{where}: resources in an ephemeral container")
    resources = _resources(
        container.get("resources"),
        pod=pod and kind != "ephemeralContainers",
        claims=claims,
        where=f"{where}.resources",
    )
    out["resources"] = resources
    context = container.get("securityContext")
    if context is not None:
        if not isinstance(context, dict) or set(context) - {"privileged", "capabilities"}:
            raise _refuse(f"unmodelled: {where}.securityContext {context!r}")
        if context.get("privileged") not in (None, True, False):
            raise _refuse(f"{where}.securityContext.privileged")
        capabilities = context.get("capabilities")
        if capabilities is not None and not (
            isinstance(capabilities, dict)
            and set(capabilities) <= {"add", "drop"}
            and all(
                isinstance(v, list) and all(isinstance(c, str) for c in v)
                for v in capabilities.values()
            )
        ):
            raise _refuse(f"{where}.securityContext.capabilities")
        out["securityContext"] = {k: copy.deepcopy(v) for k, v in context.items() if v is not None}
    devices = _devices(container.get("volumeDevices") or [], volumes, f"{where}.volumeDevices")
    if container.get("volumeMounts"):
        paths = {d["devicePath"] for d in devices}
        out["volumeMounts"] = _mounts(
            container["volumeMounts"], volumes, paths, f"{where}.volumeMounts"
        )
        if {m["name"] for m in out["volumeMounts"]} & {d["name"] for d in devices}:
            raise _refuse(f"{where}: a volume mounted and used as a device")
    if devices:
        out["volumeDevices"] = devices
    restart = container.get("restartPolicy")
    if restart is not None:
        if kind != "initContainers" or restart != "Always":
            raise _refuse(f"{where}: restartPolicy {restart!r}")
        out["restartPolicy"] = restart
    out["terminationMessagePath"] = "/dev/termination-log"
    out["terminationMessagePolicy"] = "File"
    out["imagePullPolicy"] = _pull_policy(image)
    return out


def _volume(volume: Any, where: str) -> Obj:
    if not isinstance(volume, dict):
        raise _refuse(f"{where} is not a map")
    name = volume.get("name")
    if not (isinstance(name, str) and len(name) <= 63 and _LABEL.fullmatch(name)):
        raise _refuse(f"{where}: name {name!r}")
    sources = set(volume) - {"name"}
    if len(sources) > 1 or not sources <= _VOLUME_SOURCES:
        raise _refuse(f"unmodelled: {where} sources {sorted(sources)}")
    if not sources:
        # defaults.go:66-70: a volume of no source is an emptyDir.
        return {"name": name, "emptyDir": {}}
    (source,) = sources
    body = volume[source]
    if not isinstance(body, dict):
        raise _refuse(f"{where}.{source} is not a map")
    body = copy.deepcopy(body)
    if source == "hostPath":
        path, kind = body.get("path"), body.get("type", "")
        if not isinstance(path, str) or not path or not _no_backsteps(path):
            raise _refuse(f"{where}: hostPath {path!r}")
        if kind not in _HOST_PATH_TYPES or set(body) - {"path", "type"}:
            raise _refuse(f"{where}: hostPath type {kind!r}")
        body["type"] = kind
    elif source == "emptyDir":
        if body.get("medium") not in (None, "", "Memory") or set(body) - {"medium"}:
            raise _refuse(f"unmodelled: {where}.emptyDir {body!r}")
        if not body.get("medium"):
            body.pop("medium", None)
    elif source == "configMap":
        if not isinstance(body.get("name"), str) or set(body) - {"name"}:
            raise _refuse(f"unmodelled: {where}.configMap {body!r}")
        body["defaultMode"] = 420
    elif source == "persistentVolumeClaim":
        if (
            not isinstance(body.get("claimName"), str)
            or not body["claimName"]
            or set(body) - {"claimName"}
        ):
            raise _refuse(f"unmodelled: {where}.persistentVolumeClaim {body!r}")
    else:
        raise _refuse(f"unmodelled: {where}.{source}")
    return {"name": name, source: body}


_SPEC_FIELDS: Final = frozenset(
    (
        *CONTAINER_KINDS,
        "volumes",
        "nodeName",
        "schedulerName",
        "nodeSelector",
        "hostIPC",
        "hostPID",
        "restartPolicy",
        "runtimeClassName",
        "affinity",
        "resourceClaims",
    )
)


def pod_spec(
    spec: Any,
    *,
    kind: str,
    operation: str = "CREATE",
    runtime_classes: Collection[str] = (),
) -> Obj:
    """``spec`` of a Pod (``kind`` "Pod") or of the template of a workload of ``kind``,
    decoded, defaulted and validated."""
    where = "spec" if kind == "Pod" else "template.spec"
    pod = kind == "Pod"
    if not isinstance(spec, dict) or set(spec) - _SPEC_FIELDS:
        fields = sorted(spec) if isinstance(spec, dict) else spec
        raise _refuse(f"unmodelled: {where} fields {fields!r}")
    out: Obj = {}
    volumes: dict[str, Obj] = {}
    for index, volume in enumerate(spec.get("volumes") or []):
        decoded = _volume(volume, f"{where}.volumes[{index}]")
        if decoded["name"] in volumes:
            raise _refuse(f"{where}.volumes: {decoded['name']} twice")
        volumes[decoded["name"]] = decoded
    claims: list[str] = []
    for claim in spec.get("resourceClaims") or []:
        if not (
            isinstance(claim, dict)
            and isinstance(claim.get("name"), str)
            and len([k for k in claim if k != "name"]) == 1
            and set(claim) - {"name"} <= {"resourceClaimName", "resourceClaimTemplateName"}
        ):
            raise _refuse(f"{where}.resourceClaims: {claim!r}")
        claims.append(claim["name"])
    if len(set(claims)) != len(claims):
        raise _refuse(f"{where}.resourceClaims: names twice")
    if not isinstance(spec.get("containers"), list) or not spec["containers"]:
        raise _refuse(f"{where}.containers: none")
    if spec.get("ephemeralContainers") and (operation == "CREATE" or not pod):
        raise _refuse(f"{where}.ephemeralContainers: cannot be set on create")
    names: set[str] = set()
    for kind_name in CONTAINER_KINDS:
        items = spec.get(kind_name)
        if not items:
            continue
        if not isinstance(items, list):
            raise _refuse(f"{where}.{kind_name} is not a list")
        decoded_list = []
        for index, container in enumerate(items):
            decoded = _container(
                container,
                kind_name,
                volumes=volumes,
                claims=claims,
                pod=pod,
                where=f"{where}.{kind_name}[{index}]",
            )
            if decoded["name"] in names:
                raise _refuse(f"{where}: container {decoded['name']} twice")
            names.add(decoded["name"])
            decoded_list.append(decoded)
        out[kind_name] = decoded_list
    if volumes:
        out["volumes"] = list(volumes.values())
    if claims:
        out["resourceClaims"] = copy.deepcopy(spec["resourceClaims"])
    for key in ("nodeName", "schedulerName", "runtimeClassName"):
        value = spec.get(key)
        if value is None or value == "":
            continue
        if not (isinstance(value, str) and len(value) <= 253 and _SUBDOMAIN.fullmatch(value)):
            raise _refuse(f"{where}.{key}: {value!r}")
        out[key] = value
    if out.get("runtimeClassName") is not None and out["runtimeClassName"] not in runtime_classes:
        raise _refuse(f"{where}.runtimeClassName: {out['runtimeClassName']} not found")
    selector = _string_map(spec.get("nodeSelector"), f"{where}.nodeSelector", labels=True)
    if selector:
        out["nodeSelector"] = selector
    for key in ("hostIPC", "hostPID"):
        if spec.get(key) not in (None, True, False):
            raise _refuse(f"{where}.{key}: {spec[key]!r}")
        if spec.get(key):
            out[key] = True
    if spec.get("affinity") is not None:
        out["affinity"] = _affinity(spec["affinity"], f"{where}.affinity")
    restart = spec.get("restartPolicy") or "Always"
    allowed = {"Pod": ("Always", "OnFailure", "Never")}.get(
        kind, ("OnFailure", "Never") if kind in _JOB_KINDS else ("Always",)
    )
    if restart not in allowed:
        raise _refuse(f"{where}.restartPolicy: {restart!r} for a {kind}")
    out["restartPolicy"] = restart
    out["dnsPolicy"] = "ClusterFirst"
    out["securityContext"] = {}
    out["terminationGracePeriodSeconds"] = 30
    out.setdefault("schedulerName", "default-scheduler")
    if pod:
        out["enableServiceLinks"] = True
    return out


def _affinity(affinity: Any, where: str) -> Any:
    """Node affinity's required terms, the only affinity generated here."""
    try:
        (required,) = affinity["nodeAffinity"].values()
        terms = required["nodeSelectorTerms"]
        assert set(affinity) == {"nodeAffinity"} and set(affinity["nodeAffinity"]) == {
            "requiredDuringSchedulingIgnoredDuringExecution"
        }
        for term in terms:
            for requirement in term["matchExpressions"]:
                operator, values = requirement["operator"], requirement.get("values") or []
                assert _qualified(requirement["key"])
                listed = operator in ("In", "NotIn")
                assert listed == bool(values) and operator in (
                    "In",
                    "NotIn",
                    "Exists",
                    "DoesNotExist",
                )
    except (AssertionError, KeyError, TypeError, ValueError, AttributeError) as error:
        raise _refuse(f"unmodelled: {where} {affinity!r}") from error
    return copy.deepcopy(affinity)


def _service_account(pod: Obj) -> None:
    """The ServiceAccount admission plugin on a Pod: the namespace's default account and
    its token, a projected volume mounted read-only in every container and init
    container that mounts nothing at the token's path."""
    spec = pod["spec"]
    spec.setdefault("serviceAccountName", _SERVICE_ACCOUNT_DEFAULT)
    spec["serviceAccount"] = spec["serviceAccountName"]
    spec.setdefault("volumes", []).append(
        {
            "name": _TOKEN_VOLUME,
            "projected": {
                "defaultMode": 420,
                "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {
                        "configMap": {
                            "name": "kube-root-ca.crt",
                            "items": [{"key": "ca.crt", "path": "ca.crt"}],
                        }
                    },
                    {
                        "downwardAPI": {
                            "items": [
                                {
                                    "path": "namespace",
                                    "fieldRef": {
                                        "apiVersion": "v1",
                                        "fieldPath": "metadata.namespace",
                                    },
                                }
                            ]
                        }
                    },
                ],
            },
        }
    )
    for kind in ("containers", "initContainers"):
        for container in spec.get(kind) or []:
            mounts = container.setdefault("volumeMounts", [])
            if all(m["mountPath"] != _TOKEN_PATH for m in mounts):
                mounts.append({"name": _TOKEN_VOLUME, "readOnly": True, "mountPath": _TOKEN_PATH})


def admitted(
    kind: str,
    obj: Any,
    *,
    namespace: str,
    runtime_classes: Collection[str] = (),
) -> Obj:
    """``obj`` as a created ``kind`` reaches the validating policies in ``namespace``;
    :class:`Refused` where the apiserver refuses it first."""
    if not isinstance(obj, dict):
        raise _refuse("not an object")
    out = copy.deepcopy(obj)
    out["metadata"] = _metadata(out.get("metadata"), "metadata")
    out["metadata"]["namespace"] = namespace
    if kind == "Pod":
        template = out
    else:
        template = out
        for part in TEMPLATE_PATHS[kind]:
            if not isinstance(template, dict) or not isinstance(template.get(part), dict):
                raise _refuse(f"{kind}: no {'.'.join(TEMPLATE_PATHS[kind])}")
            template = template[part]
        meta = _metadata(template.get("metadata"), "template.metadata")
        if meta:
            template["metadata"] = meta
        else:
            template.pop("metadata", None)
    template["spec"] = pod_spec(template.get("spec"), kind=kind, runtime_classes=runtime_classes)
    if kind == "Pod":
        _service_account(out)
    return out


def updated(old: Obj, new: Any, *, namespace: str) -> Obj:
    """``new``, an UPDATE of the stored Pod ``old`` (as :func:`admitted` left it) that
    changes its labels and annotations or adds ephemeral containers (through the
    ephemeralcontainers subresource), as it reaches the policies."""
    if not isinstance(new, dict):
        raise _refuse("not an object")
    out = copy.deepcopy(old)
    out["metadata"] = _metadata(new.get("metadata"), "metadata")
    out["metadata"]["namespace"] = namespace
    added = (new.get("spec") or {}).get("ephemeralContainers") or []
    before = old["spec"].get("ephemeralContainers") or []
    if added[: len(before)] != before:
        raise _refuse("unmodelled: ephemeral containers changed")
    if len(added) > len(before):
        volumes = {v["name"]: v for v in old["spec"].get("volumes") or []}
        claims = [c["name"] for c in old["spec"].get("resourceClaims") or []]
        names = {c["name"] for k in CONTAINER_KINDS for c in old["spec"].get(k) or []}
        decoded_list = list(before)
        for index, container in enumerate(added[len(before) :], start=len(before)):
            decoded = _container(
                container,
                "ephemeralContainers",
                volumes=volumes,
                claims=claims,
                pod=True,
                where=f"spec.ephemeralContainers[{index}]",
            )
            if decoded["name"] in names:
                raise _refuse(f"spec.ephemeralContainers: {decoded['name']} twice")
            names.add(decoded["name"])
            decoded_list.append(decoded)
        out["spec"]["ephemeralContainers"] = decoded_list
    return out
