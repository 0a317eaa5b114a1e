"""A Kubernetes Deployment and Service per pool, built as dicts and dumped with yaml.safe_dump.

One pod is one vLLM replica holding `tp` GPUs; the image's tag pins the vLLM version the
plan was calibrated for.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from capplan.deploy.serve import (
    VLLM_VERSION,
    PoolDeploy,
    as_deploy,
    serve_command,
    serve_notes,
)
from capplan.errors import ConfigError
from capplan.modelspec import ModelSpec, load_model_spec
from capplan.pool import Pool
from capplan.solve.plan import PoolPlan

VLLM_IMAGE = f"vllm/vllm-openai:v{VLLM_VERSION}"
PORT = 8000
SHM_SIZE = "16Gi"
"""NCCL and the PyTorch dataloader use /dev/shm; the container default (64 MiB) is too small
for tensor parallelism."""
STARTUP_BUDGET_S = 900
"""Cold start (weights, compile, CUDA graphs) can take minutes: the seeds' pod took 428 s to
become Ready; the startup probe allows this long before the pod is restarted."""


def k8s_name(pool: str) -> str:
    """A DNS-1123 label from a pool name (lower case, digits and '-', at most 63 chars)."""
    name = re.sub(r"[^a-z0-9-]+", "-", f"vllm-{pool}".lower()).strip("-")
    return name[:63].rstrip("-")


_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def check_k8s_options(*, image: str, namespace: str | None) -> None:
    """Refuse what Kubernetes would: a namespace that is not a DNS-1123 label, an image
    that is empty or holds white space."""
    if namespace is not None and not _DNS1123_LABEL.fullmatch(namespace):
        raise ConfigError(
            f"{namespace!r} is not a Kubernetes namespace; use at most 63 lower-case letters, "
            "digits and '-', starting and ending with a letter or digit", field="--namespace")
    if not image or any(c.isspace() for c in image):
        raise ConfigError(f"{image!r} is not a container image; give one such as {VLLM_IMAGE}",
                          field="--image")


def _probe(period_s: int, failures: int) -> dict[str, Any]:
    return {"httpGet": {"path": "/health", "port": "http"},
            "periodSeconds": period_s, "failureThreshold": failures, "timeoutSeconds": 5}


def manifests(
    pool: PoolDeploy | PoolPlan | Pool,
    spec: ModelSpec | None = None,
    *,
    image: str = VLLM_IMAGE,
    namespace: str | None = None,
) -> list[dict[str, Any]]:
    """[Deployment, Service] for one pool, as plain dicts."""
    check_k8s_options(image=image, namespace=namespace)
    d = as_deploy(pool)
    spec = spec or load_model_spec(d.model)
    argv = serve_command(d, spec)
    name = k8s_name(d.pool)

    def meta() -> dict[str, Any]:  # fresh dicts: shared ones would dump as YAML anchors
        labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "capplan"}
        return {"name": name, "labels": labels, **({"namespace": namespace} if namespace else {})}

    gpus = {"nvidia.com/gpu": d.tp}
    container = {
        "name": "vllm",
        "image": image,
        "command": argv[:2],  # `vllm serve`, whatever the image's entrypoint
        "args": [*argv[2:], "--port", str(PORT)],
        "ports": [{"name": "http", "containerPort": PORT}],
        "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": "hf-token", "key": "token", "optional": True}}}],
        "resources": {"requests": dict(gpus), "limits": dict(gpus)},
        "startupProbe": _probe(10, STARTUP_BUDGET_S // 10),
        "readinessProbe": _probe(5, 3),
        "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}],
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {**meta(), "annotations": {
            "capplan/model": spec.hf_id, "capplan/precision": d.precision.value,
            "capplan/gpu": d.gpu, "capplan/gpus": str(d.gpus),
            "capplan/vllm-version": VLLM_VERSION,
        }},
        "spec": {
            "replicas": d.replicas,
            "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
            "template": {
                "metadata": {"labels": meta()["labels"]},
                "spec": {
                    "containers": [container],
                    "volumes": [{"name": "shm", "emptyDir": {
                        "medium": "Memory", "sizeLimit": SHM_SIZE}}],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(),
        "spec": {
            "selector": {"app.kubernetes.io/name": name},
            "ports": [{"name": "http", "port": PORT, "targetPort": "http"}],
        },
    }
    return [deployment, service]


def k8s_deployment(
    pool: PoolDeploy | PoolPlan | Pool,
    spec: ModelSpec | None = None,
    *,
    image: str = VLLM_IMAGE,
    namespace: str | None = None,
) -> str:
    """The Deployment and Service of one pool as a two-document YAML; the notes that need a
    person (placeholders to fill in) lead it as comments."""
    d = as_deploy(pool)
    spec = spec or load_model_spec(d.model)
    docs = manifests(d, spec, image=image, namespace=namespace)
    head = [f"# capplan: pool {d.pool}, {d.replicas} replica(s) x {d.tp} GPU(s) = {d.gpus} "
            f"{d.gpu} GPU(s), vLLM {VLLM_VERSION}"]
    head += [f"# NOTE: {n}" for n in serve_notes(d, spec)]
    body: str = yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False, width=1000)
    return "\n".join(head) + "\n" + body
