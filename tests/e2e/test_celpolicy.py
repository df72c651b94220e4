"""The CEL rules (webhook/render/validating.py) alone, through a real kube-apiserver.

The webhook registrations are deleted: only the ValidatingAdmissionPolicies judge. They
must refuse each bypass they express, admit plain pods and correctly shaped GPU pods,
and agree with the decision core on generated objects, rule by rule.

Nothing mutates here: an object carries the mutation only when the test applied the
core's to it before sending (as the webhook or the MutatingAdmissionPolicies would), so
unmutated-gpu-pod is compared on objects sent with the mutation absent and present.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import re
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.core import strategies
from tests.core.strategies import (
    CLASS_RESOURCES,
    IDENTITIES,
    NODE_SELECTORS,
    SCHEDULERS,
    apply_update,
    attacked_objects,
    objects,
    pod_updates,
    quota_pods,
)
from tests.core.test_decision import KAI_ATTACKS, KAI_PREFIX, config_map, kai_fraction_pod
from tests.e2e.rest import COLLECTIONS, DIFFERENTIAL, Api, Sent, gpu_pod, sendable, stored_pod
from tests.paths import ROOT
from tests.render.test_validating import HOST_PATHS
from tests.render.test_validating import MODE_SCHEDULERS as MODES_POLICY
from webhook.core.decision import Request, decide
from webhook.core.policy import Policy
from webhook.core.resources import read_container
from webhook.core.review import review_object
from webhook.dev.cluster import DevCluster, running
from webhook.policies import load_policy
from webhook.render.messages import MESSAGES, message_expressions
from webhook.render.validating import RULES, rule_expressions, validating_policies

pytestmark = pytest.mark.e2e

Obj = dict[str, Any]

POLICY: Final = load_policy(None)
# The rules the default policy renders (gpu-quota is off until a policy sets limits).
RENDERED: Final = tuple(rule_expressions(POLICY))
# Bounded for CI: each example is one dry-run request (~10 ms).
EXAMPLES: Final = 1000
# The denial differential only checks the first refusing rule: fewer suffice.
DENY_EXAMPLES: Final = 300
# Mutated GPU pods with what the mutation set dropped or changed (unmutated-gpu-pod).
EDIT_EXAMPLES: Final = 300
UPDATE_EXAMPLES: Final = 100
WARN_LABEL: Final = "gpushare.io/cel-warn-only"
# Namespaces with this label are judged by the CEL policies of a policy with per-mode
# schedulers (tests/render/test_validating.py's MODE_SCHEDULERS), warning only; the
# default policy's leave them alone.
MODES_LABEL: Final = "gpushare.io/cel-modes"
MODES_SUFFIX: Final = "-modes"
MODES_EXAMPLES: Final = 500
_RULE_IN_WARNING: Final = re.compile(
    r"ValidatingAdmissionPolicy '[^']*' with binding [^:]*: \[([a-z-]+)\]"
)
# The rule whose container the CEL names with a sentence of its own, not the core's: the
# core's says what each unit allows (CEL names the resource, the core's first word too).
GENERIC_RULES: Final = frozenset({"invalid-gpu-request"})
_RULE_IN_MESSAGE: Final = re.compile(
    r"ValidatingAdmissionPolicy '[^']*' with binding [^:]*: \[([a-z-]+)\]"
)


@pytest.fixture(scope="module")
def cel_cluster(bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    """A cluster of its own: the webhook registrations deleted, the CEL policies created."""
    from kubernetes import client

    workdir = tmp_path_factory.mktemp("celcluster")
    policy = workdir / "policy.yaml"
    policy.write_text((ROOT / "policies" / "default.yaml").read_text())
    with running(bin_dir=bin_dir, policy=policy, workdir=workdir) as cluster:
        cluster.unregister_webhooks()
        node: Any = client.NodeV1Api(cluster.api_client())
        for name in (*sorted(POLICY.gpu_runtime_classes), "kata"):
            node.create_runtime_class({"metadata": {"name": name}, "handler": name})
        admission: Any = client.AdmissionregistrationV1Api(cluster.api_client())
        assert not admission.list_validating_webhook_configuration().items
        assert not admission.list_mutating_webhook_configuration().items
        objects = validating_policies(POLICY)
        for obj in [o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"]:
            # As rendered, bar one label: in namespaces with it a binding of its own only
            # warns, one warning per failing rule (a denial names the first one only).
            warn = copy.deepcopy(obj)
            for binding, operator in ((obj, "DoesNotExist"), (warn, "Exists")):
                selector = binding["spec"]["matchResources"]["namespaceSelector"]
                selector["matchExpressions"].append({"key": WARN_LABEL, "operator": operator})
                selector["matchExpressions"].append(
                    {"key": MODES_LABEL, "operator": "DoesNotExist"}
                )
            warn["metadata"]["name"] += "-warn"
            warn["spec"]["validationActions"] = ["Warn"]
            objects.append(warn)
        objects += _warning_only_in_modes_namespaces(validating_policies(MODES_POLICY))
        objects += _host_policies()
        cluster.register_cel_policies(objects)
        cluster.create_namespace("cel-ready")
        api = Api(cluster)
        # The policies and bindings are loaded asynchronously: wait until each refuses.
        shapes = {rule: pod for pod, rule in BYPASSES.values()}
        assert set(shapes) == set(RENDERED)
        deadline = time.monotonic() + 30
        for rule, pod in sorted(shapes.items()):
            while vap_rules(sent := api.create("Pod", "cel-ready", pod)) != {rule}:
                assert time.monotonic() < deadline, (rule, "never took effect", str(sent.body))
                time.sleep(0.2)
        api.http.clear()
        yield cluster


def _warning_only_in_modes_namespaces(objects: list[Obj]) -> list[Obj]:
    """``objects`` renamed apart, their bindings warning only in MODES_LABEL namespaces."""
    for obj in objects:
        obj["metadata"]["name"] += MODES_SUFFIX
        if obj["kind"] == "ValidatingAdmissionPolicyBinding":
            obj["spec"]["policyName"] += MODES_SUFFIX
            obj["spec"]["validationActions"] = ["Warn"]
            selector = obj["spec"]["matchResources"]["namespaceSelector"]
            selector["matchExpressions"].append({"key": MODES_LABEL, "operator": "Exists"})
    return objects


@pytest.fixture(scope="module")
def api(cel_cluster: DevCluster) -> Iterator[Api]:
    client = Api(cel_cluster)
    yield client
    client.http.clear()


@pytest.fixture
def ns(cel_cluster: DevCluster, request: pytest.FixtureRequest) -> str:
    name: str = "cel-" + request.node.name.replace("_", "-").lower()[:40].strip("-[]")
    name = re.sub(r"[^a-z0-9-]", "-", name).strip("-")
    cel_cluster.create_namespace(name)
    return name


def vap_rules(sent: Sent) -> set[str]:
    """The rule ids of the CEL policies that refused ``sent`` (none: not refused by them)."""
    if sent.status != 403 or not isinstance(sent.body, dict):
        return set()
    return set(_RULE_IN_MESSAGE.findall(str(sent.body.get("message", ""))))


def judged_by_cel(obj: Any, policy: Policy = POLICY) -> Any:
    """``obj`` with what the CEL rules leave to the webhook made moot: in a
    container asking for memory as a percentage, its per-GPU memory limits dropped (only
    the cluster view knows their values: unmutated-gpu-pod neither wants nor refuses them)."""
    obj = copy.deepcopy(obj)
    stack = [obj]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            _drop_percentage_limits(node, policy)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return obj


def _drop_percentage_limits(node: Obj, policy: Policy) -> None:
    """Drop ``CUDA_DEVICE_MEMORY_LIMIT_<i>`` (i below its GPU count) from ``node`` when it
    is a container asking for memory as a valid percentage and not in MiB."""
    env = node.get("env")
    if not isinstance(env, list) or not isinstance(node.get("resources"), dict):
        return
    request = read_container(node, kind="containers", index=0, policy=policy)
    if request is None or request.memory_mib is not None or request.memory_percentage is None:
        return
    owned = {f"CUDA_DEVICE_MEMORY_LIMIT_{i}" for i in range(request.gpus)}
    node["env"] = [e for e in env if not (isinstance(e, dict) and e.get("name") in owned)]


def core_denials(obj: Any, namespace: str, policy: Policy = POLICY, **request: Any) -> set[str]:
    obj = judged_by_cel(obj, policy)
    entry = review_object(obj, policy, namespace=namespace, **request)
    denied = {v["rule"] for v in entry["violations"] if v["action"] == "deny"} & set(RULES)
    # The review mutates before it validates; here nothing mutates, so what the mutation
    # would still set is /validate's verdict on the object as the apiserver holds it.
    denied.discard("unmutated-gpu-pod")
    if isinstance(obj, dict):
        facts = Request(
            kind=str(obj.get("kind") or ""),
            operation=request.get("operation", "CREATE"),
            namespace=namespace,
            username=request.get("username", ""),
            groups=tuple(request.get("groups", ())),
            today=request.get("today", ""),
        )
        validated = {v["rule"] for v in decide(obj, facts, policy, phase="validate").denials}
        # A container the webhook would void (a legacy CUDA image, one under a GPU
        # runtime class) is seen by the policies as /validate sees what missed the
        # mutation, whatever else is refused.
        for rule in ("raw-visible-devices", "host-device-access"):
            if rule in validated:
                denied.add(rule)
        if "unmutated-gpu-pod" in validated:
            denied.add("unmutated-gpu-pod")
    return denied


def _pod(
    name: str, *containers: Obj, annotations: Mapping[str, str] | None = None, **spec: Any
) -> Obj:
    metadata: Obj = {"name": name}
    if annotations is not None:
        metadata["annotations"] = dict(annotations)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": list(containers), **spec},
    }


def _c(name: str = "app", gpu: bool = True, **extra: Any) -> Obj:
    container: Obj = {"name": name, "image": "busybox", **extra}
    if gpu:
        container["resources"] = {"limits": {"nvidia.com/gpumem": "3000"}}
    return container


def _writable_host(path: str) -> Obj:
    """A plain pod that mounts the host's ``path`` writable."""
    mount = {"name": "h", "mountPath": "/h"}
    volume = {"name": "h", "hostPath": {"path": path}}
    return _pod("p", _c(gpu=False, volumeMounts=[mount]), volumes=[volume])


def _env(*pairs: tuple[str, Any]) -> list[Obj]:
    env = []
    for name, value in pairs:
        if isinstance(value, dict):
            env.append({"name": name, "valueFrom": value})
        else:
            env.append({"name": name, "value": value})
    return env


_FIELD: Final = {"fieldRef": {"fieldPath": "metadata.name"}}


def _caps(*names: str) -> Obj:
    return {"capabilities": {"add": list(names)}}


def _mutated(pod: Obj, policy: Policy = POLICY, *, namespace: str = "default") -> Obj:
    """``pod`` as the mutating webhook leaves it under ``policy`` (unchanged if refused)."""
    entry = review_object(pod, policy, namespace=namespace)
    mutated: Obj = entry["object"]
    return mutated


_MPS: Final = {"ack.node.gpu.schedule": "mps"}


def _asks(limits: Obj) -> Obj:
    return _c(gpu=False, resources={"limits": dict(limits)})


def _moded(pod: Obj, mode: str) -> Obj:
    return {**pod, "metadata": {"name": "p", "annotations": {"gpushare.io/mode": mode}}}


def _without(pod: Obj, field: str) -> Obj:
    pod = copy.deepcopy(pod)
    del pod["spec"][field]
    return pod


def _set_env(pod: Obj, name: str, value: str) -> Obj:
    """``pod`` with its first container's last ``name`` entry set to ``value``."""
    pod = copy.deepcopy(pod)
    (entry,) = [e for e in pod["spec"]["containers"][0]["env"] if e["name"] == name][-1:]
    entry["value"] = value
    return pod


def _with_env(pod: Obj, name: str) -> Obj:
    """``pod`` with an empty ``name`` entry added to its first container's env."""
    pod = copy.deepcopy(pod)
    pod["spec"]["containers"][0]["env"].append({"name": name, "value": ""})
    return pod


def _with_container(pod: Obj, container: Obj) -> Obj:
    pod = copy.deepcopy(pod)
    pod["spec"]["containers"].append(container)
    return pod


def _mutation_of(obj: Any, policy: Policy, *, namespace: str) -> Any:
    """``obj`` with the mutation ``policy`` gives it applied, whatever rule it breaks (the
    webhook would refuse such an object; the warn-only bindings judge it all the same)."""
    if not isinstance(obj, dict):
        return obj
    audit = dataclasses.replace(policy, actions=dict.fromkeys(policy.actions, "audit"))
    return review_object(obj, audit, namespace=namespace)["object"]


def _writable(pod: Obj) -> Obj:
    """``pod`` with its first read-only mount writable."""
    pod = copy.deepcopy(pod)
    for container in pod["spec"]["containers"]:
        for mount in container.get("volumeMounts", []):
            if mount.get("readOnly") is True:
                del mount["readOnly"]
                return pod
    raise AssertionError("no read-only mount")


# name -> (pod, the rule that refuses it)
BYPASSES: Final[dict[str, tuple[Obj, str]]] = {
    "privileged": (_pod("p", _c(securityContext={"privileged": True})), "privileged-gpu"),
    "privileged-init": (
        _pod(
            "p", _c(), initContainers=[_c("init", gpu=False, securityContext={"privileged": True})]
        ),
        "privileged-gpu",
    ),
    "node-name": (_pod("p", _c(), nodeName="gpu-node-1"), "node-name-pinning"),
    "visible-devices-all": (
        _pod("p", _c(gpu=False, env=_env(("NVIDIA_VISIBLE_DEVICES", "all")))),
        "raw-visible-devices",
    ),
    "visible-devices-index": (
        _pod("p", _c(env=_env(("NVIDIA_VISIBLE_DEVICES", " 0,1 ")))),
        "raw-visible-devices",
    ),
    "visible-devices-value-from": (
        _pod("p", _c(gpu=False, env=_env(("NVIDIA_VISIBLE_DEVICES", _FIELD)))),
        "raw-visible-devices",
    ),
    "disable-control": (
        _pod("p", _c(env=_env(("CUDA_DISABLE_CONTROL", " True")))),
        "limit-tampering",
    ),
    # Python's strip() drops \x1c-\x1f, CEL's trim() does not: matched as the core strips.
    "disable-control-odd-space": (
        _pod("p", _c(env=_env(("CUDA_DISABLE_CONTROL", "\x1cTrue\u3000")))),
        "limit-tampering",
    ),
    "core-policy-disable": (
        _pod("p", _c(env=_env(("GPU_CORE_UTILIZATION_POLICY", "DISABLE")))),
        "limit-tampering",
    ),
    "redirect": (_pod("p", _c(env=_env(("CUDA_REDIRECT", "libcuda.so")))), "limit-tampering"),
    # The shared region on a host path every vGPU pod shares, out of HAMi's monitor's sight.
    "region-on-the-lock-dir": (
        _pod("p", _c(env=_env(("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/tmp/vgpulock/x.cache")))),
        "limit-tampering",
    ),
    "region-below-the-dir": (
        _pod("p", _c(env=_env(("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/usr/local/vgpu/c/x.cache")))),
        "limit-tampering",
    ),
    "priority-in-the-env": (
        _pod("p", _c(env=_env(("CUDA_TASK_PRIORITY", "5")))),
        "limit-tampering",
    ),
    "priority-resource": (
        _pod("p", _asks({"nvidia.com/gpumem": "3000", "nvidia.com/priority": "5"})),
        "invalid-gpu-request",
    ),
    # A CUDA image under the NVIDIA runtime sees every GPU without the void (the class
    # exists in cel_cluster: the apiserver refuses a pod naming one that does not).
    "gpu-runtime-class": (
        _pod("p", _c(gpu=False), runtimeClassName="nvidia"),
        "host-device-access",
    ),
    "oom-killer-off": (
        _pod("p", _c(env=_env(("ACTIVE_OOM_KILLER", "0")))),
        "limit-tampering",
    ),
    "switch-expanded": (
        _pod("p", _c(env=_env(("X", "1"), ("CUDA_DISABLE_CONTROL", "$(X)")))),
        "limit-tampering",
    ),
    "switch-value-from": (
        _pod("p", _c(env=_env(("ACTIVE_OOM_KILLER", _FIELD)))),
        "limit-tampering",
    ),
    "scheduler": (_pod("p", _c(), schedulerName="my-scheduler"), "scheduler-bypass"),
    # Volcano's GPU-share memory is counted by volcano alone.
    "scheduler-volcano-gpushare": (
        _pod("p", _asks({"volcano.sh/gpu-memory": "2048"}), schedulerName="hami-scheduler"),
        "scheduler-bypass",
    ),
    "scheduler-mps": (
        _pod("p", _c(), schedulerName="volcano", annotations={"gpushare.io/mode": " MPS"}),
        "scheduler-bypass",
    ),
    "forged-annotation": (
        _pod("p", _c(), annotations={"hami.io/vgpu-devices-allocated": "GPU-0"}),
        "forged-allocation",
    ),
    "forged-glob": (
        _pod("p", _c(gpu=False), annotations={"hami.io/mlu-devices-to-allocate": "x"}),
        "forged-allocation",
    ),
    # Spelled so that a literal prefix check misses it: the apiserver keeps "//" and "/./".
    "host-path-spelled": (
        _pod("p", _c(), volumes=[{"name": "dev", "hostPath": {"path": "//dev//nvidia0"}}]),
        "host-device-access",
    ),
    "host-path-dot": (
        _pod(
            "p",
            _c(volumeMounts=[{"name": "dev", "mountPath": "/dev/nvidia0"}]),
            volumes=[{"name": "dev", "hostPath": {"path": "/dev/./nvidia0/"}}],
        ),
        "host-device-access",
    ),
    # Every pod, not only GPU pods: the kubelet's state reaches every pod's devices.
    "host-path-kubelet": (
        _pod("p", _c(gpu=False), volumes=[{"name": "k", "hostPath": {"path": "var/lib/kubelet"}}]),
        "host-device-access",
    ),
    "injected-writable": (_writable(_mutated(_pod("p", _c()))), "host-device-access"),
    # Where the GPU stack reads inside the container (issue: default-deny, files).
    "preload-shadowed": (
        _pod(
            "p",
            _c(volumeMounts=[{"name": "m", "mountPath": "/etc//ld.so.preload", "readOnly": True}]),
            volumes=[{"name": "m", "configMap": {"name": "preload"}}],
        ),
        "host-device-access",
    ),
    "override-env": (
        _pod(
            "p",
            _c(gpu=False, volumeMounts=[{"name": "m", "mountPath": "/overrideEnv/"}]),
            volumes=[{"name": "m", "emptyDir": {}}],
        ),
        "host-device-access",
    ),
    "vgpu-directory": (
        _pod(
            "p",
            _c(volumeMounts=[{"name": "m", "mountPath": "/usr/local/./vgpu/x.cache"}]),
            volumes=[{"name": "m", "emptyDir": {}}],
        ),
        "host-device-access",
    ),
    "device-request-prefix": (
        _pod(
            "p",
            _c(
                gpu=False,
                volumeMounts=[{"name": "m", "mountPath": "/var/run/nvidia-container-devicesall"}],
            ),
            volumes=[{"name": "m", "emptyDir": {}}],
        ),
        "host-device-access",
    ),
    # Any CDI key: the runtime reads it whatever the vendor.
    "cdi-other-vendor": (
        _pod("p", _c(gpu=False), annotations={"cdi.k8s.io/fpga": "example.com/fpga=0"}),
        "host-device-access",
    ),
    "cdi-bare-name": (
        _pod("p", _c(gpu=False), annotations={"cdi.k8s.io/x": "all"}),
        "host-device-access",
    ),
    "crio-devices": (
        _pod(
            "p",
            _c(gpu=False),
            annotations={"io.kubernetes.cri-o.Devices": "/dev/fuse,/dev/nvidia0:/dev/x:rw"},
        ),
        "host-device-access",
    ),
    "device-request-mount": (
        _pod(
            "p",
            _c(
                gpu=False,
                volumeMounts=[
                    {"name": "r", "mountPath": "/var/run//nvidia-container-devices/./all"}
                ],
            ),
            volumes=[{"name": "r", "emptyDir": {}}],
        ),
        "host-device-access",
    ),
    "cdi-annotation": (
        _pod("p", _c(gpu=False), annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=all"}),
        "host-device-access",
    ),
    # The NVIDIA toolkit's NRI plugin reads its domain as a bare key too.
    "nri-bare-cdi-key": (
        _pod("p", _c(gpu=False), annotations={"nvidia.cdi.k8s.io": "nvidia.com/gpu=all"}),
        "host-device-access",
    ),
    "nri-cdi-devices": (
        _pod(
            "p",
            _c(gpu=False),
            annotations={"cdi-devices.noderesource.dev/pod": "nvidia.com/gpu=all"},
        ),
        "host-device-access",
    ),
    # HAMi's scheduler decodes every vendor's allocated key for every pod.
    "hami-vendor-ledger": (
        _pod("p", _c(), annotations={"hami.io/kunlun-allocated": "x"}),
        "forged-allocation",
    ),
    # The threat model's families (docs/threat-model.md).
    "sys-admin": (
        _pod("p", _c(), initContainers=[_c("i", gpu=False, securityContext=_caps("sys_admin"))]),
        "privileged-gpu",
    ),
    "sys-admin-long-s": (
        _pod("p", _c(securityContext=_caps("\u017fys_admin"))),
        "privileged-gpu",
    ),
    "cap-all": (
        _pod("p", _c(), _c("s", gpu=False, securityContext=_caps("all"))),
        "privileged-gpu",
    ),
    "legacy-cuda": (
        _pod("p", _c(gpu=False, env=_env(("CUDA_VERSION", "9.0")))),
        "raw-visible-devices",
    ),
    "legacy-cuda-value-from": (
        _pod("p", _c(), _c("s", gpu=False, env=_env(("CUDA_VERSION", _FIELD)))),
        "raw-visible-devices",
    ),
    "env-from-prefix": (
        _pod("p", _c(gpu=False, envFrom=[{"prefix": "NVIDIA_", "configMapRef": {"name": "e"}}])),
        "raw-visible-devices",
    ),
    # The env channel: env.allowed decides by name, value and container class.
    "gds-in-slice": (_pod("p", _c(env=_env(("NVIDIA_GDS", "enabled")))), "raw-visible-devices"),
    "imex-in-plain": (
        _pod("p", _c(gpu=False, env=_env(("NVIDIA_IMEX_CHANNELS", "0")))),
        "raw-visible-devices",
    ),
    "graphics-in-slice": (
        _pod("p", _c(env=_env(("NVIDIA_DRIVER_CAPABILITIES", "compute, graphics")))),
        "raw-visible-devices",
    ),
    "capabilities-from-field": (
        _pod("p", _c(env=_env(("NVIDIA_DRIVER_CAPABILITIES", _FIELD)))),
        "raw-visible-devices",
    ),
    "imex-all-in-whole": (
        _pod(
            "p",
            _c(
                gpu=False,
                resources={"limits": {"nvidia.com/gpu": "1"}},
                env=_env(("NVIDIA_IMEX_CHANNELS", "channelall")),
            ),
        ),
        "raw-visible-devices",
    ),
    "imex-numbered-and-all-in-whole": (
        _pod(
            "p",
            _c(
                gpu=False,
                resources={"limits": {"nvidia.com/gpu": "1"}},
                env=_env(("NVIDIA_IMEX_CHANNELS", "0,all")),
            ),
        ),
        "raw-visible-devices",
    ),
    "legacy-slice": (
        _pod("p", _c(env=_env(("CUDA_VERSION", "12.4"), ("NVIDIA_REQUIRE_CUDA", "")))),
        "raw-visible-devices",
    ),
    "jetpack-csv": (
        _pod("p", _c(gpu=False, env=_env(("NVIDIA_REQUIRE_JETPACK", "csv-mounts=all")))),
        "raw-visible-devices",
    ),
    "swarm-resource": (
        _pod("p", _c(gpu=False, env=_env(("DOCKER_RESOURCE_GPU", "0")))),
        "raw-visible-devices",
    ),
    "record-kernel-interval": (
        _pod("p", _c(env=_env(("RECORD_KERNEL_INTERVAL", "1")))),
        "limit-tampering",
    ),
    "mps-client-priority": (
        _pod("p", _c(env=_env(("CUDA_MPS_CLIENT_PRIORITY", "5")))),
        "limit-tampering",
    ),
    "mps-pipe-in-vgpu-slice": (
        _pod("p", _c(env=_env(("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")))),
        "limit-tampering",
    ),
    "mps-threads-in-whole": (
        _pod(
            "p",
            _c(
                gpu=False,
                resources={"limits": {"nvidia.com/gpu": "1"}},
                env=_env(("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100")),
            ),
        ),
        "limit-tampering",
    ),
    "block-device-at-preload": (
        _pod(
            "p",
            _c(gpu=False, volumeDevices=[{"name": "d", "devicePath": "/etc/ld.so.preload"}]),
            volumes=[{"name": "d", "persistentVolumeClaim": {"claimName": "raw"}}],
        ),
        "host-device-access",
    ),
    # (The apiserver refuses '..' in a devicePath.)
    "block-device-at-library": (
        _pod(
            "p",
            _c(volumeDevices=[{"name": "d", "devicePath": "/usr/local/vgpu/libvgpu.so"}]),
            volumes=[{"name": "d", "persistentVolumeClaim": {"claimName": "raw"}}],
        ),
        "host-device-access",
    ),
    "host-pid": (_pod("p", _c(), hostPID=True), "host-device-access"),
    "host-ipc-vgpu": (_pod("p", _c(), hostIPC=True), "host-device-access"),
    "sysfs-writable": (_writable_host("/sys/bus//pci"), "host-device-access"),
    "gke-driver-writable": (_writable_host("/home/kubernetes/bin/nvidia"), "host-device-access"),
    "driver-library-writable": (_writable_host("/opt/drv/libcuda.so.1"), "host-device-access"),
    "ack-ledger": (
        _pod(
            "p",
            _c(resources={"limits": {"aliyun.com/gpu-mem": "3"}}),
            annotations={"ALIYUN_COM_GPU_MEM_IDX": "1"},
        ),
        "forged-allocation",
    ),
    "volcano-ledger": (
        _pod("p", _c(gpu=False), annotations={"volcano.sh/vgpu-ids-new": "GPU-0"}),
        "forged-allocation",
    ),
    "dra-class-resource": (
        _pod(
            "p",
            _c(
                gpu=False,
                resources={"limits": {"deviceclass.resource.kubernetes.io/gpu.nvidia.com": "1"}},
            ),
        ),
        "gpu-claim",
    ),
    # What the core reads with the quantity parser: units, ranges, requests and limits.
    "gpumem-gibibytes": (_pod("p", _asks({"nvidia.com/gpumem": "3Gi"})), "invalid-gpu-request"),
    "gib-above-the-mib-maximum": (
        _pod("p", _asks({"aliyun.com/gpu-mem": "524289"})),
        "invalid-gpu-request",
    ),
    "gib-bytes": (_pod("p", _asks({"aliyun.com/gpu-mem": "17066622976"})), "invalid-gpu-request"),
    "gpumem-bytes": (
        _pod("p", _asks({"nvidia.com/gpumem": "3221225472"})),
        "invalid-gpu-request",
    ),
    "cores-over-100": (_pod("p", _asks({"nvidia.com/gpucores": "150"})), "invalid-gpu-request"),
    "zero-gpus-beside-memory": (
        _pod("p", _asks({"nvidia.com/gpu": "0", "nvidia.com/gpumem": "3000"})),
        "invalid-gpu-request",
    ),
    "memory-twice": (
        _pod("p", _asks({"nvidia.com/gpumem": "3000", "aliyun.com/gpu-mem": "3"})),
        "invalid-gpu-request",
    ),
    "mig-mode-slice": (_moded(_pod("p", _c()), "mig"), "mode-conflict"),
    "mig-beside-slice": (
        _pod("p", _asks({"nvidia.com/mig-1g.5gb": "1", "nvidia.com/gpumem": "3000"})),
        "mode-conflict",
    ),
    "mode-misspelt": (_moded(_pod("p", _c()), "vgpu2"), "mode-conflict"),
    "mps-percentage": (
        _moded(_pod("p", _asks({"nvidia.com/gpumem-percentage": "25"})), "mps"),
        "mode-conflict",
    ),
    "selector-means-mps": (
        _moded(_pod("p", _c(), nodeSelector={"ack.node.gpu.schedule": "mps"}), "vgpu"),
        "mode-conflict",
    ),
    # What the mutation sets, missing or changed after it.
    "unmutated": (_pod("p", _c()), "unmutated-gpu-pod"),
    "unmutated-mps-host-ipc": (
        _without(_mutated(_pod("p", _c(), nodeSelector=_MPS)), "hostIPC"),
        "unmutated-gpu-pod",
    ),
    "unmutated-limit-raised": (
        _set_env(_mutated(_pod("p", _c())), "CUDA_DEVICE_MEMORY_LIMIT_0", "8000m"),
        "unmutated-gpu-pod",
    ),
    "unmutated-preload-dropped": (
        _set_env(_mutated(_pod("p", _c())), "LD_PRELOAD", "/opt/libjemalloc.so"),
        "unmutated-gpu-pod",
    ),
    "unmutated-sidecar-unvoided": (
        _with_container(_mutated(_pod("p", _c())), _c("late", gpu=False)),
        "unmutated-gpu-pod",
    ),
}


def _kai_fraction() -> Obj:
    """A KAI fraction pod as KAI's webhook leaves it, sendable to any namespace."""
    pod = kai_fraction_pod()
    del pod["metadata"]["namespace"]
    return pod


ADMITTED: Final[dict[str, Obj]] = {
    "plain": _pod("p", _c(gpu=False)),
    "block-device": _pod(
        "p",
        _c(gpu=False, volumeDevices=[{"name": "d", "devicePath": "/dev/xvdb"}]),
        volumes=[{"name": "d", "persistentVolumeClaim": {"claimName": "raw"}}],
    ),
    # The binder writes the ConfigMap (tests for who may: below).
    "kai-fraction": _kai_fraction(),
    # Volcano's MPI launcher: nvidia.com/gpu: 0 asks for no GPU.
    "zero-gpu-launcher": _pod(
        "p",
        _c(
            gpu=False,
            resources={"limits": {"nvidia.com/gpu": "0"}, "requests": {"nvidia.com/gpu": "0"}},
        ),
        schedulerName="volcano",
    ),
    # MIG's single strategy: whole GPUs under the cluster's own scheduler.
    "mig-single-whole-gpu": _pod(
        "p",
        _c(gpu=False, resources={"limits": {"nvidia.com/gpu": "1"}}),
        nodeSelector={"nvidia.com/gpu.product": "A100-SXM4-40GB-MIG-1g.5gb"},
    ),
    "plain-privileged": _pod("p", _c(gpu=False, securityContext={"privileged": True})),
    "plain-node-name": _pod("p", _c(gpu=False), nodeName="node-1"),
    "whole-gpu-gates": _pod(
        "p",
        _c(
            gpu=False,
            resources={"limits": {"nvidia.com/gpu": "1"}},
            env=_env(
                ("NVIDIA_GDS", "enabled"),
                ("NVIDIA_DRIVER_CAPABILITIES", "all"),
                ("CUDA_VERSION", "12.4"),
                ("NVIDIA_IMEX_CHANNELS", "channel0"),
            ),
        ),
    ),
    "workload-env": _pod(
        "p",
        _c(
            gpu=False,
            env=_env(
                ("NVIDIA_DRIVER_CAPABILITIES", " compute,utility ,video"),
                ("NVIDIA_REQUIRE_CUDA", "cuda>=12.4"),
                ("NVIDIA_API_KEY", _FIELD),
                ("CUDA_VISIBLE_DEVICES", "0"),
                ("NVIDIA_VISIBLE_DEVICES", "void"),
            ),
        ),
    ),
    "other-runtime-class": _pod("p", _c(gpu=False), runtimeClassName="kata"),
    "gpu-runtime-class-voided": _pod(
        "p", _c(gpu=False, env=_env(("NVIDIA_VISIBLE_DEVICES", "void"))), runtimeClassName="nvidia"
    ),
    "gpu": _pod("p", _c()),
    "region-in-the-dir": _pod(
        "p", _c(env=_env(("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/usr/local/vgpu/own.cache")))
    ),
    "priority-high": _pod("p", _asks({"nvidia.com/gpumem": "3000", "nvidia.com/priority": "0"})),
    "gpu-settings": _pod(
        "p",
        _c(
            env=_env(
                ("NVIDIA_VISIBLE_DEVICES", " None"),
                ("CUDA_DISABLE_CONTROL", "false"),
                ("GPU_CORE_UTILIZATION_POLICY", "force"),
                ("CUDA_REDIRECT", ""),
                ("ACTIVE_OOM_KILLER", "true"),
            )
        ),
    ),
    "plain-scheduler": _pod("p", _c(gpu=False), schedulerName="volcano"),
    "gpu-hami-scheduler": _pod("p", _c(), schedulerName="hami-scheduler"),
    "mig-scheduler": _pod(
        "p",
        _c(gpu=False, resources={"limits": {"nvidia.com/mig-1g.5gb": "1"}}),
        schedulerName="volcano",
    ),
    "gpu-odd-space": _pod(
        "p",
        _c(
            env=_env(
                ("NVIDIA_VISIBLE_DEVICES", "\x1fVoid\u00a0"),
                ("CUDA_DISABLE_CONTROL", "\x1c0"),
            )
        ),
    ),
    "plain-switches": _pod("p", _c(gpu=False, env=_env(("CUDA_DISABLE_CONTROL", "1")))),
    "other-annotations": _pod("p", _c(), annotations={"hami.io/vgpu-mode": "x", "team": "ml"}),
    # A GiB resource above 1024 is read as MiB (ACK's MiB unit), with a warning.
    "ack-mib": _pod("p", _asks({"aliyun.com/gpu-mem": "16276"})),
    # Volcano's GPU-share memory: MiB, no count implied.
    "volcano-gpushare": _pod("p", _asks({"volcano.sh/gpu-memory": "2048"})),
    "ack-mib-mps": _pod("p", _asks({"aliyun.com/gpu-mem": "16276"}), nodeSelector=_MPS),
    # A claim beside slices: its device class (here a ComputeDomain's IMEX channel) is
    # known only to the webhook's cluster view.
    "claim-beside-slice": _pod(
        "p",
        _c(resources={"limits": {"nvidia.com/gpu": "4"}, "claims": [{"name": "channel"}]}),
        resourceClaims=[{"name": "channel", "resourceClaimTemplateName": "imex-channel"}],
    ),
    # Above the paths the GPU stack reads: the deeper mount wins.
    "mount-above-read-paths": _pod(
        "p",
        _c(
            volumeMounts=[
                {"name": "m", "mountPath": "/etc"},
                {"name": "m", "mountPath": "/usr/local"},
            ]
        ),
        volumes=[{"name": "m", "emptyDir": {}}],
    ),
    "crio-listed-devices": _pod(
        "p", _c(gpu=False), annotations={"devices.crio.io": "/dev/fuse:/dev/fuse:rwm,/dev/net/tun"}
    ),
    # What the mutation injects, exactly, is not host-device-access.
    "mutated-vgpu": _mutated(_pod("p", _c())),
    "mutated-mps": _mutated(_pod("p", _c(), nodeSelector={"ack.node.gpu.schedule": "mps"})),
    "harmless-host-paths": _pod(
        "p",
        _c(volumeMounts=[{"name": "cdi", "mountPath": "/etc/cdi", "readOnly": True}]),
        volumes=[
            {"name": "data", "hostPath": {"path": "/data//models/"}},
            {"name": "kb", "hostPath": {"path": "/var/lib/kubelet-backup"}},
            {"name": "cdi", "hostPath": {"path": "/etc/cdi"}},
        ],
    ),
    "gpu-net-admin": _pod("p", _c(securityContext=_caps("NET_ADMIN", " SYS_ADMIN"))),
    "plain-sys-admin-host-pid": _pod(
        "p", _c(gpu=False, securityContext=_caps("ALL")), hostPID=True
    ),
    "cuda-voided": _pod(
        "p", _c(gpu=False, env=_env(("CUDA_VERSION", "9.0"), ("NVIDIA_VISIBLE_DEVICES", "void")))
    ),
    "cuda-required": _pod(
        "p", _c(gpu=False, env=_env(("CUDA_VERSION", "9.0"), ("NVIDIA_REQUIRE_CUDA", "cuda>=9")))
    ),
    "cuda-gpu-container": _pod("p", _c(env=_env(("CUDA_VERSION", "9.0")))),
    "harmless-prefix": _pod("p", _c(envFrom=[{"prefix": "APP_", "configMapRef": {"name": "e"}}])),
    "read-only-sysfs": _pod(
        "p",
        _c(volumeMounts=[{"name": "s", "mountPath": "/s", "readOnly": True}]),
        volumes=[{"name": "s", "hostPath": {"path": "/sys"}}],
    ),
    # Memory as a percentage: the per-GPU limits the cluster view would set are no stray.
    "mutated-percentage-limited": _set_env(
        _with_env(
            _mutated(_pod("p", _asks({"nvidia.com/gpumem-percentage": "25"}))),
            "CUDA_DEVICE_MEMORY_LIMIT_0",
        ),
        "CUDA_DEVICE_MEMORY_LIMIT_0",
        "10240m",
    ),
    "mutated-mps-host-ipc": _mutated(
        _pod("p", _c(), hostIPC=True, nodeSelector={"ack.node.gpu.schedule": "mps"})
    ),
}


def _deployment(pod: Obj) -> Obj:
    template = copy.deepcopy(pod)
    template.pop("apiVersion")
    template.pop("kind")
    template["metadata"] = {**template.get("metadata", {}), "labels": {"app": "cel"}}
    template["metadata"].pop("name", None)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d"},
        "spec": {"selector": {"matchLabels": {"app": "cel"}}, "template": template},
    }


def _cronjob(pod: Obj) -> Obj:
    template = _deployment(pod)["spec"]["template"]
    template["spec"]["restartPolicy"] = "Never"
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "cj"},
        "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": template}}},
    }


@pytest.mark.parametrize("shape", sorted(BYPASSES))
def test_each_bypass_is_refused_without_the_webhook(api: Api, ns: str, shape: str) -> None:
    pod, rule = BYPASSES[shape]
    assert rule in core_denials(pod, ns)
    for kind, obj in (("Pod", pod), ("Deployment", _deployment(pod)), ("CronJob", _cronjob(pod))):
        sent = api.create(kind, ns, obj)
        assert vap_rules(sent) == {rule}, (kind, sent.status, sent.body)


# GPU amounts of one container, and whether the core refuses them as invalid-gpu-request:
# an amount the apiserver reads as zero asks for nothing only where every GPU amount of the
# container is zero and one is a count (resources.vacant).
ZERO_AMOUNTS: Final[dict[str, tuple[Obj, bool]]] = {
    "zero-count": ({"nvidia.com/gpu": "0"}, False),
    "zero-milli-count": ({"nvidia.com/gpu": "0m"}, False),
    "zero-count-and-mig": ({"nvidia.com/gpu": "00", "nvidia.com/mig-1g.5gb": "-0"}, False),
    "zero-count-and-cores": ({"volcano.sh/vgpu-number": "0", "volcano.sh/vgpu-cores": "0"}, False),
    "zero-count-beside-memory": ({"nvidia.com/gpu": "0", "nvidia.com/gpumem": "3000"}, True),
    "zero-count-beside-cores": ({"nvidia.com/gpu": "0m", "nvidia.com/gpucores": "30"}, True),
    "zero-count-beside-mig": ({"nvidia.com/gpu": "0", "nvidia.com/mig-1g.5gb": "1"}, True),
    "zero-count-beside-priority": ({"nvidia.com/gpu": "0", "nvidia.com/priority": "0"}, True),
    "zero-memory-alone": ({"nvidia.com/gpumem": "0"}, True),
}


@pytest.mark.parametrize("shape", sorted(ZERO_AMOUNTS))
def test_zero_amounts_are_judged_as_the_core_judges_them(api: Api, ns: str, shape: str) -> None:
    limits, refused = ZERO_AMOUNTS[shape]
    launcher = _c("launcher", gpu=False, resources={"limits": limits, "requests": limits})
    pod = _pod("p", launcher, schedulerName="volcano")
    expected = core_denials(pod, ns)
    assert ("invalid-gpu-request" in expected) == refused, expected
    for kind, obj in (("Pod", pod), ("Deployment", _deployment(pod))):
        # A policy names the first of its validations that fails.
        sent = api.create(kind, ns, obj)
        assert vap_rules(sent) <= expected, (kind, sent.status, sent.body)
        assert (sent.status == 201) == (not expected), (kind, sent.status, sent.body)
    if refused:
        return
    # Beside a legacy CUDA image under a GPU runtime class, the launcher is a container
    # without a GPU, judged and voided as one.
    legacy = _c("legacy", gpu=False, env=_env(("CUDA_VERSION", "12.4")))
    plain = _c("launcher", gpu=False)
    beside, without = (_pod("p", c, legacy, runtimeClassName="nvidia") for c in (launcher, plain))
    assert core_denials(beside, ns) == core_denials(without, ns)
    assert api.create("Pod", ns, beside).body == api.create("Pod", ns, without).body
    mutated = _mutated(beside, namespace=ns)
    for container in mutated["spec"]["containers"]:
        assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in container["env"]
    assert api.create("Pod", ns, mutated).status == 201


_GPU_CLASS: Final = "deviceclass.resource.kubernetes.io/gpu.nvidia.com"


@pytest.mark.parametrize(
    ("amounts", "refused"),
    [
        ({"nvidia.com/mig-1g.5gb": "0", _GPU_CLASS: "1"}, True),
        ({"nvidia.com/gpu": "0", _GPU_CLASS: "2"}, True),
        ({_GPU_CLASS: "0"}, False),
    ],
)
def test_a_zero_beside_a_gpu_class_resource_leaves_the_class_asked(
    api: Api, ns: str, amounts: Obj, refused: bool
) -> None:
    """A zero count or MIG instance asks for no GPU of the policy's, and says nothing of a
    DRA class asked for by its extended resource beside it: gpu-claim still sees that."""
    trainer = _c("trainer", gpu=False, resources={"limits": amounts, "requests": amounts})
    pod = _pod("p", trainer)
    expected = core_denials(pod, ns)
    assert ("gpu-claim" in expected) == refused, expected
    sent = api.create("Pod", ns, pod)
    assert vap_rules(sent) <= expected, (sent.status, sent.body)
    assert (sent.status == 201) == (not expected), (sent.status, sent.body)


@pytest.mark.parametrize("attack", [None, *sorted(KAI_ATTACKS)])
def test_kai_fractions_take_devices_only_from_the_binders_config_map(
    api: Api, ns: str, attack: str | None
) -> None:
    pod = _kai_fraction()
    if attack is not None:
        KAI_ATTACKS[attack](pod)
    expected = core_denials(pod, ns)
    assert ("raw-visible-devices" in expected) == (attack is not None), expected
    sent = api.create("Pod", ns, pod)
    assert vap_rules(sent) <= expected, (sent.status, sent.body)
    assert (sent.status == 201) == (not expected), (sent.status, sent.body)


def test_only_kais_binder_writes_devices_into_its_config_maps(api: Api, ns: str) -> None:
    binder = "system:serviceaccount:kai-scheduler:binder"
    tenant, _ = IDENTITIES["tenant"]
    api.grant_config_map_writes(ns, binder, tenant)
    data = {"NVIDIA_VISIBLE_DEVICES": "GPU-1234", "GPU_PORTION": "0.5"}
    for name, user, admitted in (
        (f"{KAI_PREFIX}-0", binder, True),
        (f"{KAI_PREFIX}-0-evar", binder, True),
        (f"{KAI_PREFIX}-0", tenant, False),
        ("gpu-sharing-env", binder, False),
    ):
        obj = config_map(name, data)
        del obj["metadata"]["namespace"]
        request = Request(kind="ConfigMap", namespace=ns, username=user)
        assert decide(obj, request, POLICY, phase="validate").allowed == admitted
        # The policies load asynchronously; the pod policies' wait does not cover these.
        deadline = time.monotonic() + 30
        while True:
            sent = api.create("ConfigMap", ns, obj, user=user)
            # ... nor the Role just granted: RBAC's 403 until its cache has it.
            if (admitted and sent.status == 201) or vap_rules(sent):
                break
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if admitted:
            assert sent.status == 201, sent.body
        else:
            assert vap_rules(sent) == {"raw-visible-devices"}, (sent.status, sent.body)


_REFUSAL: Final = re.compile(r"ValidatingAdmissionPolicy '[^']*' with binding [^:]*: (\[.*)$", re.S)


def core_messages(obj: Any, namespace: str, rule: str, kind: str = "Pod") -> set[str]:
    """The core's redacted messages of ``rule`` on ``obj``, at /mutate and /validate."""
    facts = Request(kind=kind, operation="CREATE", namespace=namespace, username="", groups=())
    found = set()
    for phase in ("mutate", "validate"):
        decision = decide(judged_by_cel(obj), facts, POLICY, phase=phase)
        for violation, text in zip(decision.violations, decision.redacted, strict=True):
            if violation["rule"] == rule:
                found.add(f"[{rule}] {text}")
    return found


@pytest.mark.parametrize("shape", sorted(BYPASSES))
def test_each_refusal_names_the_container_as_the_core_does(api: Api, ns: str, shape: str) -> None:
    """A refusal by a container rule names the first container that breaks it, and the
    field, as the core's (redacted) finding does; the others keep their static message."""
    pod, rule = BYPASSES[shape]
    sent = api.create("Pod", ns, pod)
    matched = _REFUSAL.search(str(sent.body.get("message", "")))
    assert matched, sent.body
    message = matched.group(1)
    if rule not in message_expressions(POLICY):
        assert message == f"[{rule}] {MESSAGES[rule]}"
        return
    core = core_messages(pod, ns, rule)
    if _CONTAINER_MESSAGE.match(message) is None:
        # Not a container's (a hostPath volume, a host namespace, an annotation).
        assert message == f"[{rule}] {MESSAGES[rule]}", message
        assert not any(_CONTAINER_MESSAGE.match(m) for m in core), core
        return
    assert not message_differs(message, core), (message, core)


_CONTAINER_MESSAGE: Final = re.compile(
    r'\[([a-z-]+)\] ((?:init |ephemeral )?container "[^"]*"): (\S+)'
)


def message_differs(message: str, core: set[str]) -> bool:
    """A container rule's CEL message (``[rule] <label>: <field> ...``) says other than
    the core: not one of its messages, or (a rule of GENERIC_RULES) none of them names
    that container and field. A message naming no container is the static one."""
    matched = _CONTAINER_MESSAGE.match(message)
    if matched is None:
        return False
    rule, label, field = matched.groups()
    if rule in GENERIC_RULES:
        return not any(m.startswith(f"[{rule}] {label}: {field} ") for m in core)
    return message not in core


def _source(kind: str, **fields: Any) -> Obj:
    version = "v1" if kind in ("ConfigMap", "Secret") else "resource.k8s.io/v1"
    return {"apiVersion": version, "kind": kind, "metadata": {"name": "s"}, **fields}


def _claim_spec(device_class: str, *configs: Obj) -> Obj:
    exactly = {"deviceClassName": device_class, "allocationMode": "All"}
    devices: Obj = {"requests": [{"name": "gpu", "exactly": exactly}]}
    if configs:
        devices["config"] = list(configs)
    return {"devices": devices}


def _config(driver: str, parameters: Obj) -> Obj:
    return {"opaque": {"driver": driver, "parameters": parameters}}


_GPU_CONFIG: Final[Obj] = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"}
_GPU_CONFIG_MPS: Final = _config(
    "gpu.nvidia.com",
    {
        **_GPU_CONFIG,
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 100}},
    },
)


# name -> (kind, object, the rule that refuses it or None)
SOURCES: Final[dict[str, tuple[str, Obj, str | None]]] = {
    "config-map-devices": (
        "ConfigMap",
        _source("ConfigMap", data={"NVIDIA_VISIBLE_DEVICES": "all"}),
        "raw-visible-devices",
    ),
    "config-map-cuda-version": (
        "ConfigMap",
        _source("ConfigMap", data={"LANG": "C", "CUDA_VERSION": "9.0"}),
        "raw-visible-devices",
    ),
    "config-map-limit": (
        "ConfigMap",
        _source("ConfigMap", data={"CUDA_DEVICE_MEMORY_LIMIT_0": "80g"}),
        "raw-visible-devices",
    ),
    # The apiserver folds stringData into data before admission.
    "secret-string-data": (
        "Secret",
        _source("Secret", stringData={"CUDA_DISABLE_CONTROL": "true"}),
        "raw-visible-devices",
    ),
    "claim-gpu": (
        "ResourceClaim",
        _source("ResourceClaim", spec=_claim_spec("gpu.nvidia.com")),
        "gpu-claim",
    ),
    "template-mig": (
        "ResourceClaimTemplate",
        _source("ResourceClaimTemplate", spec={"spec": _claim_spec("mig.nvidia.com")}),
        "gpu-claim",
    ),
    "device-class-serving-gpus": (
        "DeviceClass",
        _source("DeviceClass", spec={"extendedResourceName": "nvidia.com/gpu"}),
        "gpu-claim",
    ),
    "config-map-gds": (
        "ConfigMap",
        _source("ConfigMap", data={"NVIDIA_GDS": "enabled"}),
        "raw-visible-devices",
    ),
    "config-map-graphics": (
        "ConfigMap",
        _source("ConfigMap", data={"NVIDIA_DRIVER_CAPABILITIES": "graphics"}),
        "raw-visible-devices",
    ),
    "secret-capabilities": (
        "Secret",
        _source("Secret", stringData={"NVIDIA_DRIVER_CAPABILITIES": "compute"}),
        "raw-visible-devices",
    ),
    "config-map-capabilities": (
        "ConfigMap",
        _source("ConfigMap", data={"NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}),
        None,
    ),
    "secret-api-key": ("Secret", _source("Secret", stringData={"NVIDIA_API_KEY": "x"}), None),
    "config-map-plain": ("ConfigMap", _source("ConfigMap", data={"LANG": "C"}), None),
    "secret-plain": ("Secret", _source("Secret", stringData={"TOKEN": "x"}), None),
    "claim-fpga": (
        "ResourceClaim",
        _source("ResourceClaim", spec=_claim_spec("fpga.example.com")),
        None,
    ),
    "device-class-serving-gpumem": (
        "DeviceClass",
        _source("DeviceClass", spec={"extendedResourceName": "nvidia.com/gpumem"}),
        "gpu-claim",
    ),
    "device-class-plain": ("DeviceClass", _source("DeviceClass", spec={}), None),
    # A GPU driver's configuration overrides the class's, whatever the class.
    "claim-config-mps": (
        "ResourceClaim",
        _source("ResourceClaim", spec=_claim_spec("fpga.example.com", _GPU_CONFIG_MPS)),
        "gpu-claim",
    ),
    "template-config-no-sharing": (
        "ResourceClaimTemplate",
        _source(
            "ResourceClaimTemplate",
            spec={"spec": _claim_spec("fpga.example.com", _config("gpu.nvidia.com", _GPU_CONFIG))},
        ),
        "gpu-claim",
    ),
    "claim-config-other-driver": (
        "ResourceClaim",
        _source(
            "ResourceClaim",
            spec=_claim_spec("fpga.example.com", _config("fpga.example.com", {"mode": "x"})),
        ),
        None,
    ),
    # A MIG instance served by DRA is no slice.
    "device-class-serving-mig": (
        "DeviceClass",
        _source("DeviceClass", spec={"extendedResourceName": "nvidia.com/mig-1g.12gb"}),
        None,
    ),
}


@pytest.mark.parametrize("shape", sorted(SOURCES))
def test_env_and_device_sources_are_guarded_without_the_webhook(
    api: Api, ns: str, shape: str
) -> None:
    kind, obj, rule = SOURCES[shape]
    request = Request(kind=kind, namespace=ns, username="alice")
    core = {v["rule"] for v in decide(obj, request, POLICY, phase="validate").denials}
    assert core == ({rule} if rule else set())
    # The policies load asynchronously; the pod policies' wait does not cover these.
    deadline = time.monotonic() + 30
    while True:
        sent = api.create(kind, ns, obj)
        if rule is None or vap_rules(sent) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if rule is None:
        assert sent.status == 201, sent.body
    else:
        assert vap_rules(sent) == {rule}, (sent.status, sent.body)


@pytest.mark.parametrize("shape", sorted(ADMITTED))
def test_plain_and_well_shaped_gpu_pods_are_admitted(api: Api, ns: str, shape: str) -> None:
    """Admitted as the mutation (the webhook's or the MutatingAdmissionPolicies') leaves
    them; a GPU-sharing pod that missed it is refused as unmutated-gpu-pod."""
    pod = ADMITTED[shape]
    mutated = _mutated(pod, namespace=ns)
    assert core_denials(mutated, ns) == set()
    for kind, obj in (
        ("Pod", mutated),
        ("Deployment", _deployment(mutated)),
        ("CronJob", _cronjob(mutated)),
    ):
        sent = api.create(kind, ns, obj)
        assert sent.status == 201, (kind, sent.body)
    unmutated = core_denials(pod, ns)
    assert unmutated <= {"unmutated-gpu-pod"}
    sent = api.create("Pod", ns, pod)
    assert vap_rules(sent) == unmutated, sent.body


def test_forged_allocation_on_update_follows_the_writers(api: Api, ns: str) -> None:
    tenant, _ = IDENTITIES["tenant"]
    scheduler, _ = IDENTITIES["scheduler"]
    api.grant_pod_patch(ns, tenant, scheduler)
    created = api.create("Pod", ns, _mutated(gpu_pod("victim"), namespace=ns), dry_run=False)
    assert created.status == 201, created.body
    forged = {"metadata": {"annotations": {"hami.io/vgpu-node": "node-1"}}}
    refused = api.patch_pod(ns, "victim", forged, user=tenant)
    assert refused.status == 403 and "[forged-allocation]" in str(refused.body), refused.body
    written = api.patch_pod(ns, "victim", forged, user=scheduler)
    assert written.status == 200, written.body
    for patch in (
        {"metadata": {"annotations": {"hami.io/vgpu-node": "node-2"}}},
        {"metadata": {"annotations": {"hami.io/vgpu-node": None}}},
    ):
        sent = api.patch_pod(ns, "victim", patch, user=tenant)
        assert sent.status == 403 and "[forged-allocation]" in str(sent.body), sent.body
    labelled = api.patch_pod(ns, "victim", {"metadata": {"labels": {"a": "b"}}}, user=tenant)
    assert labelled.status == 200, labelled.body


def warned_rules(api: Api, kind: str, namespace: str, obj: Obj) -> tuple[int, Any, set[str]]:
    """A dry-run create; its status, body and the rule ids of the policies' warnings."""
    status, body, messages = warned(api, kind, namespace, obj)
    return status, body, {m[1 : m.index("]")] for m in messages}


# A Warning header's text (RFC 9110 quoted-string: \ escapes " and \).
_WARNING_TEXT: Final = re.compile(r'299 - "((?:[^"\\]|\\.)*)"')
_POLICY_WARNING: Final = re.compile(
    r"ValidatingAdmissionPolicy '[^']*' with binding [^:]*: (\[.*)$"
)


def warned(api: Api, kind: str, namespace: str, obj: Obj) -> tuple[int, Any, list[str]]:
    """A dry-run create; its status, body and the policies' warning messages
    (``[rule] ...``)."""
    url = api.server + COLLECTIONS[kind].format(ns=namespace) + "?dryRun=All"
    response = api.http.request(
        "POST", url, body=orjson.dumps(obj, default=str), headers=api.headers, timeout=30
    )
    messages = []
    for header in response.headers.getlist("Warning"):
        for text in _WARNING_TEXT.findall(header):
            # urllib3 reads header bytes as Latin-1; the apiserver writes UTF-8.
            unquoted = re.sub(r"\\(.)", r"\1", text).encode("latin-1").decode("utf-8")
            policy = _POLICY_WARNING.search(unquoted)
            if policy:
                messages.append(policy.group(1))
    return response.status, orjson.loads(response.data), messages


_EDITS: Final = (
    "none",
    "none",
    "env-drop",
    "env-value",
    "env-value-from",
    "env-repeat",
    "mount-drop",
    "mount-read-write",
    "volume-drop",
    "scheduler",
    "annotation",
    "host-ipc",
    "container",
    "resource",
    "claim",
    "limit-added",
)
_EDITED_VALUES: Final = ("", "0", "1", "3000m", "30", "force", "true", "/tmp", "x")


@st.composite
def mutation_edits(draw: st.DrawFn, policy: Policy, namespace: str) -> tuple[str, Obj]:
    """A GPU pod or template (well formed, so that the apiserver takes most) as the
    mutation leaves it, then one or two things the mutation set dropped or changed (or
    none): unmutated-gpu-pod's ground."""
    quota = quota_pods().map(lambda pod: ("Pod", pod))
    kind, obj = draw(st.one_of(_scheduled(), quota, objects(hostile=False)))
    obj = _mutation_of(sendable(kind, obj, "e"), policy, namespace=namespace)
    pod = strategies.template_of(obj, kind)
    spec = pod.get("spec") if isinstance(pod, dict) else None
    if not isinstance(spec, dict) or not isinstance(spec.get("containers"), list):
        return kind, obj
    containers = [c for k in ("containers", "initContainers") for c in spec.get(k) or []]
    for _ in range(draw(st.integers(1, 2))):
        edit = draw(st.sampled_from(_EDITS))
        container = draw(st.sampled_from(containers))
        env = container.get("env") or []
        mounts = container.get("volumeMounts") or []
        if edit == "env-drop" and env:
            env.pop(draw(st.integers(0, len(env) - 1)))
        elif edit in ("env-value", "env-value-from", "env-repeat") and env:
            entry = dict(draw(st.sampled_from(env)))
            entry.pop("valueFrom", None)
            if edit == "env-value-from":
                entry.pop("value", None)
                entry["valueFrom"] = {"fieldRef": {"fieldPath": "metadata.name"}}
            else:
                entry["value"] = draw(st.sampled_from(_EDITED_VALUES))
            if edit == "env-repeat":
                env.append(entry)
            else:
                env[env.index(next(e for e in env if e["name"] == entry["name"]))] = entry
        elif edit == "mount-drop" and mounts:
            mounts.pop(draw(st.integers(0, len(mounts) - 1)))
        elif edit == "mount-read-write" and mounts:
            mount = draw(st.sampled_from(mounts))
            mount["readOnly"] = not mount.get("readOnly", False)
        elif edit == "volume-drop" and spec.get("volumes"):
            name = spec["volumes"].pop(draw(st.integers(0, len(spec["volumes"]) - 1)))["name"]
            for each in containers:
                if each.get("volumeMounts"):
                    each["volumeMounts"] = [m for m in each["volumeMounts"] if m["name"] != name]
        elif edit == "scheduler":
            spec["schedulerName"] = draw(st.sampled_from(["default-scheduler", "", "volcano"]))
        elif edit == "annotation" and isinstance(pod.get("metadata"), dict):
            annotations = pod["metadata"].get("annotations") or {}
            annotations.pop("gpushare.io/mode", None)
        elif edit == "host-ipc":
            spec.pop("hostIPC", None)
        elif edit == "container":
            spec["containers"].append({"name": "added", "image": "busybox"})
        elif edit == "limit-added":
            name = draw(
                st.sampled_from(["CUDA_DEVICE_MEMORY_LIMIT_0", "CUDA_DEVICE_MEMORY_LIMIT_1"])
            )
            container.setdefault("env", []).append({"name": name, "value": "3000m"})
        elif edit == "claim":
            # A claim beside the slices (its class is the cluster view's to judge) and a
            # GPU class asked for by its extended resource (gpu-claim without a view).
            spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "gpu"}]
            resources = container.setdefault("resources", {})
            resources["claims"] = [{"name": "gpu"}]
            resources.setdefault("limits", {})[CLASS_RESOURCES[0]] = "1"
        elif edit == "resource":
            limits = (container.get("resources") or {}).get("limits") or {}
            requests = (container.get("resources") or {}).get("requests") or {}
            for name in [n for n in limits if n.startswith(("nvidia.com/", "volcano.sh/"))][:1]:
                value = draw(st.sampled_from(["1", "2", "50", "2000", "0", "150", "3Gi"]))
                limits[name] = value
                if name in requests:
                    requests[name] = value
    return kind, obj


def test_cel_verdicts_equal_the_cores_rule_by_rule(cel_cluster: DevCluster, api: Api) -> None:
    """Differential, exact per rule: in a namespace where the bindings only warn, every
    failing CEL rule shows as a warning; for generated objects, the set of warned rules
    equals the set of rendered rules the core denies."""
    namespace = "cel-warn-only"
    from kubernetes import client

    core: Any = client.CoreV1Api(cel_cluster.api_client())
    core.create_namespace({"metadata": {"name": namespace, "labels": {WARN_LABEL: "1"}}})
    cel_cluster.create_namespace(namespace)
    # The bindings see a new namespace's labels once their informer does: until then
    # nothing warns there.
    probe, rule = BYPASSES["privileged"]
    deadline = time.monotonic() + 30
    while rule not in warned_rules(api, "Pod", namespace, probe)[2]:
        assert time.monotonic() < deadline, "the warn-only bindings never took effect"
        time.sleep(0.2)
    results: list[tuple[str, Obj, int, Any, set[str]]] = []
    messages: list[tuple[str, Any, list[str]]] = []
    counter = itertools.count()

    def record(kind: str, obj: Obj) -> None:
        status, body, texts = warned(api, kind, namespace, obj)
        results.append((kind, obj, status, body, {m[1 : m.index("]")] for m in texts}))
        messages.append((kind, body, texts))

    @settings(DIFFERENTIAL, max_examples=EXAMPLES)
    @given(st.one_of(objects(), attacked_objects()))
    def send(example: tuple[str, Obj]) -> None:
        kind, obj = example
        number = next(counter)
        obj = sendable(kind, obj, f"w{number}")
        # Every other one as the mutation leaves it (by count: the examples stay those
        # the derandomised strategies have always drawn).
        if number % 2:
            obj = _mutation_of(obj, POLICY, namespace=namespace)
        record(kind, obj)

    @settings(DIFFERENTIAL, max_examples=EDIT_EXAMPLES)
    @given(mutation_edits(POLICY, namespace))
    def send_edited(example: tuple[str, Obj]) -> None:
        kind, obj = example
        obj = sendable(kind, obj, f"w{next(counter)}")
        record(kind, obj)

    started = time.monotonic()
    send()
    send_edited()
    mismatches = []
    seen_rules: set[str] = set()
    admitted = 0
    # GPU-sharing pods and templates by whether they carry their mutation (the core's
    # unmutated-gpu-pod verdict): both must be common for the rule's match to mean much.
    sharing = {"mutated": 0, "unmutated": 0}
    for kind, obj, status, body, got in results:
        if status in (400, 422):
            continue
        assert status == 201, body
        admitted += 1
        want = core_denials(body, namespace)
        seen_rules |= got
        if got != want:
            mismatches.append((kind, sorted(got), sorted(want), obj))
        if _shares(kind, body):
            sharing["unmutated" if "unmutated-gpu-pod" in want else "mutated"] += 1
    elapsed = time.monotonic() - started
    print(
        f"CEL rule-by-rule differential: {admitted} admitted of {len(results)} in {elapsed:.1f} s;"
        f" GPU-sharing: {sharing}"
    )
    assert not mismatches, f"{len(mismatches)} differ; first: {mismatches[0]}"
    assert seen_rules == set(RENDERED), seen_rules
    assert admitted >= EXAMPLES // 20
    assert min(sharing.values()) >= EDIT_EXAMPLES // 5, sharing
    # Each container rule's warning names a container and field as one of the core's
    # (redacted) findings of that rule does.
    named: Counter[str] = Counter()
    worded = []
    for kind, body, texts in messages:
        for text in texts:
            matched = _CONTAINER_MESSAGE.match(text)
            if matched is None or not isinstance(body, dict) or "kind" not in body:
                continue
            named[matched.group(1)] += 1
            if message_differs(text, core_messages(body, namespace, matched.group(1), kind)):
                worded.append(
                    (text, sorted(core_messages(body, namespace, matched.group(1), kind)))
                )
    print(f"CEL messages naming a container, by rule: {sorted(named.items())}")
    assert not worded, f"{len(worded)} say other than the core; first: {worded[0]}"
    assert set(named) == set(message_expressions(POLICY)), named


def _shares(kind: str, obj: Any) -> bool:
    """``obj`` (as the apiserver holds it) asks for a GPU slice in some container."""
    from tests.core.strategies import template_of
    from webhook.core.resources import read_pod

    pod = template_of(obj, kind)
    spec = pod.get("spec") if isinstance(pod, dict) else None
    return isinstance(spec, dict) and read_pod(spec, POLICY).sharing


def _modes_namespace(cel_cluster: DevCluster, name: str) -> None:
    from kubernetes import client

    core: Any = client.CoreV1Api(cel_cluster.api_client())
    core.create_namespace({"metadata": {"name": name, "labels": {MODES_LABEL: "1"}}})
    cel_cluster.create_namespace(name)


# Each vendor's sharing resources, MIG's, and one container of each kind mixed.
_ASKS: Final[tuple[Obj, ...]] = (
    {"nvidia.com/gpumem": "3000"},
    {"nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"},
    {"nvidia.com/gpucores": "30"},
    {"aliyun.com/gpu-mem": "3"},
    {"volcano.sh/vgpu-memory": "3000"},
    {"nvidia.com/mig-1g.5gb": "1"},
    # Whole GPUs (another scheduler keeps them), and HAMi's dynamic MIG's ask.
    {"nvidia.com/gpu": "2"},
    {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000"},
    # ... and one the unit contract refuses.
    {"nvidia.com/gpucores": "130"},
)
_AFFINITIES: Final[tuple[Obj | None, ...]] = (
    None,
    {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "gpu", "operator": "NotIn", "values": ["on"]}]},
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                ]
            }
        }
    },
    {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "gpu", "operator": "NotIn", "values": ["on"]}]},
                ]
            }
        }
    },
    {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "gpu", "operator": "In", "values": ["off", "on"]}
                        ]
                    },
                ]
            }
        }
    },
    # A MIG single-strategy pool (wholeGpus.otherPools' glob).
    {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": "nvidia.com/gpu.product",
                                "operator": "In",
                                "values": ["H100", "H100-80GB-HBM3-MIG-3g.40gb"],
                            }
                        ]
                    },
                ]
            }
        }
    },
)
_MODE_ANNOTATIONS: Final[tuple[Obj, ...]] = (
    {},
    {"gpushare.io/mode": " MPS"},
    {"gpushare.io/mode": "vgpu"},
    {"gpushare.io/mode": "bogus", "nvidia.com/vgpu-mode": "mps"},
    {"nvidia.com/vgpu-mode": "hami-core"},
    {"gpushare.io/mode": "mig"},
    {"nvidia.com/vgpu-mode": "mig"},
    {"volcano.sh/vgpu-mode": " MIG", "nvidia.com/vgpu-mode": "mps"},
)


@st.composite
def _scheduled(draw: st.DrawFn) -> tuple[str, Obj]:
    """A Pod or Deployment the apiserver admits, choosing its mode by any means and
    naming any scheduler (or none): where per-mode schedulers decide."""
    asks = draw(st.lists(st.sampled_from(_ASKS), min_size=1, max_size=2))
    containers = [
        {"name": f"c{i}", "image": "busybox", "resources": {"limits": dict(limits)}}
        for i, limits in enumerate(asks)
    ]
    pod = _pod("p", *containers)
    annotations = draw(st.sampled_from(_MODE_ANNOTATIONS))
    if annotations:
        pod["metadata"]["annotations"] = dict(annotations)
    selector = draw(st.sampled_from((None, *NODE_SELECTORS)))
    if selector is not None:
        pod["spec"]["nodeSelector"] = dict(selector)
    scheduler = draw(st.sampled_from((None, *SCHEDULERS)))
    if scheduler is not None:
        pod["spec"]["schedulerName"] = scheduler
    affinity = draw(st.sampled_from(_AFFINITIES))
    if affinity is not None:
        pod["spec"]["affinity"] = copy.deepcopy(affinity)
    return ("Pod", pod) if draw(st.booleans()) else ("Deployment", _deployment(pod))


def test_cel_verdicts_equal_the_cores_with_per_mode_schedulers(
    cel_cluster: DevCluster, api: Api
) -> None:
    """The rule-by-rule differential under a policy with per-mode and per-resource
    schedulers, in a namespace that chooses mps and in one that does not: the CEL policies
    choose the pod's mode (annotations, node selectors, MIG resources, namespace) and then
    its scheduler as the core does."""
    # MODES_POLICY maps the namespace mps-team to mode mps.
    namespaces = ("cel-modes", "mps-team")
    for name in namespaces:
        _modes_namespace(cel_cluster, name)
    # The policies load asynchronously: wait until each rule warns on its bypass.
    pending = set(RENDERED)
    deadline = time.monotonic() + 30
    while pending:
        assert time.monotonic() < deadline, f"never took effect: {sorted(pending)}"
        for pod, _ in BYPASSES.values():
            pending -= warned_rules(api, "Pod", namespaces[0], pod)[2]
    results: list[tuple[str, str, Obj, int, Any, set[str]]] = []
    counter = itertools.count()

    quota = quota_pods().map(lambda pod: ("Pod", pod))
    mixed = st.one_of(_scheduled(), quota, objects(), attacked_objects())

    @settings(DIFFERENTIAL, max_examples=MODES_EXAMPLES)
    @given(mixed, st.sampled_from(namespaces))
    def send(example: tuple[str, Obj], namespace: str) -> None:
        kind, obj = example
        number = next(counter)
        obj = sendable(kind, obj, f"m{number}")
        if number % 2:
            obj = _mutation_of(obj, MODES_POLICY, namespace=namespace)
        results.append((kind, namespace, obj, *warned_rules(api, kind, namespace, obj)))

    send()
    mismatches = []
    # Objects whose scheduler-bypass verdict the mode entries change: the entries are tried.
    moved = 0
    admitted = 0
    seen: dict[str, int] = {}
    for kind, namespace, obj, status, body, got in results:
        if status in (400, 422):
            continue
        assert status == 201, body
        admitted += 1
        want = core_denials(body, namespace, MODES_POLICY)
        for rule in want:
            seen[rule] = seen.get(rule, 0) + 1
        if got != want:
            mismatches.append((kind, namespace, sorted(got), sorted(want), obj))
        default = core_denials(body, namespace)
        moved += ("scheduler-bypass" in want) != ("scheduler-bypass" in default)
    print(f"CEL per-mode schedulers differential: {admitted} admitted, {moved} moved, {seen}")
    assert not mismatches, f"{len(mismatches)} differ: {mismatches}"
    assert admitted >= MODES_EXAMPLES // 20
    assert moved >= MODES_EXAMPLES // 100, moved
    # The policy's maxima and its per-mode namespaces are reached too.
    for rule in ("gpu-quota", "mode-conflict", "invalid-gpu-request", "unmutated-gpu-pod"):
        assert seen.get(rule, 0) >= MODES_EXAMPLES // 100, (rule, seen)


def test_cel_verdicts_equal_the_cores(api: Api, ns: str) -> None:
    """Differential: for generated objects, the rules the CEL policies refuse equal the
    CEL-rendered rules the core denies. The apiserver names only the first validation that
    fails, so per object: refused exactly when the core denies a rendered rule, and by one
    of the rules the core denies."""
    sent: list[Sent] = []
    counter = itertools.count()

    @settings(DIFFERENTIAL, max_examples=DENY_EXAMPLES)
    @given(st.one_of(objects(), attacked_objects()))
    def send(example: tuple[str, Obj]) -> None:
        kind, obj = example
        number = next(counter)
        obj = sendable(kind, obj, f"x{number}")
        if number % 2:
            obj = _mutation_of(obj, POLICY, namespace=ns)
        sent.append(api.create(kind, ns, obj))

    started = time.monotonic()
    send()
    mismatches = []
    counts = {"refused": 0, "admitted": 0, "invalid": 0}
    refused_by: set[str] = set()
    for item in sent:
        if item.status in (400, 422):
            counts["invalid"] += 1
            continue
        assert item.status in (201, 403), (item.status, item.body)
        counts["refused" if item.status == 403 else "admitted"] += 1
        # What the policies saw: the object as decoded and defaulted (the dry-run answer).
        seen = item.body if item.status == 201 else item.obj
        want = core_denials(seen, ns)
        got = vap_rules(item)
        # The apiserver names the first failing validation only: it must be one the core
        # denies, and the CEL policies refuse exactly when the core denies a CEL rule.
        if len(got) > 1 or not got <= want or bool(got) != bool(want):
            mismatches.append((item.kind, sorted(got), sorted(want), item.obj))
        refused_by.update(got)
    print(
        f"CEL differential over {len(sent)} objects in {time.monotonic() - started:.1f} s: {counts}"
    )
    assert not mismatches, f"{len(mismatches)} differ; first: {mismatches[0]}"
    assert counts["refused"] >= DENY_EXAMPLES // 50, counts
    assert counts["admitted"] >= DENY_EXAMPLES // 20, counts
    print(f"refused by: {sorted(refused_by)}")


def _stored_pod(api: Api, namespace: str, name: str, base: str) -> Obj:
    """``stored_pod``, a GPU pod as the mutation leaves it: nothing here mutates it."""
    if base != "gpu":
        return stored_pod(api, namespace, name, base)
    created = api.create(
        "Pod", namespace, _mutated(gpu_pod(name), namespace=namespace), dry_run=False
    )
    assert created.status == 201, created.body
    stored: Obj = created.body
    return stored


class _Recording:
    """An HTTP pool that keeps the last response, for its Warning headers."""

    def __init__(self, http: Any) -> None:
        self.http = http
        self.last: Any = None

    def request(self, *args: Any, **kwargs: Any) -> Any:
        self.last = self.http.request(*args, **kwargs)
        return self.last


def test_cel_update_verdicts_equal_the_cores_rule_by_rule(cel_cluster: DevCluster) -> None:
    """Differential for pod UPDATEs (annotations added, changed or removed, labels,
    `kubectl debug` containers) by the tenant, the scheduler and look-alikes, in the
    warn-only namespace: the rules warned equal the rendered rules the core denies."""
    from kubernetes import client

    namespace = "cel-warn-only-updates"
    core: Any = client.CoreV1Api(cel_cluster.api_client())
    core.create_namespace({"metadata": {"name": namespace, "labels": {WARN_LABEL: "1"}}})
    cel_cluster.create_namespace(namespace)
    api = Api(cel_cluster)
    recording = _Recording(api.http)
    api.http = recording  # type: ignore[assignment]
    api.grant_pod_patch(namespace, *(user for user, _ in IDENTITIES.values()))
    sent: list[tuple[Sent, set[str], Obj, str, tuple[str, ...]]] = []
    counter = itertools.count()

    @settings(DIFFERENTIAL, max_examples=UPDATE_EXAMPLES)
    @given(
        st.sampled_from(["plain", "allocated", "gpu"]),
        pod_updates(),
        st.sampled_from(sorted(IDENTITIES)),
    )
    def send(base: str, edits: list[tuple[str, Any, Any]], identity: str) -> None:
        old = _stored_pod(api, namespace, f"u{next(counter)}", base)
        debug = [e for e in edits if e[0] == "debug"]
        new = apply_update(old, debug or edits)
        user, groups = IDENTITIES[identity]
        answer = api.update_pod(namespace, old, new, user=user)
        warnings = " ".join(recording.last.headers.getlist("Warning"))
        got = set(_RULE_IN_WARNING.findall(warnings))
        sent.append((answer, got, old, user, groups))

    send()
    mismatches = []
    warned: set[str] = set()
    for answer, got, old, user, groups in sent:
        if answer.status in (400, 422):
            continue
        assert answer.status == 200, answer.body
        request = Request(
            kind="Pod", operation="UPDATE", namespace=namespace, username=user, groups=groups
        )
        decision = decide(
            judged_by_cel(answer.body),
            request,
            POLICY,
            phase="validate",
            old=judged_by_cel(old),
        )
        want = {v["rule"] for v in decision.denials} & set(RULES)
        warned |= got
        if got != want:
            mismatches.append((user, sorted(got), sorted(want), answer.obj, old["metadata"]))
    assert not mismatches, f"{len(mismatches)} differ; first: {mismatches[0]}"
    assert "forged-allocation" in warned, warned
    recording.http.clear()


def test_policies_of_a_policy_with_exemptions_and_globs_compile(api: Api) -> None:
    """The apiserver compiles every expression of a policy with exemptions, writer
    globs and a mode of its own (a server-side dry-run create checks the CEL)."""
    from tests.render.test_validating import CUSTOM

    for obj in validating_policies(CUSTOM):
        obj["metadata"]["name"] += "-custom"
        if obj["kind"] == "ValidatingAdmissionPolicyBinding":
            obj["spec"]["policyName"] += "-custom"
        collection = (
            "validatingadmissionpolicies"
            if obj["kind"] == "ValidatingAdmissionPolicy"
            else "validatingadmissionpolicybindings"
        )
        url = f"{api.server}/apis/admissionregistration.k8s.io/v1/{collection}?dryRun=All"
        response = api.http.request("POST", url, body=orjson.dumps(obj), headers=api.headers)
        assert response.status == 201, response.data


def test_large_pods_stay_within_the_cel_cost_limits(api: Api, ns: str) -> None:
    """A runtime cost limit exceeded is an error, and failurePolicy Fail refuses: a pod
    with 60 containers of 200 env entries each and 200 annotations is still judged."""
    containers = [
        _c(f"c{i}", env=[{"name": f"E{j}", "value": "v"} for j in range(200)]) for i in range(60)
    ]
    pod = _pod("big", *containers)
    pod["metadata"]["annotations"] = {f"example.com/a{k}": "v" for k in range(200)}
    # Mutated: unmutated-gpu-pod then reads every entry the mutation set in each container.
    pod = _mutated(pod, namespace=ns)
    containers = pod["spec"]["containers"]
    admitted = api.create("Pod", ns, pod)
    assert admitted.status == 201, admitted.body
    containers[-1]["securityContext"] = {"privileged": True}
    refused = api.create("Pod", ns, pod)
    assert vap_rules(refused) == {"privileged-gpu"}, refused.body


# -- host-device-access under the example policies ------------------------------------

# The policies host-device-access is compared under besides the default: an allow list
# with the preload as a file (strict), and odd paths of every kind (HOST_PATHS).
HOST_POLICIES: Final[dict[str, Policy]] = {
    "strict": load_policy(ROOT / "policies" / "examples" / "strict.yaml"),
    "host-paths": HOST_PATHS,
    "default": POLICY,
}
HOST_LABEL: Final = "gpushare.io/cel-host-paths"
HOST_EXAMPLES: Final = 400
_POLICY_IN_WARNING: Final = re.compile(
    r"ValidatingAdmissionPolicy '([^']*)' with binding [^:]*: \[([a-z-]+)\]"
)
# Host paths a tenant tries: devices and what reaches them, spelled the ways the
# apiserver keeps (it refuses ".." only), the GPU runtime's configuration, and paths
# near the allowed ones.
_HOST_PATHS: Final = (
    "/dev/nvidia0",
    "//dev//nvidia0",
    "/dev/./nvidia0/",
    "dev/nvidia0",
    "/dev/char/195:0",
    "/dev",
    "/var/lib/kubelet/pods",
    "/var/lib/kubelet/device-plugins/",
    "/proc",
    "/proc/1/root",
    "/run/containerd/containerd.sock",
    "/var/run//docker.sock",
    "/run/nvidia/mps",
    "/usr/local/vgpu",
    "/usr/local/vgpu/libvgpu.so",
    "/tmp/vgpulock",
    "/tmp//vgpulock/.",
    "/tmp/nvidia-mps/",
    "/tmp",
    "/etc/cdi",
    "/etc/nvidia-container-runtime/config.toml",
    "/etc",
    "/data",
    "/data/",
    "/data/models",
    "//data/./models",
    "/datax",
    "/mnt/datasets/a",
    "/mnt",
    "/srv/gpu/secrets/x",
    "/srv/gpu",
    "/srv/other",
    "/home/shared/",
    "/opt/vgpu/lib",
    "/var/tmp/vgpulock",
    "/run/mps-pipe/x",
    "/var/lib/kubelet-backup",
    "/opt/models",
    # Driver roots (the default's GKE one, HOST_PATHS' own), above and beside them.
    "/home/kubernetes/bin/nvidia/lib64",
    "/home/kubernetes",
    "/home/kubernetes/bin/other",
    "/opt/drv/nvidia/x",
)
_CHANGES: Final = (
    "none",
    "none",
    "writable",
    "type",
    "spelled",
    "renamed",
    "mode",
    "debug",
    "hostPath",
    "hostPath",
    "cdi",
    "device-request",
)


def _injected_volumes(spec: Obj) -> list[Obj]:
    return [
        v for v in spec.get("volumes", []) if "hostPath" in v and v["name"].startswith("gpushare-")
    ]


@st.composite
def host_access_objects(draw: st.DrawFn, policy: Policy, namespace: str) -> tuple[str, Obj]:
    """A GPU-sharing pod (vgpu or mps) or a plain one as the mutation leaves it under
    ``policy``, then one thing changed the way a tenant would: an injected mount made
    writable, an injected volume retyped, respelled or renamed, the mode switched, a
    debug container, a host path, a CDI annotation, a device-request mount."""
    mode = draw(st.sampled_from(["vgpu", "mps", "plain"]))
    limits = {"nvidia.com/gpumem": "3000"} if mode != "plain" else {}
    container: Obj = {"name": "app", "image": "busybox"}
    if limits:
        container["resources"] = {"limits": limits}
    pod: Obj = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "h"}}
    pod["spec"] = {"containers": [container]}
    if mode == "mps":
        pod["metadata"]["annotations"] = {"gpushare.io/mode": "mps"}
    pod = _mutated(pod, policy, namespace=namespace)
    spec = pod["spec"]
    injected = _injected_volumes(spec)
    for _ in range(draw(st.sampled_from([1, 1, 2]))):
        change = draw(st.sampled_from(_CHANGES))
        if change == "writable":
            mounts = [m for m in spec["containers"][0].get("volumeMounts", []) if m.get("readOnly")]
            if mounts:
                mount = draw(st.sampled_from(mounts))
                if draw(st.booleans()):
                    del mount["readOnly"]
                else:
                    mount["readOnly"] = False
        elif change in ("type", "spelled", "renamed") and injected:
            volume = draw(st.sampled_from(injected))
            host = volume["hostPath"]
            if change == "type":
                host["type"] = draw(st.sampled_from(["", "Directory", "File"]))
            elif change == "spelled":
                host["path"] = (
                    draw(st.sampled_from(["/", "//", "./"]))
                    + host["path"]
                    + draw(st.sampled_from(["", "/", "/."]))
                )
            else:
                for mount in spec["containers"][0].get("volumeMounts", []):
                    if mount["name"] == volume["name"]:
                        mount["name"] = "renamed"
                volume["name"] = "renamed"
        elif change == "mode":
            pod["metadata"].setdefault("annotations", {})["gpushare.io/mode"] = draw(
                st.sampled_from(["vgpu", "mps", "mig", "none"])
            )
        elif change == "debug":
            # As a container: the apiserver refuses ephemeral containers on create.
            debugger = draw(strategies.debuggers())
            strategies._add_container(spec, "containers", debugger)
            for mount in debugger.get("volumeMounts", []):
                strategies._ensure_volume(spec, {"name": mount["name"], "emptyDir": {}})
        elif change == "hostPath":
            name = f"host{len(spec.get('volumes', []))}"
            path = draw(st.sampled_from(_HOST_PATHS))
            spec.setdefault("volumes", []).append({"name": name, "hostPath": {"path": path}})
            if draw(st.booleans()):
                mount = {"name": name, "mountPath": f"/mnt/{name}"}
                if draw(st.booleans()):
                    mount["readOnly"] = draw(st.booleans())
                spec["containers"][0].setdefault("volumeMounts", []).append(mount)
        elif change == "cdi":
            key = draw(st.sampled_from(["cdi.k8s.io/gpu", "nvidia.cdi.k8s.io/x", "cdi.k8s.io"]))
            value = draw(st.sampled_from(["nvidia.com/gpu=all", "example.com/fpga=0", ""]))
            pod["metadata"].setdefault("annotations", {})[key] = value
        elif change == "device-request":
            strategies._ensure_volume(spec, {"name": "req", "emptyDir": {}})
            mount = {"name": "req", "mountPath": draw(strategies.device_request_paths())}
            spec["containers"][0].setdefault("volumeMounts", []).append(mount)
    kind = draw(st.sampled_from(["Pod", "Pod", "Deployment", "Job"]))
    return kind, strategies.wrap(pod, kind)


def _host_policies() -> list[Obj]:
    """host-device-access of each HOST_POLICIES policy (its only validation kept) renamed
    apart, warning only in namespaces labelled with its name."""
    objects = []
    rule = "host-device-access"
    for key, policy in HOST_POLICIES.items():
        rendered = validating_policies(policy)
        (holder,) = [
            o["metadata"]["name"]
            for o in rendered
            if o["kind"] == "ValidatingAdmissionPolicy"
            and any(v["message"].startswith(f"[{rule}] ") for v in o["spec"]["validations"])
        ]
        for obj in rendered:
            if obj["metadata"]["name"] != holder:
                continue
            obj["metadata"]["name"] = f"gpushare-{rule}-{key}"
            if obj["kind"] == "ValidatingAdmissionPolicy":
                obj["spec"]["validations"] = [
                    v for v in obj["spec"]["validations"] if v["message"].startswith(f"[{rule}] ")
                ]
            else:
                obj["spec"]["policyName"] = f"gpushare-{rule}-{key}"
                obj["spec"]["validationActions"] = ["Warn"]
                selector = obj["spec"]["matchResources"]["namespaceSelector"]
                selector["matchExpressions"].append(
                    {"key": HOST_LABEL, "operator": "In", "values": [key]}
                )
            objects.append(obj)
    return objects


def _host_warnings(api: Api, kind: str, namespace: str, obj: Obj) -> tuple[int, Any, set[str]]:
    """A dry-run create; its status, body and the HOST_POLICIES keys whose policy warned."""
    url = api.server + COLLECTIONS[kind].format(ns=namespace) + "?dryRun=All"
    response = api.http.request(
        "POST", url, body=orjson.dumps(obj, default=str), headers=api.headers, timeout=30
    )
    warnings = " ".join(response.headers.getlist("Warning"))
    prefix = "gpushare-host-device-access-"
    keys = {name.removeprefix(prefix) for name, _ in _POLICY_IN_WARNING.findall(warnings)}
    return response.status, orjson.loads(response.data), keys & set(HOST_POLICIES)


def test_host_device_access_equals_the_core_under_each_policy(
    cel_cluster: DevCluster, api: Api
) -> None:
    """Differential for host-device-access under the default policy, strict (allow list,
    preload file) and HOST_PATHS (odd paths): in a namespace per policy, where only that
    policy's host-device-access warns, it warns exactly when the core denies the rule."""
    from kubernetes import client

    core: Any = client.CoreV1Api(cel_cluster.api_client())
    for key in HOST_POLICIES:
        # WARN_LABEL: the default policy's own bindings only warn here, and are ignored.
        labels = {HOST_LABEL: key, WARN_LABEL: "1"}
        core.create_namespace({"metadata": {"name": f"cel-host-{key}", "labels": labels}})
        cel_cluster.create_namespace(f"cel-host-{key}")
    probe = BYPASSES["host-path-spelled"][0]
    deadline = time.monotonic() + 30
    for key in HOST_POLICIES:
        while key not in _host_warnings(api, "Pod", f"cel-host-{key}", probe)[2]:
            assert time.monotonic() < deadline, f"host-device-access of {key} never took effect"
            time.sleep(0.2)
    results: list[tuple[str, str, Obj, int, Any, set[str]]] = []
    counter = itertools.count()

    @settings(DIFFERENTIAL, max_examples=HOST_EXAMPLES)
    @given(st.data())
    def send(data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(HOST_POLICIES)))
        kind, obj = data.draw(host_access_objects(HOST_POLICIES[key], f"cel-host-{key}"))
        obj = sendable(kind, obj, f"h{next(counter)}")
        results.append((key, kind, obj, *_host_warnings(api, kind, f"cel-host-{key}", obj)))

    send()
    mismatches = []
    counts = {"refused": 0, "admitted": 0}
    for key, kind, obj, status, body, got in results:
        if status in (400, 422):
            continue
        assert status == 201, body
        want = "host-device-access" in core_denials(body, f"cel-host-{key}", HOST_POLICIES[key])
        counts["refused" if want else "admitted"] += 1
        if (key in got) != want:
            mismatches.append((key, kind, key in got, want, obj))
    print(f"host-device-access differential over {len(results)} objects: {counts}")
    assert not mismatches, f"{len(mismatches)} differ; first: {mismatches[0]}"
    assert min(counts.values()) >= HOST_EXAMPLES // 10, counts


@pytest.mark.parametrize(
    "path",
    [
        "/x/../var/run/nvidia-container-devices/all",
        "/var/run/../run/nvidia-container-devices/all",
        "/var/run/nvidia-container-devices/x/../all",
        "/tmp/../etc/ld.so.preload",
        "/data/vgpu/../x",
    ],
)
def test_mount_paths_with_backsteps_are_refused_without_the_webhook(
    api: Api, ns: str, path: str
) -> None:
    """A mountPath with ".." (the apiserver refuses it in a hostPath, not in a mountPath)
    beside anything the GPU stack reads is refused by the CEL policies as by the core,
    wherever it leads: CEL cannot resolve it, and on 1.36+ no webhook sees a plain pod,
    which the NVIDIA runtime would give every card for a device-request mount."""
    pod = _pod(
        "p",
        _c(gpu=False, volumeMounts=[{"name": "r", "mountPath": path}]),
        volumes=[{"name": "r", "emptyDir": {}}],
    )
    entry = review_object(pod, POLICY, namespace=ns)
    assert {v["rule"] for v in entry["violations"]} == {"host-device-access"}
    sent = api.create("Pod", ns, pod)
    assert sent.status == 403 and vap_rules(sent) == {"host-device-access"}, sent.body
    harmless = _pod(
        "p",
        _c(gpu=False, volumeMounts=[{"name": "r", "mountPath": "/data/x/../models"}]),
        volumes=[{"name": "r", "emptyDir": {}}],
    )
    assert api.create("Pod", ns, harmless).status == 201


# The values of HAMi-core's region and priority, spelt as tenants would: each judged by
# the CEL policies as the core judges it (injection.region_readable, resources.PRIORITIES).
_REGIONS: Final = (
    "/usr/local/vgpu/a.cache",
    "/usr/local/vgpu//./b.cache",
    "//usr/local/vgpu/c.cache",
    "/usr/local/vgpu/cache/c.cache",
    "/usr/local/vgpu/../vgpulock/d.cache",
    "/usr/local/vgpu/x/../d.cache",
    "/usr/local/vgpu/libvgpu.so.cache",
    "/usr/local/vgpu/region",
    "/usr/local/vgpu/.cache",
    "/usr/local/vgpu/",
    "/tmp/vgpulock/e.cache",
    "usr/local/vgpu/f.cache",
    "",
    "$(R)",
)
_PRIORITIES: Final = ("0", "1", " 1", "01", "-0", "2", "-1", "1x", "", "$(P)")


@pytest.mark.parametrize(
    ("name", "value"),
    [("CUDA_DEVICE_MEMORY_SHARED_CACHE", v) for v in _REGIONS]
    + [("CUDA_TASK_PRIORITY", v) for v in _PRIORITIES]
    + [("nvidia.com/priority", v) for v in ("0", "1", "2", "-1", "5", "999999999")],
)
def test_region_and_priority_are_judged_as_the_core_judges_them(
    api: Api, ns: str, name: str, value: str
) -> None:
    if name.startswith("nvidia.com/"):
        pod = _pod("p", _asks({"nvidia.com/gpumem": "3000", name: value}))
    else:
        pod = _pod("p", _c(env=_env((name, value))))
    for container in ("main", "sidecar"):
        obj = pod if container == "main" else _with_container(pod, _c("side", gpu=False))
        if container == "sidecar" and not name.startswith("nvidia.com/"):
            obj = _pod("p", _c(), _c("side", gpu=False, env=_env((name, value))))
        mutated = _mutation_of(obj, POLICY, namespace=ns)
        want = core_denials(mutated, ns)
        sent = api.create("Pod", ns, mutated)
        if sent.status == 422:
            # The apiserver's own validation (a negative quantity) refuses it first.
            assert want, (name, value)
            continue
        got = vap_rules(sent)
        # A denial names the first refusing policy: compare that one.
        assert got <= want and bool(got) == bool(want), (name, value, container, got, want)


# ------------------------------------------------------------------ exceptions

EXCEPT_LABEL: Final = "gpushare.io/cel-exceptions"


def _exceptions_policy() -> Policy:
    from webhook.policies import parse_policy

    return parse_policy(
        """
apiVersion: gpushare.io/v1alpha1
kind: GPUSharePolicy
spec:
  exceptions:
    - name: trainer
      rules: [privileged-gpu]
      namespaces: [cel-except-a]
      reason: the trainer's device nodes
      owner: ml-platform
      expires: 2999-12-31
    - name: lapsed
      rules: [host-device-access]
      namespaces: [cel-except-a]
      reason: ended
      owner: ml-platform
      expires: 2001-01-01
    - name: ci-bot
      rules: [raw-visible-devices]
      users: [ci-bot]
      namespaces: [cel-except-a, cel-except-b]
      reason: the CI's GPU smoke test
      owner: platform
"""
    )


def test_exceptions_take_their_rule_off_as_the_core_does(cel_cluster: DevCluster, api: Api) -> None:
    """A policy's exceptions, rendered on today, refuse and admit as the core does on
    today: in their namespaces, for their requester, not past their last day (the
    default policy's bindings only warn in these namespaces)."""
    from kubernetes import client

    policy = _exceptions_policy()
    today = time.strftime("%Y-%m-%d", time.gmtime())
    objects = validating_policies(policy, today=today)
    for obj in objects:
        obj["metadata"]["name"] += "-except"
        if obj["kind"] == "ValidatingAdmissionPolicyBinding":
            obj["spec"]["policyName"] += "-except"
            selector = obj["spec"]["matchResources"]["namespaceSelector"]
            selector["matchExpressions"].append({"key": EXCEPT_LABEL, "operator": "Exists"})
    cel_cluster.register_cel_policies(objects)
    core: Any = client.CoreV1Api(cel_cluster.api_client())
    for namespace in ("cel-except-a", "cel-except-b"):
        labels = {EXCEPT_LABEL: "1", WARN_LABEL: "1"}
        core.create_namespace({"metadata": {"name": namespace, "labels": labels}})
        cel_cluster.create_namespace(namespace)
        api.grant(
            namespace,
            "pod-writer",
            [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}],
            "ci-bot",
            "alice",
        )
    privileged = _c("main", gpu=True)
    privileged["securityContext"] = {"privileged": True}
    raw = _c("smoke", gpu=False, env=_env(("NVIDIA_VISIBLE_DEVICES", "all")))
    host = _c("main", gpu=True)
    host["volumeMounts"] = [{"name": "caps", "mountPath": "/usr/local/vgpu"}]
    cases = {
        "privileged": _pod("p", privileged),
        "raw": _pod("r", raw),
        "host": _pod("h", host, volumes=[{"name": "caps", "emptyDir": {}}]),
    }
    # The policies load asynchronously: wait until the raw pod is refused where no
    # exception holds.
    deadline = time.monotonic() + 30
    while vap_rules(api.create("Pod", "cel-except-b", cases["raw"], user="alice")) != {
        "raw-visible-devices"
    }:
        assert time.monotonic() < deadline, "the exceptions' policies never took effect"
        time.sleep(0.2)
    verdicts = Counter[str]()
    for (name, pod), namespace, user in itertools.product(
        cases.items(), ("cel-except-a", "cel-except-b"), ("ci-bot", "alice")
    ):
        # Mutated as the webhook would for this requester on this day.
        mutated = review_object(pod, policy, namespace=namespace, username=user, today=today)[
            "object"
        ]
        want = core_denials(mutated, namespace, policy, username=user, today=today)
        sent = api.create("Pod", namespace, mutated, user=user)
        got = vap_rules(sent)
        assert got <= want and (sent.status == 201) == (not want), (
            name,
            namespace,
            user,
            want,
            sent.status,
            sent.body,
        )
        verdicts["refused" if want else "admitted"] += 1
    # Each exception is seen both ways: taken off where it holds, kept elsewhere.
    assert verdicts["refused"] >= 4 and verdicts["admitted"] >= 3, verdicts
