"""hack/dev-cluster as a user runs it: ready line, a working kubeconfig, clean stop."""

from __future__ import annotations

import json
import re
import select
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Final

import pytest

from tests.paths import ROOT

pytestmark = pytest.mark.e2e

DOCS_KUBECONFIG = "/tmp/gpushare-dev.kubeconfig"


def docs_example() -> list[str]:
    """docs/development.md's kubectl lines against the dev cluster, in order."""
    text = (ROOT / "docs" / "development.md").read_text()
    prefix = f"    kubectl --kubeconfig {DOCS_KUBECONFIG} "
    return [line.strip() for line in text.splitlines() if line.startswith(prefix)]


def wait_until_gone(core: Any, namespace: str) -> None:
    from kubernetes import client

    deadline = time.monotonic() + 30
    while True:
        try:
            core.read_namespace(namespace)
        except client.ApiException as exc:
            if exc.status == 404:
                return
            raise
        assert time.monotonic() < deadline, f"Namespace {namespace} still there"
        time.sleep(0.5)


def ready_line(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    deadline = time.monotonic() + 120
    line = ""
    while "ready" not in line:
        assert time.monotonic() < deadline, "no ready line"
        readable, _, _ = select.select([process.stdout], [], [], 1)
        if readable:
            line = process.stdout.readline()
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
    return line


def test_dev_cluster_serves_until_sigterm(bin_dir: Path, tmp_path: Path) -> None:
    from kubernetes import client, config

    kubeconfig = tmp_path / "kubeconfig"
    process = subprocess.Popen(
        [
            str(ROOT / "hack" / "dev-cluster"),
            "--kubeconfig",
            str(kubeconfig),
            "--bin-dir",
            str(bin_dir),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
    )
    try:
        line = ready_line(process)
        workdir = Path(re.search(r"policy (\S+)/policy\.yaml", line).group(1))  # type: ignore[union-attr]
        assert workdir.exists()
        api = config.new_client_from_config(str(kubeconfig))  # type: ignore[no-untyped-call]  # untyped upstream
        core: Any = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": "dev"}})
        core.create_namespaced_service_account("dev", {"metadata": {"name": "default"}})
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p"},
            "spec": {
                "containers": [
                    {
                        "name": "c",
                        "image": "x",
                        "resources": {"limits": {"nvidia.com/gpumem": "2000"}},
                    }
                ]
            },
        }
        created = core.create_namespaced_pod("dev", pod)
        assert created.spec.scheduler_name == "hami-scheduler"
        # The docs' example, as written (bar the kubeconfig's path and kubectl's).
        for command in docs_example():
            argv = shlex.split(command.replace(DOCS_KUBECONFIG, str(kubeconfig)))
            argv[0] = str(bin_dir / "kubectl")
            done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
            assert done.returncode == 0, (command, done.stderr)
        assert "CUDA_DEVICE_MEMORY_LIMIT_0" in done.stdout, "the example pod is mutated"
        # The install's CEL policies are there too.
        admission: Any = client.AdmissionregistrationV1Api(api)
        assert {p.metadata.name for p in admission.list_validating_admission_policy().items} >= {
            "gpushare-deny"
        }
        # A deleted Namespace goes, as the namespace controller would make it go.
        core.delete_namespace("dev")
        wait_until_gone(core, "dev")
        api.close()
        found = re.search(r"audit (\S+) and apiserver audit (\S+) \(kept after exit\)", line)
        assert found is not None, line
        kept = [Path(found.group(1)), Path(found.group(2))]
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
        assert not workdir.exists()
        for log in kept:
            assert log.read_text().strip(), f"{log} is kept after exit"
            log.unlink()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


def test_on_1_36_the_dev_cluster_holds_without_the_webhook(bin_dir: Path, tmp_path: Path) -> None:
    """The install the dev cluster runs on 1.36 (what hack/dev-cluster starts): with the
    webhook process killed, a GPU pod is still admitted with its slice, and a privileged
    GPU pod is still refused, both by the apiserver itself."""
    from kubernetes import client

    from webhook.dev.cluster import running
    from webhook.install.mode import APISERVER

    policy = tmp_path / "policy.yaml"
    policy.write_text((ROOT / "webhook" / "policies" / "default.yaml").read_text())
    with running(
        bin_dir=bin_dir, policy=policy, workdir=tmp_path, mode=None, cel_policies=True
    ) as cluster:
        assert cluster.mode == APISERVER, "kube-apiserver 1.36+ serves MutatingAdmissionPolicy v1"
        admission: Any = client.AdmissionregistrationV1Api(cluster.api_client())
        hooks = [
            h
            for c in (
                admission.list_mutating_webhook_configuration().items
                + admission.list_validating_webhook_configuration().items
            )
            for h in c.webhooks
        ]
        assert hooks and all(h.failure_policy == "Ignore" for h in hooks)
        assert {h.match_conditions[0].name for h in hooks} == {"gpushare.io/cluster-view"}
        assert cluster.webhook is not None and cluster.webhook.process is not None
        cluster.webhook.process.popen.kill()
        cluster.webhook.process.popen.wait()

        cluster.create_namespace("dev")
        core: Any = client.CoreV1Api(cluster.api_client())

        def gpu_pod(name: str, **security: Any) -> dict[str, Any]:
            container: dict[str, Any] = {
                "name": "c",
                "image": "x",
                "resources": {"limits": {"nvidia.com/gpumem": "2000"}},
            }
            if security:
                container["securityContext"] = security
            return {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name},
                "spec": {"containers": [container]},
            }

        created = core.create_namespaced_pod("dev", gpu_pod("capped"))
        assert created.spec.scheduler_name == "hami-scheduler"
        (container,) = created.spec.containers
        env = {e.name: e.value for e in container.env}
        assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2000m"
        assert env["LD_PRELOAD"] == "/usr/local/vgpu/libvgpu.so"
        # The implied count; the apiserver writes 2000 as its canonical 2k.
        assert container.resources.limits == {"nvidia.com/gpumem": "2k", "nvidia.com/gpu": "1"}

        with pytest.raises(client.ApiException) as refused:
            core.create_namespaced_pod("dev", gpu_pod("privileged", privileged=True))
        assert refused.value.status in (400, 403, 422)
        assert "[privileged-gpu]" in str(refused.value.body)


def _env(**pairs: str) -> list[dict[str, Any]]:
    return [{"name": k, "value": v} for k, v in pairs.items()]


def _container(name: str, limits: dict[str, str], env: list[Any], **extra: Any) -> Any:
    return {"name": name, "image": "x", "resources": {"limits": limits}, "env": env, **extra}


def _pod(name: str, *containers: Any, **spec: Any) -> dict[str, Any]:
    annotations = spec.pop("annotations", {})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"containers": list(containers), **spec},
    }


# Every kind of value the mutation replaces (mutation.Patch.overwritten): memory and SM
# limits, a stray per-GPU limit, in an init container too; the switches and the task
# priority; an injected volume and mount of the user's own; the MPS limits, from
# valueFrom too.
_SLICE: Final = {"nvidia.com/gpumem": "2000", "nvidia.com/gpucores": "30"}
OVERRIDDEN: Final = {
    "limits": _pod(
        "limits",
        _container(
            "app",
            _SLICE,
            _env(
                CUDA_DEVICE_MEMORY_LIMIT_0="99999m",
                CUDA_DEVICE_SM_LIMIT="100",
                CUDA_DEVICE_SM_LIMIT_0="100",
                CUDA_DEVICE_MEMORY_LIMIT_1="1m",
            ),
        ),
        initContainers=[
            _container(
                "warmup", {"nvidia.com/gpumem": "1000"}, _env(CUDA_DEVICE_MEMORY_LIMIT_0="5000m")
            )
        ],
    ),
    "switches": _pod(
        "switches",
        _container(
            "app",
            {"nvidia.com/gpumem": "2000"},
            _env(
                GPU_CORE_UTILIZATION_POLICY="Default",
                ACTIVE_OOM_KILLER="yes",
                CUDA_TASK_PRIORITY="0",
            ),
        ),
    ),
    "mounts": _pod(
        "mounts",
        _container(
            "app",
            {"nvidia.com/gpumem": "2000"},
            [],
            volumeMounts=[
                {"name": "gpushare-vgpu-lock", "mountPath": "/tmp/vgpulock", "subPath": "x"}
            ],
        ),
        volumes=[{"name": "gpushare-vgpu-lock", "emptyDir": {}}],
    ),
    "mps": _pod(
        "mps",
        _container(
            "app",
            _SLICE,
            [
                {"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=99999M"},
                {
                    "name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                    "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                },
            ],
        ),
        annotations={"gpushare.io/mode": "mps"},
    ),
}
_REPLACED: Final = (
    "CUDA_DEVICE_MEMORY_LIMIT_0",
    "CUDA_DEVICE_SM_LIMIT_0",
    "CUDA_DEVICE_MEMORY_LIMIT_1",
    "GPU_CORE_UTILIZATION_POLICY",
    "ACTIVE_OOM_KILLER",
    "CUDA_TASK_PRIORITY",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
)
_WARNING: Final = re.compile(r"^Warning: .*?: \[limit-tampering\] (.*)$", re.M)


def test_on_1_36_refusals_and_overrides_are_told_without_the_webhook(
    bin_dir: Path, tmp_path: Path
) -> None:
    """The 1.36 install with the webhook process killed: a refusal names the container
    and the field, and kubectl shows a warning for each value the mutation replaced, in
    the webhook's (redacted) words, one each, as the core's."""
    from webhook.core.decision import Request, decide
    from webhook.dev.cluster import running
    from webhook.install.mode import APISERVER
    from webhook.policies import load_policy
    from webhook.render.admission import OVERRIDES_ANNOTATION

    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text((ROOT / "webhook" / "policies" / "default.yaml").read_text())
    policy = load_policy(policy_file)
    kubectl = bin_dir / "kubectl"
    if not kubectl.exists():
        pytest.fail(f"{kubectl} missing: hack/build-testbin builds it with the control plane")
    with running(
        bin_dir=bin_dir, policy=policy_file, workdir=tmp_path, mode=None, cel_policies=True
    ) as cluster:
        assert cluster.mode == APISERVER
        assert cluster.webhook is not None and cluster.webhook.process is not None
        cluster.webhook.process.popen.kill()
        cluster.webhook.process.popen.wait()
        cluster.create_namespace("dev")
        kubeconfig = tmp_path / "kubeconfig"
        cluster.write_kubeconfig(kubeconfig)

        def create(obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [str(kubectl), "--kubeconfig", str(kubeconfig), "create", "-n", "dev", "-f", "-"],
                input=json.dumps(obj),
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )

        visible = _pod(
            "visible",
            _container("app", {"nvidia.com/gpumem": "2000"}, []),
            _container("side", {}, _env(NVIDIA_VISIBLE_DEVICES="all")),
        )
        refused = create(visible)
        assert refused.returncode != 0
        assert (
            '[raw-visible-devices] container "side": NVIDIA_VISIBLE_DEVICES="\u2026"; remove it, '
            "request GPUs in limits" in refused.stderr
        ), refused.stderr

        request = Request(kind="Pod", operation="CREATE", namespace="dev", username="admin")
        warned: list[str] = []
        for name, pod in OVERRIDDEN.items():
            decision = decide(pod, request, policy, phase="mutate")
            assert decision.allowed, decision.violations
            want = [
                text
                for violation, text in zip(decision.violations, decision.redacted, strict=True)
                if violation["action"] == "warn"
            ]
            created = create(pod)
            assert created.returncode == 0, created.stderr
            assert _WARNING.findall(created.stderr) == want, (name, created.stderr)
            stored = subprocess.run(
                [
                    str(kubectl),
                    "--kubeconfig",
                    str(kubeconfig),
                    "get",
                    "pod",
                    name,
                    "-n",
                    "dev",
                    "-o",
                    "json",
                ],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            ).stdout
            metadata = json.loads(stored)["metadata"]
            assert metadata["annotations"][OVERRIDES_ANNOTATION].split("\n") == want
            # The label the warning policy's objectSelector asks for.
            assert metadata["labels"] == {OVERRIDES_ANNOTATION: "true"}
            warned += want
        every = " ".join(warned)
        for kind in (*_REPLACED, "init container", "removed", "volume", "mount", "valueFrom"):
            assert kind in every, kind
        # A large pod stays within the CEL cost limits (gpushare-mutate fails closed):
        # 40 sharing containers of 200 env entries, each with its limit set by hand.
        big = _pod(
            "big",
            *[
                _container(
                    f"c{i}",
                    {"nvidia.com/gpumem": "2000"},
                    [{"name": f"E{j}", "value": "v"} for j in range(200)]
                    + _env(CUDA_DEVICE_MEMORY_LIMIT_0="99999m"),
                )
                for i in range(40)
            ],
        )
        created = create(big)
        assert created.returncode == 0, created.stderr[-2000:]
        lines = _WARNING.findall(created.stderr)
        assert lines[0] == 'container "c0": CUDA_DEVICE_MEMORY_LIMIT_0 "\u2026" replaced by "2000m"'
        assert len(lines) == 8 and lines[-1].endswith(
            f"(and 32 more in annotation {OVERRIDES_ANNOTATION})"
        ), lines
        # The refusal of a large pod names its container too.
        big["metadata"]["name"] = "big-visible"
        big["spec"]["containers"][-1]["env"].append(
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}
        )
        refused = create(big)
        assert '[raw-visible-devices] container "c39": NVIDIA_VISIBLE_DEVICES=' in refused.stderr, (
            refused.stderr[-2000:]
        )
        # A pod that sets nothing the mutation replaces is not warned.
        quiet = create(_pod("quiet", _container("app", {"nvidia.com/gpumem": "2000"}, [])))
        assert quiet.returncode == 0 and "Warning" not in quiet.stderr, quiet.stderr


def test_a_bare_dev_cluster_takes_the_chart(bin_dir: Path, tmp_path: Path) -> None:
    """--bare registers nothing, so the documented helm install owns every object (the
    full dev cluster's own registrations made it fail on ownership); uninstalled, its
    Namespace goes."""
    from kubernetes import client, config

    from tests.install.chart import CHART, find_helm

    kubeconfig = tmp_path / "kubeconfig"
    argv = [str(ROOT / "hack" / "dev-cluster"), "--bare", "--kubeconfig", str(kubeconfig)]
    process = subprocess.Popen(
        [*argv, "--bin-dir", str(bin_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
    )
    try:
        line = ready_line(process)
        assert "nothing installed" in line and "apiserver install" in line, line
        command = line[line.index("helm install") :].split()
        command[0] = find_helm(4)
        command[3] = str(CHART)
        installed = subprocess.run(command, capture_output=True, text=True, check=False)
        assert installed.returncode == 0, installed.stderr
        helm = [find_helm(4), "--kubeconfig", str(kubeconfig), "-n", "gpushare-system"]
        removed = subprocess.run(
            [*helm, "uninstall", "gpushare-webhook"], capture_output=True, text=True, check=False
        )
        assert removed.returncode == 0, removed.stderr
        api = config.new_client_from_config(str(kubeconfig))  # type: ignore[no-untyped-call]  # untyped upstream
        core: Any = client.CoreV1Api(api)
        core.delete_namespace("gpushare-system")
        wait_until_gone(core, "gpushare-system")
        api.close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()
