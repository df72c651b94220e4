"""The HTTPS service on a real TLS listener on loopback: protocol, bad input, audit, reload."""

from __future__ import annotations

import asyncio
import base64
import copy
import io
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import jsonpatch
import orjson
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.paths import MANIFESTS, ROOT
from webhook.certs.contexts import build_server_context
from webhook.dev.testing import admission_review as review
from webhook.service import server
from webhook.service.process import ServerConfig, Service, start
from webhook.service.server import parse_timeout


def manifest(name: str) -> dict[str, Any]:
    data = yaml.safe_load((MANIFESTS / name).read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture
async def service(tls_files: dict[str, Path], tmp_path: Path) -> AsyncIterator[Service]:
    policy = tmp_path / "policy.yaml"
    policy.write_text((ROOT / "policies" / "default.yaml").read_text())
    config = ServerConfig(
        host="127.0.0.1",
        port=0,
        health_port=0,
        policy=str(policy),
        audit_log=str(tmp_path / "audit.log"),
        policy_poll_interval=0.05,
    )
    context = build_server_context(tls_files["cert"], tls_files["key"])
    service = await start(config, ssl_context=context)
    try:
        yield service
    finally:
        await service.stop()


@pytest.fixture
async def client(tls_files: dict[str, Path]) -> AsyncIterator[aiohttp.ClientSession]:
    context = ssl.create_default_context(cafile=str(tls_files["ca"]))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
        yield session


async def post(
    client: aiohttp.ClientSession,
    service: Service,
    path: str,
    body: Any,
    *,
    raw: bytes | None = None,
    content_type: str = "application/json",
) -> tuple[int, Any]:
    data = io.BytesIO(raw if raw is not None else orjson.dumps(body))
    async with client.post(
        f"https://127.0.0.1:{service.port}{path}",
        data=data,
        headers={"Content-Type": content_type},
    ) as response:
        text = await response.read()
        return response.status, orjson.loads(text) if text else None


def audit_lines(service: Service) -> list[dict[str, Any]]:
    path = Path(service.sink._out.path)  # type: ignore[union-attr]  # a file sink in these tests
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


# -- protocol --------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["admission.k8s.io/v1", "admission.k8s.io/v1beta1"])
async def test_mutate_answers_in_request_version_with_patch(
    service: Service, client: aiohttp.ClientSession, version: str
) -> None:
    pod = manifest("hami-vgpu-pod.yaml")
    body = review(copy.deepcopy(pod), version=version)
    status, answer = await post(client, service, "/mutate", body)
    assert status == 200
    assert answer["apiVersion"] == version
    assert answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == body["request"]["uid"]
    assert response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    patch = orjson.loads(base64.b64decode(response["patch"]))
    mutated = jsonpatch.apply_patch(pod, patch)
    assert mutated["spec"]["schedulerName"] == "hami-scheduler"
    assert response["auditAnnotations"]["mode"] == "vgpu"
    assert response["auditAnnotations"]["policy"] == service.store.policy.digest
    # The mutated pod passes validation; the unmutated one does not.
    status, validated = await post(client, service, "/validate", review(mutated, version=version))
    assert validated["response"]["allowed"] is True
    assert "patch" not in validated["response"]
    status, raw = await post(client, service, "/validate", review(pod, version=version))
    assert raw["response"]["allowed"] is False
    assert "unmutated-gpu-pod" in raw["response"]["status"]["message"]


RULE_CASES: list[tuple[str, dict[str, Any], str]] = []


def _rule_cases() -> list[tuple[str, dict[str, Any]]]:
    base = manifest("hami-vgpu-pod.yaml")
    cases: list[tuple[str, dict[str, Any]]] = []

    def variant(rule: str, change: Any) -> None:
        pod = copy.deepcopy(base)
        change(pod)
        cases.append((rule, pod))

    container = ("spec", "containers", 0)

    def at(pod: dict[str, Any]) -> dict[str, Any]:
        node: Any = pod
        for part in container:
            node = node[part]
        return node  # type: ignore[no-any-return]

    variant("privileged-gpu", lambda p: at(p).update(securityContext={"privileged": True}))
    variant("node-name-pinning", lambda p: p["spec"].update(nodeName="n1"))
    variant(
        "raw-visible-devices",
        lambda p: at(p).update(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]),
    )
    variant(
        "host-device-access",
        lambda p: p["spec"].update(volumes=[{"name": "d", "hostPath": {"path": "/dev/nvidia0"}}]),
    )
    variant(
        "limit-tampering",
        lambda p: at(p).update(env=[{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]),
    )
    variant(
        "invalid-gpu-request",
        lambda p: at(p)["resources"]["limits"].update({"nvidia.com/gpumem": "3Gi"}),
    )
    variant(
        "mode-conflict", lambda p: p["metadata"].update(annotations={"gpushare.io/mode": "mig"})
    )
    variant("scheduler-bypass", lambda p: p["spec"].update(schedulerName="other"))
    variant(
        "forged-allocation",
        lambda p: p["metadata"].update(annotations={"hami.io/vgpu-node": "n1"}),
    )
    return cases


@pytest.mark.parametrize("version", ["admission.k8s.io/v1", "admission.k8s.io/v1beta1"])
@pytest.mark.parametrize("endpoint", ["/mutate", "/validate"])
async def test_every_rule_denies_through_both_endpoints(
    service: Service, client: aiohttp.ClientSession, endpoint: str, version: str
) -> None:
    for rule, pod in _rule_cases():
        status, answer = await post(client, service, endpoint, review(pod, version=version))
        assert status == 200
        response = answer["response"]
        assert response["allowed"] is False, rule
        assert response["status"]["code"] == 403
        assert f"[{rule}]" in response["status"]["message"], (rule, response["status"])
        assert rule in response["auditAnnotations"]["rules"]
        assert "patch" not in response


async def test_warnings_and_ephemeral_container_update(
    service: Service, client: aiohttp.ClientSession, tmp_path: Path
) -> None:
    pod = manifest("hami-vgpu-pod.yaml")
    pod["spec"]["containers"][0]["env"] = [{"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "99g"}]
    status, answer = await post(client, service, "/mutate", review(pod))
    assert status == 200
    assert answer["response"]["allowed"] is True
    assert any("CUDA_DEVICE_MEMORY_LIMIT_0" in w for w in answer["response"]["warnings"])
    before = manifest("plain-pod.yaml")
    before["spec"]["nodeName"] = "node-1"
    running = copy.deepcopy(before)
    running["spec"]["ephemeralContainers"] = [
        {
            "name": "dbg",
            "image": "busybox",
            "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
        }
    ]
    body = review(running, operation="UPDATE", sub_resource="ephemeralcontainers", old=before)
    _status, answer = await post(client, service, "/validate", body)
    assert answer["response"]["allowed"] is False
    assert "ephemeral container" in answer["response"]["status"]["message"]


async def test_dry_run_is_answered_and_audited(
    service: Service, client: aiohttp.ClientSession
) -> None:
    body = review(manifest("hami-vgpu-pod.yaml"), dry_run=True)
    _status, answer = await post(client, service, "/mutate", body)
    assert answer["response"]["allowed"] is True
    await service.sink.aclose()
    records = audit_lines(service)
    assert records[-1]["auditID"] == body["request"]["uid"]
    assert records[-1]["dryRun"] is True
    assert records[-1]["objectRef"] == {
        "resource": "pods",
        "apiVersion": "v1",
        "namespace": "ml",
        "name": "gpu-pod",
    }
    assert records[-1]["user"] == {"username": "alice", "groups": ["system:authenticated"]}
    assert records[-1]["patchOps"] > 0


async def test_audit_never_holds_env_values(
    service: Service, client: aiohttp.ClientSession
) -> None:
    secret = "s3cr3t-token-value"
    pod = manifest("hami-vgpu-pod.yaml")
    pod["spec"]["containers"][0]["env"] = [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": secret},
        {"name": "API_TOKEN", "value": secret},
    ]
    await post(client, service, "/mutate", review(pod))
    await service.sink.aclose()
    text = Path(service.sink._out.path).read_text()  # type: ignore[union-attr]
    assert "raw-visible-devices" in text
    assert secret not in text


async def test_audit_line_count_under_concurrency(
    service: Service, client: aiohttp.ClientSession
) -> None:
    bodies = [review(manifest("hami-vgpu-pod.yaml")) for _ in range(120)]
    bodies += [review(manifest("plain-pod.yaml")) for _ in range(80)]
    results = await asyncio.gather(*(post(client, service, "/mutate", b) for b in bodies))
    assert all(status == 200 for status, _ in results)
    await service.sink.aclose()
    records = audit_lines(service)
    assert len(records) == len(bodies)
    assert {r["auditID"] for r in records} == {b["request"]["uid"] for b in bodies}


# -- bad input -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "content_type", "status"),
    [
        (b"not json", "application/json", 400),
        (b"[]", "application/json", 400),
        (
            b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}',
            "application/json",
            400,
        ),
        (
            b'{"apiVersion": "admission.k8s.io/v2", "kind": "AdmissionReview", "request": {"uid": "a"}}',
            "application/json",
            400,
        ),
        (
            b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",'
            b' "request": {"uid": "a", "operation": "CREATE"}}',
            "application/json",
            400,
        ),
        (
            b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}}',
            "application/json",
            400,
        ),
        (b"{}", "text/plain", 415),
        (b"x" * (4 << 20) + b"x", "application/json", 413),
    ],
)
async def test_bad_input_gets_a_4xx_json_status(
    service: Service, client: aiohttp.ClientSession, raw: bytes, content_type: str, status: int
) -> None:
    for path in ("/mutate", "/validate"):
        got, body = await post(client, service, path, None, raw=raw, content_type=content_type)
        assert got == status
        assert body["kind"] == "Status"
        assert body["code"] == status
        assert body["message"]


async def test_buffered_body_over_the_limit_is_413(
    service: Service, client: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A body that arrived whole is taken from the buffer, not by read() (which enforces
    # the app's client_max_size): the handler's own check must refuse it. A lower limit
    # than the app's makes a small body, which is always buffered whole, cross it.
    monkeypatch.setattr(server, "MAX_BODY", 500)
    body = review(manifest("hami-vgpu-pod.yaml"))
    assert len(orjson.dumps(body)) > 500
    status, answer = await post(client, service, "/mutate", body)
    assert status == 413
    assert answer["message"] == "body over 500 bytes"


@pytest.mark.parametrize(
    "content_type", ["application/json; charset=utf-8", "Application/JSON", "application/json "]
)
async def test_json_content_type_with_parameters_or_other_case(
    service: Service, client: aiohttp.ClientSession, content_type: str
) -> None:
    body = review(manifest("hami-vgpu-pod.yaml"))
    status, answer = await post(client, service, "/mutate", body, content_type=content_type)
    assert status == 200
    assert answer["response"]["uid"] == body["request"]["uid"]


async def test_body_stalled_past_the_deadline_is_408(
    service: Service, tls_files: dict[str, Path]
) -> None:
    context = ssl.create_default_context(cafile=str(tls_files["ca"]))
    reader, writer = await asyncio.open_connection("127.0.0.1", service.port, ssl=context)
    try:
        writer.write(
            b"POST /validate?timeout=200ms HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
        )
        async with asyncio.timeout(10):
            assert (await reader.readline()).startswith(b"HTTP/1.1 408 ")
    finally:
        writer.close()


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    garbage=st.one_of(
        JSON,
        st.fixed_dictionaries(
            {
                "apiVersion": st.just("admission.k8s.io/v1"),
                "kind": st.just("AdmissionReview"),
                "request": JSON,
            }
        ),
        st.fixed_dictionaries(
            {
                "apiVersion": st.just("admission.k8s.io/v1"),
                "kind": st.just("AdmissionReview"),
                "request": st.fixed_dictionaries(
                    {
                        "uid": st.just("u"),
                        "operation": st.sampled_from(["CREATE", "UPDATE", "DELETE"]),
                        "object": JSON,
                    },
                    optional={"kind": JSON, "userInfo": JSON, "namespace": JSON, "dryRun": JSON},
                ),
            }
        ),
    )
)
async def test_garbage_bodies_get_well_formed_answers(
    service: Service, client: aiohttp.ClientSession, garbage: Any
) -> None:
    status, body = await post(client, service, "/validate", garbage)
    if status == 200:
        assert body["response"]["uid"] == garbage["request"]["uid"]
        assert isinstance(body["response"]["allowed"], bool)
    else:
        assert status == 400
        assert body["kind"] == "Status"


def test_parse_timeout() -> None:
    assert parse_timeout("5s") == 5.0
    assert parse_timeout("500ms") == 0.5
    assert parse_timeout(None) == 10.0
    assert parse_timeout("junk") == 10.0
    assert parse_timeout("10m") == 30.0


# -- policy reload ---------------------------------------------------------------------


async def test_policy_reload_under_traffic_and_bad_policy_kept_out(
    service: Service, client: aiohttp.ClientSession
) -> None:
    assert service.store.path is not None
    path = service.store.path
    before = service.store.policy.digest
    pod = manifest("privileged-sidecar.yaml")
    stop = asyncio.Event()
    failures: list[Any] = []
    verdicts: list[bool] = []

    async def traffic() -> None:
        while not stop.is_set():
            status, body = await post(client, service, "/validate", review(pod))
            if status != 200:
                failures.append((status, body))
            else:
                verdicts.append(body["response"]["allowed"])

    workers = [asyncio.create_task(traffic()) for _ in range(4)]
    await asyncio.sleep(0.2)
    # A ConfigMap-style atomic symlink swap to a policy that only audits.
    data_dir = path.parent / "..2026_data"
    data_dir.mkdir()
    (data_dir / "policy.yaml").write_text(
        (ROOT / "policies" / "examples" / "audit-only.yaml").read_text()
    )
    tmp_link = path.parent / "policy.tmp"
    tmp_link.symlink_to(data_dir / "policy.yaml")
    tmp_link.replace(path)
    for _ in range(100):
        await asyncio.sleep(0.05)
        if service.store.policy.digest != before:
            break
    audit_digest = service.store.policy.digest
    assert audit_digest != before
    await asyncio.sleep(0.2)
    # A broken file is refused; the audit-only policy stays in force; readiness stays up.
    reloads: list[bool] = []
    service.store.listeners.append(reloads.append)
    (data_dir / "policy.yaml").write_text(
        "apiVersion: gpushare.io/v1alpha1\nkind: GPUSharePolicy\nspec: {rules: {x: y}}\n"
    )
    for _ in range(100):
        await asyncio.sleep(0.05)
        if False in reloads:
            break
    await asyncio.sleep(0.2)
    stop.set()
    await asyncio.gather(*workers)
    assert failures == []
    assert False in reloads
    assert service.store.policy.digest == audit_digest
    assert False in verdicts
    assert verdicts[-1] is True
    assert service.state.ready
    await service.sink.aclose()
    hashes = {r["policyHash"] for r in audit_lines(service)}
    assert hashes == {before, audit_digest}


async def test_health_ready_and_metrics(service: Service, client: aiohttp.ClientSession) -> None:
    await post(
        client, service, "/mutate", review(manifest("privileged-sidecar.yaml"), dry_run=True)
    )
    await post(client, service, "/mutate", review(manifest("hami-vgpu-pod.yaml")))
    async with aiohttp.ClientSession() as plain:
        base = f"http://127.0.0.1:{service.health_port}"
        async with plain.get(f"{base}/healthz") as r:
            assert r.status == 200
        async with plain.get(f"{base}/readyz") as r:
            assert r.status == 200
            assert (await r.json())["policy"] == service.store.policy.digest
        async with plain.get(f"{base}/metrics") as r:
            text = await r.text()
    assert (
        'gpushare_admission_requests_total{decision="denied",dry_run="true",endpoint="mutate",mode="vgpu"} 1.0'
        in text
    )
    assert (
        'gpushare_admission_requests_total{decision="allowed",dry_run="false",endpoint="mutate",mode="vgpu"} 1.0'
        in text
    )
    assert (
        'gpushare_admission_violations_total{action="deny",dry_run="true",endpoint="mutate",rule="privileged-gpu"} 1.0'
        in text
    )
    assert "gpushare_admission_review_duration_seconds_bucket" in text
    assert 'gpushare_policy_reloads_total{result="failed"} 0.0' in text
