"""Pods as the apiserver hands them to the webhook, for the decision-core benchmark.

Each builder returns a fresh object: defaults the apiserver fills in (the projected
service-account token volume, tolerations, termination message fields, dnsPolicy) are
there, because they are part of every real AdmissionReview and of its size.
"""

from __future__ import annotations

import json
from typing import Any

Obj = dict[str, Any]


def json_size(obj: Any) -> int:
    """Bytes of ``obj`` as compact JSON (how the apiserver serialises it)."""
    return len(json.dumps(obj, separators=(",", ":")).encode())


def _token_volume() -> Obj:
    return {
        "name": "kube-api-access-7x2kq",
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
                                "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                            }
                        ]
                    }
                },
            ],
        },
    }


def _token_mount() -> Obj:
    return {
        "name": "kube-api-access-7x2kq",
        "readOnly": True,
        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
    }


def _container_defaults() -> Obj:
    return {
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
    }


def _tolerations() -> list[Obj]:
    return [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {
            "key": "node.kubernetes.io/not-ready",
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 300,
        },
        {
            "key": "node.kubernetes.io/unreachable",
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 300,
        },
    ]


def _trainer(name: str, rank: int, *, gpus: int, extra_env: int = 0) -> Obj:
    env: list[Obj] = [
        {"name": "MASTER_ADDR", "value": "llama-ft-master-0"},
        {"name": "MASTER_PORT", "value": "23456"},
        {"name": "WORLD_SIZE", "value": "4"},
        {"name": "RANK", "value": str(rank)},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "OMP_NUM_THREADS", "value": "8"},
        {"name": "NCCL_DEBUG", "value": "WARN"},
        {"name": "NCCL_IB_DISABLE", "value": "1"},
        {"name": "NCCL_SOCKET_IFNAME", "value": "eth0"},
        {"name": "LD_PRELOAD", "value": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"},
        {"name": "HF_HOME", "value": "/cache/huggingface"},
        {"name": "TORCH_HOME", "value": "/cache/torch"},
        {"name": "WANDB_PROJECT", "value": "llama-ft"},
        {
            "name": "WANDB_API_KEY",
            "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key"}},
        },
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
    ]
    env += [{"name": f"TRAIN_OPTION_{i}", "value": f"value-{i:04d}"} for i in range(extra_env)]
    return {
        "name": name,
        "image": "registry.example.com/ml/llama-ft:2024.09.1-cuda12.4-torch2.4",
        "command": ["torchrun"],
        "args": [
            "--nproc-per-node=1",
            "train.py",
            "--model=/models/llama-3-8b",
            "--data=/data/instructions",
            "--output=/checkpoints",
            "--bf16",
            "--gradient-checkpointing",
            "--per-device-train-batch-size=4",
        ],
        "ports": [{"name": "pytorchjob-port", "containerPort": 23456, "protocol": "TCP"}],
        "env": env,
        "resources": {
            "limits": {
                "nvidia.com/gpu": str(gpus),
                "nvidia.com/gpumem": "16000",
                "nvidia.com/gpucores": "50",
                "cpu": "8",
                "memory": "64Gi",
            },
            "requests": {
                "nvidia.com/gpu": str(gpus),
                "nvidia.com/gpumem": "16000",
                "nvidia.com/gpucores": "50",
                "cpu": "4",
                "memory": "48Gi",
            },
        },
        "volumeMounts": [
            {"name": "data", "mountPath": "/data", "readOnly": True},
            {"name": "models", "mountPath": "/models", "readOnly": True},
            {"name": "checkpoints", "mountPath": "/checkpoints"},
            {"name": "dshm", "mountPath": "/dev/shm"},  # noqa: S108  # the usual shm mount
            {"name": "cache", "mountPath": "/cache"},
            _token_mount(),
        ],
        **_container_defaults(),
    }


def _log_shipper(name: str = "log-shipper") -> Obj:
    return {
        "name": name,
        "image": "fluent/fluent-bit:3.1.7",
        "args": ["--config=/fluent-bit/etc/fluent-bit.yaml"],
        "env": [
            {"name": "LOKI_URL", "value": "http://loki-gateway.observability.svc:80"},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        "resources": {
            "limits": {"cpu": "200m", "memory": "128Mi"},
            "requests": {"cpu": "50m", "memory": "64Mi"},
        },
        "volumeMounts": [
            {"name": "fluent-bit-config", "mountPath": "/fluent-bit/etc"},
            {"name": "checkpoints", "mountPath": "/checkpoints", "readOnly": True},
            _token_mount(),
        ],
        **_container_defaults(),
    }


def _volumes() -> list[Obj]:
    return [
        {"name": "data", "persistentVolumeClaim": {"claimName": "instructions", "readOnly": True}},
        {"name": "models", "persistentVolumeClaim": {"claimName": "llama-3-8b", "readOnly": True}},
        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "llama-ft-ckpt"}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
        {"name": "cache", "emptyDir": {}},
        {
            "name": "fluent-bit-config",
            "configMap": {"name": "fluent-bit-trainer", "defaultMode": 420},
        },
        _token_volume(),
    ]


def _metadata(name: str, rank: int) -> Obj:
    return {
        "name": name,
        "namespace": "ml-team-a",
        "uid": "6b1c2f0e-9a8d-4e5f-8b7a-3c2d1e0f9a8b",
        "labels": {
            "training.kubeflow.org/job-name": "llama-ft",
            "training.kubeflow.org/operator-name": "pytorchjob-controller",
            "training.kubeflow.org/replica-type": "worker",
            "training.kubeflow.org/replica-index": str(rank),
            "app.kubernetes.io/part-of": "llm-finetune",
        },
        "annotations": {
            "sidecar.istio.io/inject": "false",
            "prometheus.io/scrape": "true",
            "prometheus.io/port": "9100",
        },
        "ownerReferences": [
            {
                "apiVersion": "kubeflow.org/v1",
                "kind": "PyTorchJob",
                "name": "llama-ft",
                "uid": "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }


def _spec(containers: list[Obj], init: list[Obj] | None = None) -> Obj:
    spec: Obj = {
        "containers": containers,
        "volumes": _volumes(),
        "restartPolicy": "OnFailure",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "trainer",
        "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000},
        "priorityClassName": "training-normal",
        "tolerations": _tolerations(),
        "enableServiceLinks": False,
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "nvidia.com/gpu.product",
                                    "operator": "In",
                                    "values": ["NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"],
                                }
                            ]
                        }
                    ]
                }
            }
        },
    }
    if init:
        spec["initContainers"] = init
    return spec


def gpu_pod_5k() -> Obj:
    """A PyTorchJob worker: one vGPU trainer and a log-shipper sidecar (~5 KB of JSON)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata("llama-ft-worker-1", 1),
        "spec": _spec([_trainer("pytorch", 1, gpus=1), _log_shipper()]),
    }


def gpu_pod_20k() -> Obj:
    """A bigger worker (~20 KB): four vGPU trainers, a GPU warm-up init container,
    long env lists and two sidecars."""
    trainers = [_trainer(f"pytorch-{i}", i, gpus=2, extra_env=36) for i in range(4)]
    warmup = _trainer("warmup", 0, gpus=1)
    warmup["args"] = ["-c", "import torch; torch.cuda.init()"]
    warmup["command"] = ["python"]
    metrics = _log_shipper("metrics-exporter")
    metrics["image"] = "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.7-3.5.0-ubuntu22.04"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata("llama-ft-worker-2", 2),
        "spec": _spec([*trainers, _log_shipper(), metrics], init=[warmup]),
    }


def plain_pod_2k() -> Obj:
    """A web pod without any GPU: nginx and a metrics sidecar (~2 KB)."""
    nginx: Obj = {
        "name": "nginx",
        "image": "nginx:1.27.1",
        "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
        "env": [
            {"name": "NGINX_PORT", "value": "8080"},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        ],
        "resources": {
            "limits": {"cpu": "500m", "memory": "256Mi"},
            "requests": {"cpu": "100m", "memory": "128Mi"},
        },
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 5},
        "volumeMounts": [{"name": "conf", "mountPath": "/etc/nginx/conf.d"}, _token_mount()],
        **_container_defaults(),
    }
    exporter: Obj = {
        "name": "exporter",
        "image": "nginx/nginx-prometheus-exporter:1.3.0",
        "args": ["--nginx.scrape-uri=http://localhost:8080/stub_status"],
        "resources": {"limits": {"cpu": "50m", "memory": "32Mi"}},
        "volumeMounts": [_token_mount()],
        **_container_defaults(),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web-7d9f8c6b5-x2x9q",
            "generateName": "web-7d9f8c6b5-",
            "namespace": "web",
            "labels": {"app": "web", "pod-template-hash": "7d9f8c6b5"},
        },
        "spec": {
            "containers": [nginx, exporter],
            "volumes": [
                {"name": "conf", "configMap": {"name": "web-nginx", "defaultMode": 420}},
                _token_volume(),
            ],
            "restartPolicy": "Always",
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "tolerations": _tolerations()[1:],
        },
    }
