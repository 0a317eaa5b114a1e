"""Deployment output: per pool, the `vllm serve` argv for vLLM 0.26.0 and Kubernetes manifests.

Flags are spelt as 0.26.0's parser registers them; `tests/test_deploy.py` checks each one
against an inventory extracted from the wheel's source (`scripts/extract_vllm_flags.py`).
"""

from capplan.deploy.k8s import VLLM_IMAGE, k8s_deployment, manifests
from capplan.deploy.serve import PoolDeploy, serve_command, serve_notes, speculative_config

__all__ = [
    "VLLM_IMAGE",
    "PoolDeploy",
    "k8s_deployment",
    "manifests",
    "serve_command",
    "serve_notes",
    "speculative_config",
]
