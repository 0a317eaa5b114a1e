"""`capplan deploy PLAN.json`: the `vllm serve` line or Kubernetes manifests of every pool."""

from __future__ import annotations

import functools
import shlex
from pathlib import Path

import click
from pydantic import ValidationError

from capplan._cli import errors_as_lines, write_out
from capplan._yaml import read_utf8, validation_message
from capplan.deploy.k8s import VLLM_IMAGE, check_k8s_options, k8s_deployment, k8s_name
from capplan.deploy.serve import VLLM_VERSION, PoolDeploy, serve_command, serve_notes
from capplan.errors import ConfigError
from capplan.modelspec import load_model_spec
from capplan.solve.plan import Plan


def load_plan(path: Path) -> Plan:
    """A `capplan size --out plan.json` plan whose models capplan knows; a bad file is a
    ConfigError naming it and the field."""
    try:
        text = read_utf8(path)
    except OSError as e:
        raise ConfigError(f"cannot read plan ({e.strerror})", file=str(path)) from e
    try:
        plan = Plan.model_validate_json(text)
    except ValidationError as e:
        field, msg = validation_message(e)
        how = "" if field else " (write one with `capplan size --out plan.json`)"
        raise ConfigError(f"not a capplan plan{how}: {msg}", file=str(path),
                          field=field or None) from e
    for i, p in enumerate(plan.pools):
        try:
            load_model_spec(p.model)
        except ConfigError as e:
            raise ConfigError(str(e), file=str(path), field=f"pools.{i}.model") from e
    return plan


def plan_pools(plan: Plan, traffic: Path | None) -> list[PoolDeploy]:
    """The plan's pools; with a traffic mix, engine settings the plan lacks come from it. The
    mix must be the one the plan was sized for: a plan pool it lacks, or one it fixes
    otherwise (another model, TP, GPU, precision or engine setting), is a ConfigError naming
    the mix, as `capplan report` and `validate plan` refuse it."""
    mix_pools = {}
    if traffic is not None:
        from capplan.mix import load_mix
        from capplan.solve.choose import check_plan_mix

        mix = load_mix(traffic)
        check_plan_mix(plan, mix)
        mix_pools = {p.name: p for p in mix.pools}
    return [PoolDeploy.from_pool_plan(p, mix_pools.get(p.pool)) for p in plan.pools]


def shell_text(d: PoolDeploy) -> str:
    """Comment lines, then the command, shell-quoted."""
    spec = load_model_spec(d.model)
    lines = [f"# pool {d.pool}: {d.replicas} replica(s), each `vllm serve` on {d.tp} "
             f"{d.gpu} GPU(s); {d.gpus} GPU(s) in all (vLLM {VLLM_VERSION})"]
    lines += [f"# NOTE: {n}" for n in serve_notes(d, spec)]
    lines.append(shlex.join(serve_command(d, spec)))
    return "\n".join(lines) + "\n"


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
@errors_as_lines
def deploy(plan_path: Path, traffic: Path | None, fmt: str, out: Path | None, image: str,
           namespace: str | None) -> None:
    """Per pool of PLAN.json, the `vllm serve` command for vLLM 0.26.0 or a Kubernetes
    Deployment + Service with its replica count and GPU requests."""
    if fmt == "k8s":
        check_k8s_options(image=image, namespace=namespace)
    plan = load_plan(plan_path)
    for x in plan.infeasible:  # nothing to deploy: say so where the commands do not go
        click.echo(f"pool {x.pool}: infeasible, not deployed: {x.reason}", err=True)
    texts = []  # every pool's text before any is written: a bad pool writes nothing
    for d in plan_pools(plan, traffic):
        if fmt == "shell":
            texts.append((d.pool, f"{d.pool}.sh", shell_text(d)))
        else:
            texts.append((d.pool, f"{k8s_name(d.pool)}.yaml",
                          k8s_deployment(d, image=image, namespace=namespace)))
    if out is None:
        if texts:
            click.echo(("\n" if fmt == "shell" else "---\n").join(t for *_, t in texts),
                       nl=False)
        return
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot create folder ({e.strerror})", file=str(out)) from e
    for pool, name, text in texts:
        path = out / name
        body = ("#!/bin/sh\n" + text) if fmt == "shell" else text
        write_out(path, "--out", functools.partial(Path.write_text, data=body))
        if fmt == "shell":
            path.chmod(0o755)
        click.echo(f"pool {pool}: {path}")
