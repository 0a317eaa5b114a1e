"""`capplan deploy PLAN.json`: the `vllm serve` line or Kubernetes manifests of every pool."""

from __future__ import annotations

import shlex
from pathlib import Path

import click
from pydantic import ValidationError

from capplan.deploy.k8s import VLLM_IMAGE, k8s_deployment, k8s_name
from capplan.deploy.serve import VLLM_VERSION, PoolDeploy, serve_command, serve_notes
from capplan.errors import ConfigError
from capplan.modelspec import load_model_spec
from capplan.solve.plan import Plan


def load_plan(path: Path) -> Plan:
    """A `capplan size --format json` plan; a bad file is a ConfigError naming it."""
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read plan ({e.strerror})", file=str(path)) from e
    try:
        return Plan.model_validate_json(text)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or None
        raise ConfigError(f"not a capplan plan: {err['msg']}", file=str(path), field=where) from e


def plan_pools(plan: Plan, traffic: Path | None) -> list[PoolDeploy]:
    """The plan's pools; with a traffic mix, engine settings the plan lacks come from it."""
    mix_pools = {}
    if traffic is not None:
        from capplan.mix import load_mix

        mix_pools = {p.name: p for p in load_mix(traffic).pools}
    return [PoolDeploy.from_pool_plan(p, mix_pools.get(p.pool)) for p in plan.pools]


def shell_text(d: PoolDeploy) -> str:
    """Comment lines, then the command, shell-quoted."""
    spec = load_model_spec(d.model)
    lines = [f"# pool {d.pool}: {d.replicas} replica(s), each `vllm serve` on {d.tp} "
             f"{d.gpu} GPU(s); {d.gpus} GPU(s) in all (vLLM {VLLM_VERSION})"]
    lines += [f"# NOTE: {n}" for n in serve_notes(d, spec)]
    lines.append(shlex.join(serve_command(d, spec)))
    return "\n".join(lines) + "\n"


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as e:
        raise ConfigError(f"cannot write file ({e.strerror})", file=str(path)) from e


@click.command()
@click.argument("plan_path", metavar="PLAN.json", type=click.Path(path_type=Path))
@click.option("--traffic", type=click.Path(path_type=Path), default=None,
              help="traffic mix YAML: engine settings the plan lacks are taken from it")
@click.option("--format", "fmt", type=click.Choice(["shell", "k8s"]), default="shell",
              show_default=True)
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="write one file per pool here (<pool>.sh or vllm-<pool>.yaml)")
@click.option("--image", default=VLLM_IMAGE, show_default=True, help="container image (k8s)")
@click.option("--namespace", default=None, help="Kubernetes namespace (k8s)")
def deploy(plan_path: Path, traffic: Path | None, fmt: str, out: Path | None, image: str,
           namespace: str | None) -> None:
    """Per pool of PLAN.json, the `vllm serve` command for vLLM 0.26.0 or a Kubernetes
    Deployment + Service with its replica count and GPU requests."""
    plan = load_plan(plan_path)
    for x in plan.infeasible:  # nothing to deploy: say so where the commands do not go
        click.echo(f"pool {x.pool}: infeasible, not deployed: {x.reason}", err=True)
    pools = plan_pools(plan, traffic)
    if out is not None:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"cannot create folder ({e.strerror})", file=str(out)) from e
    texts = []
    for d in pools:
        if fmt == "shell":
            text, name = shell_text(d), f"{d.pool}.sh"
        else:
            text = k8s_deployment(d, image=image, namespace=namespace)
            name = f"{k8s_name(d.pool)}.yaml"
        if out is None:
            texts.append(text)
            continue
        path = out / name
        _write(path, ("#!/bin/sh\n" + text) if fmt == "shell" else text)
        if fmt == "shell":
            path.chmod(0o755)
        click.echo(f"pool {d.pool}: {path}")
    if texts:
        click.echo(("\n" if fmt == "shell" else "---\n").join(texts), nl=False)
