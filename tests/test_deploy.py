"""Deployment output: `vllm serve` argv for vLLM 0.26.0, Kubernetes manifests, `capplan deploy`.

Flags are checked against tests/data/vllm-0.26.0-serve-flags.json, an inventory extracted from
the 0.26.0 wheel's source by scripts/extract_vllm_flags.py (vLLM's parser itself needs torch).
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from capplan.cli import main
from capplan.deploy import PoolDeploy, k8s_deployment, serve_command, serve_notes
from capplan.errors import ConfigError
from capplan.mix import load_mix
from capplan.pool import EngineConfig, Pool, SpeculativeConfig
from capplan.solve.plan import Plan

ROOT = Path(__file__).resolve().parents[1]
INVENTORY_PATH = ROOT / "tests/data/vllm-0.26.0-serve-flags.json"
INVENTORY = json.loads(INVENTORY_PATH.read_text())
FLAGS: dict[str, dict[str, Any]] = INVENTORY["flags"]
MIX = load_mix(ROOT / "examples/production-mix.yaml")
REPLICAS = {"interactive": 5, "batch": 3, "vision": 2}


def _pool(**engine: Any) -> Pool:
    """A text pool on llama-3.1-8b with the given engine settings."""
    base = {"name": "t", "model": "llama-3.1-8b", "precision": "bf16"}
    return Pool.model_validate({**base, "engine": engine})


def _variants() -> list[PoolDeploy]:
    """The example mix's pools plus every setting serve_command can translate."""
    out = [PoolDeploy.from_pool(p, REPLICAS[p.name]) for p in MIX.pools]
    extra = [
        Pool(name="fp8kv", model="qwen3-32b", precision="fp8", tp=2,
             engine=EngineConfig(kv_cache_dtype="fp8", block_size=32,
                                 enable_prefix_caching=False, async_scheduling=False,
                                 long_prefill_token_threshold=2048)),
        Pool(name="nvfp4-mtp", model="gemma-4-31b", precision="nvfp4",
             engine=EngineConfig(speculative=SpeculativeConfig(method="mtp",
                                                               num_speculative_tokens=4),
                                 limit_mm_per_prompt={"image": 0},
                                 gpu_memory_utilization=0.95)),
        Pool(name="awq-eagle", model="llama-3.3-70b", precision="awq", tp=4,
             engine=EngineConfig(speculative=SpeculativeConfig(method="eagle3",
                                                               num_speculative_tokens=3))),
        Pool(name="ngram", model="llama-3.1-8b",
             engine=EngineConfig(speculative=SpeculativeConfig(method="ngram",
                                                               num_speculative_tokens=2))),
    ]
    return out + [PoolDeploy.from_pool(p, 2) for p in extra]


VARIANTS = _variants()
IDS = [d.pool for d in VARIANTS]


def _options(argv: list[str]) -> list[str]:
    return [a for a in argv if a.startswith("-")]


def _inventory_parser() -> argparse.ArgumentParser:
    """An argparse parser rebuilt from the inventory: the kinds 0.26.0 registers."""
    ap = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False, add_help=False)
    ap.add_argument("model_tag")
    seen: set[str] = set()
    for opt, f in FLAGS.items():
        if f["kind"] == "bool_negation" or opt in seen:
            continue
        names = [opt, *f["aliases"]]
        seen.update(names)
        kind = f["kind"]
        if kind == "bool":
            ap.add_argument(*names, dest=f["dest"], action=argparse.BooleanOptionalAction)
        elif kind in ("store_true", "store_false"):
            ap.add_argument(*names, dest=f["dest"], action=kind)
        elif kind == "json":
            ap.add_argument(*names, dest=f["dest"], type=json.loads)
        elif kind == "int":
            ap.add_argument(*names, dest=f["dest"], type=int)
        elif kind == "float":
            ap.add_argument(*names, dest=f["dest"], type=float)
        elif kind == "choice":
            ap.add_argument(*names, dest=f["dest"], choices=[str(c) for c in f["choices"]])
        elif kind == "list":
            ap.add_argument(*names, dest=f["dest"], nargs="+")
        elif kind == "bool_or_str":
            ap.add_argument(*names, dest=f["dest"], nargs="?", const=True)
        else:
            ap.add_argument(*names, dest=f["dest"])
    return ap


# -- the inventory ---------------------------------------------------------------------------


def test_inventory_has_provenance() -> None:
    """The flag inventory says where it came from: vLLM version, wheel sha256, date, script."""
    prov = INVENTORY["provenance"]
    assert prov["vllm_version"] == "0.26.0"
    assert len(prov["wheel_sha256"]) == 64 and int(prov["wheel_sha256"], 16) >= 0
    assert prov["extracted_utc"].endswith("Z")
    assert (ROOT / prov["script"]).is_file()
    assert "vllm/engine/arg_utils.py" in prov["sources"]
    assert "vllm/entrypoints/openai/cli_args.py" in prov["sources"]


def test_inventory_knows_the_flag_drift_of_0_26_0() -> None:
    """0.26.0: --disable-log-requests is gone, --limit-mm-per-prompt takes JSON, async
    scheduling is a boolean flag with a --no- form (DIGEST.md, "Flag drift")."""
    assert "--disable-log-requests" not in FLAGS
    assert FLAGS["--enable-log-requests"]["kind"] == "bool"
    assert FLAGS["--limit-mm-per-prompt"]["kind"] == "json"
    assert FLAGS["--speculative-config"]["kind"] == "json"
    assert FLAGS["--no-async-scheduling"]["kind"] == "bool_negation"
    assert FLAGS["--no-enable-prefix-caching"]["dest"] == "enable_prefix_caching"
    assert FLAGS["--scheduling-policy"]["choices"] == ["fcfs", "priority"]
    assert "fp8" in FLAGS["--kv-cache-dtype"]["choices"]
    assert "fp8" in FLAGS["--quantization"]["known_values"]
    assert FLAGS["--tensor-parallel-size"]["aliases"] == ["-tp"]


WHEELS = glob.glob("/tmp/vsrc/vllm-0.26.0-*.whl")


def _extractor() -> Any:
    """scripts/extract_vllm_flags.py as a module."""
    spec = importlib.util.spec_from_file_location(
        "extract_vllm_flags", ROOT / "scripts/extract_vllm_flags.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(len(WHEELS) != 1, reason="the vLLM 0.26.0 wheel is not at /tmp/vsrc")
def test_inventory_matches_a_fresh_extraction() -> None:
    """The committed inventory is what the script extracts from the wheel now (refresh it
    deliberately, with the diff as the review)."""
    fresh = _extractor().extract(Path(WHEELS[0]))
    assert fresh["flags"] == FLAGS
    assert fresh["provenance"]["wheel_sha256"] == INVENTORY["provenance"]["wheel_sha256"]


def _vllm_importable() -> bool:
    try:
        import torch  # noqa: F401
        import vllm
    except Exception:  # vllm needs torch and its own dependencies
        return False
    return str(vllm.__version__).startswith("0.26.0")


@pytest.mark.skipif(not _vllm_importable(), reason="vllm 0.26.0 (and torch) not importable")
def test_real_vllm_parser_agrees_and_accepts_every_command() -> None:
    """Where vLLM 0.26.0 imports, its own `vllm serve` parser has exactly the inventory's
    options (booleans and choices alike) and parses every command to the planned values."""
    mod = _extractor()
    parser = mod.vllm_serve_parser()
    assert mod.compare_with_parser(parser, FLAGS) == []
    for d in VARIANTS:
        argv = serve_command(d)
        ns = parser.parse_args(argv[2:])
        assert ns.model_tag == argv[2]
        assert ns.tensor_parallel_size == d.tp
        assert ns.max_num_batched_tokens == d.engine.max_num_batched_tokens
        assert ns.enable_prefix_caching is d.engine.enable_prefix_caching
        assert ns.scheduling_policy == d.engine.scheduling_policy
        assert ns.limit_mm_per_prompt == (d.engine.limit_mm_per_prompt or {})
        assert (ns.speculative_config is None) is (d.engine.speculative is None)


# -- vllm serve ------------------------------------------------------------------------------


@pytest.mark.parametrize("d", VARIANTS, ids=IDS)
def test_every_flag_exists_in_vllm_0_26_0(d: PoolDeploy) -> None:
    """Every option serve_command emits is one vLLM 0.26.0's serve parser registers."""
    argv = serve_command(d)
    assert argv[:2] == ["vllm", "serve"]
    missing = [o for o in _options(argv) if o not in FLAGS]
    assert not missing, missing


@pytest.mark.parametrize("d", VARIANTS, ids=IDS)
def test_argv_parses_with_the_inventory_kinds(d: PoolDeploy) -> None:
    """Values have the kind 0.26.0 parses (int, float, JSON, choice) and flags take none."""
    ns = _inventory_parser().parse_args(serve_command(d)[2:])
    e = d.engine
    assert ns.tensor_parallel_size == d.tp
    assert ns.max_num_seqs == e.max_num_seqs
    assert ns.max_num_batched_tokens == e.max_num_batched_tokens
    assert ns.gpu_memory_utilization == e.gpu_memory_utilization
    assert ns.enable_prefix_caching is e.enable_prefix_caching
    assert ns.scheduling_policy in (None, "priority")
    assert (ns.scheduling_policy or "fcfs") == e.scheduling_policy
    assert (ns.kv_cache_dtype or "auto") == e.kv_cache_dtype
    # left unset where vLLM's default is the pool's: on, except with a draft model
    draft = e.speculative is not None and e.speculative.method == "draft_model"
    asked = ns.async_scheduling if ns.async_scheduling is not None else not draft
    assert asked is e.async_scheduling
    assert (ns.async_scheduling is None) is (e.async_scheduling and not draft)
    assert ns.limit_mm_per_prompt == e.limit_mm_per_prompt
    if e.speculative is None:
        assert ns.speculative_config is None
    else:
        assert ns.speculative_config["method"] == e.speculative.method
        assert ns.speculative_config["num_speculative_tokens"] == (
            e.speculative.num_speculative_tokens)


@pytest.mark.parametrize("d", VARIANTS, ids=IDS)
def test_json_valued_flags_parse_as_json(d: PoolDeploy) -> None:
    """The value after each JSON-kind flag is valid JSON, also after a shell round trip."""
    argv = shlex.split(shlex.join(serve_command(d)))
    for i, a in enumerate(argv):
        if a in FLAGS and FLAGS[a]["kind"] == "json":
            assert isinstance(json.loads(argv[i + 1]), dict)


@pytest.mark.parametrize("d", VARIANTS, ids=IDS)
def test_never_disable_log_requests(d: PoolDeploy) -> None:
    """--disable-log-requests is gone in 0.26.0: it appears in no command or manifest."""
    assert "--disable-log-requests" not in serve_command(d)
    assert "disable-log-requests" not in k8s_deployment(d)


def test_text_only_pool_gets_limit_mm_json() -> None:
    """A text-only pool gets --limit-mm-per-prompt '{"image": 0}', JSON as 0.26.0 spells it."""
    pool = Pool(name="text", model="gemma-4-31b",
                engine=EngineConfig(limit_mm_per_prompt={"image": 0}))
    argv = serve_command(pool)
    i = argv.index("--limit-mm-per-prompt")
    assert argv[i + 1] == '{"image": 0}'
    assert """--limit-mm-per-prompt '{"image": 0}'""" in shlex.join(argv)
    assert not any("vision encoder" in n for n in serve_notes(pool))


def test_example_mix_commands() -> None:
    """The example mix: interactive pool with priority and small prefill chunks, batch pool
    with a draft model, vision pool in online FP8 keeping its image limit."""
    by = {d.pool: serve_command(d) for d in VARIANTS}
    inter = by["interactive"]
    assert inter[2] == "meta-llama/Llama-3.1-8B"
    assert shlex.join(inter).endswith(
        "--max-num-batched-tokens 512 --gpu-memory-utilization 0.92 --max-model-len 16384 "
        "--enable-prefix-caching --scheduling-policy priority")
    spec = json.loads(by["batch"][by["batch"].index("--speculative-config") + 1])
    assert spec == {"method": "draft_model", "num_speculative_tokens": 4,
                    "model": "meta-llama/Llama-3.2-1B-Instruct"}
    vision = by["vision"]
    assert vision[2] == "google/gemma-4-31B-it"
    assert vision[vision.index("--quantization") + 1] == "fp8"
    assert vision[vision.index("--limit-mm-per-prompt") + 1] == '{"image": 1}'


def test_defaults_are_left_out_and_changes_spelt_out() -> None:
    """--block-size only off 16, --no-async-scheduling only when disabled, prefix caching
    always explicit, --long-prefill-token-threshold only when set."""
    plain = serve_command(_pool())
    assert "--block-size" not in plain and "--no-async-scheduling" not in plain
    assert "--enable-prefix-caching" in plain and "--scheduling-policy" not in plain
    assert "--long-prefill-token-threshold" not in plain and "--quantization" not in plain
    assert plain[plain.index("--max-model-len") + 1] == "131072"  # the model's context
    d = {x.pool: serve_command(x) for x in VARIANTS}["fp8kv"]
    joined = shlex.join(d)
    for part in ("--tensor-parallel-size 2", "--block-size 32", "--no-enable-prefix-caching",
                 "--kv-cache-dtype fp8", "--quantization fp8",
                 "--long-prefill-token-threshold 2048", "--no-async-scheduling"):
        assert part in joined


def test_a_draft_model_pool_asks_for_async_scheduling() -> None:
    """vLLM 0.26.0 leaves async scheduling off for a draft model unless asked
    (vllm/config/vllm.py); the plan simulated it on, so the command asks. MTP keeps the
    default on; a pool that turned it off says so."""
    draft = {"method": "draft_model", "num_speculative_tokens": 4}
    assert "--async-scheduling" in serve_command(_pool(speculative=draft))
    off = serve_command(_pool(speculative=draft, async_scheduling=False))
    assert "--no-async-scheduling" in off and "--async-scheduling" not in off
    mtp = serve_command(_pool(speculative={"method": "mtp", "num_speculative_tokens": 2}))
    assert "--async-scheduling" not in mtp and "--no-async-scheduling" not in mtp


def test_an_ngram_pool_runs_without_async_scheduling() -> None:
    """vLLM 0.26.0 cannot run the CPU n-gram drafter with async scheduling: the pool turns
    it off, and refuses to be asked for it."""
    ngram = {"method": "ngram", "num_speculative_tokens": 3}
    pool = _pool(speculative=ngram)
    assert not pool.engine.async_scheduling
    assert "--no-async-scheduling" in serve_command(pool)
    with pytest.raises(ValueError, match="async_scheduling: false"):
        _pool(speculative=ngram, async_scheduling=True)


def test_four_bit_pools_serve_a_placeholder_checkpoint() -> None:
    """NVFP4/AWQ need a pre-quantised checkpoint: the id is a placeholder, a note says so,
    no --quantization (vLLM reads the format from the checkpoint); no id is invented."""
    by = {x.pool: x for x in VARIANTS}
    for name, fmt, hf in (("nvfp4-mtp", "nvfp4", "google/gemma-4-31B-it"),
                          ("awq-eagle", "awq", "meta-llama/Llama-3.3-70B-Instruct")):
        argv = serve_command(by[name])
        assert argv[2] == f"<{fmt} checkpoint of {hf}>"
        assert "--quantization" not in argv
        assert any(f"<{fmt} checkpoint of {hf}>" in n for n in serve_notes(by[name]))
    eagle = serve_command(by["awq-eagle"])
    sc = json.loads(eagle[eagle.index("--speculative-config") + 1])
    assert sc["model"].startswith("<eagle3 head for")
    mtp = serve_command(by["nvfp4-mtp"])  # Gemma 4's drafter ships as its own checkpoint
    assert json.loads(mtp[mtp.index("--speculative-config") + 1]) == {
        "method": "mtp", "num_speculative_tokens": 4, "model": "google/gemma-4-31B-it-assistant"}
    assert any("gemma-4-31B-it-assistant" in n for n in serve_notes(by["nvfp4-mtp"]))


def test_vision_model_without_limit_gets_a_note() -> None:
    """A vision model with no image limit keeps its encoder reservation (as planned) and a
    note suggests the text-only flag."""
    pool = Pool(name="v", model="gemma-4-31b")
    assert "--limit-mm-per-prompt" not in serve_command(pool)
    assert any("""'{"image": 0}'""" in n for n in serve_notes(pool))


# -- Kubernetes ------------------------------------------------------------------------------


@pytest.mark.parametrize("d", VARIANTS, ids=IDS)
def test_k8s_yaml_parses_with_replicas_and_gpus(d: PoolDeploy) -> None:
    """The manifest parses; the Deployment has the planned replicas, `tp` GPUs per pod
    (requests = limits), the 0.26.0 image, the serve args, a /health readiness probe and a
    memory-backed /dev/shm; the Service selects its pods."""
    dep, svc = list(yaml.safe_load_all(k8s_deployment(d)))
    assert dep["kind"] == "Deployment" and svc["kind"] == "Service"
    assert dep["spec"]["replicas"] == d.replicas
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["image"] == "vllm/vllm-openai:v0.26.0"
    assert c["resources"]["requests"]["nvidia.com/gpu"] == d.tp
    assert c["resources"]["limits"]["nvidia.com/gpu"] == d.tp
    assert c["command"] + c["args"][: len(serve_command(d)) - 2] == serve_command(d)
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    assert c["volumeMounts"] == [{"name": "shm", "mountPath": "/dev/shm"}]
    assert pod["volumes"][0]["emptyDir"]["medium"] == "Memory"
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert all(labels[k] == v for k, v in svc["spec"]["selector"].items())
    assert dep["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]


def test_k8s_names_are_dns_labels() -> None:
    """Pool names with '_', '.' or capitals become valid Kubernetes names."""
    d = PoolDeploy.from_pool(Pool(name="Chat_EU.1", model="llama-3.1-8b"), 1)
    dep, _ = list(yaml.safe_load_all(k8s_deployment(d)))
    assert dep["metadata"]["name"] == "vllm-chat-eu-1"


# -- plans and the CLI -----------------------------------------------------------------------


def _plan_for_mix() -> Plan:
    """A Plan for the example mix with fixed replica counts, built on the solver's golden plan
    (running `capplan size` takes too long for a unit test)."""
    golden = yaml.safe_load((ROOT / "tests/data/size-small-plan.yaml").read_text())
    template = golden["pools"][0]
    pools = []
    for p in MIX.pools:
        r = REPLICAS[p.name]
        pools.append({**template, "pool": p.name, "model": p.model, "gpu": p.gpu, "tp": p.tp,
                      "precision": str(p.precision), "engine": p.engine.model_dump(mode="json"),
                      "replicas_for_slo": r, "spare": 0, "replicas": r, "gpus": r * p.tp})
    golden.setdefault("source", MIX.source)  # the golden file leaves the path out
    return Plan.model_validate({**golden, "mix": MIX.name, "pools": pools})


def test_plan_pools_translate_like_mix_pools() -> None:
    """A planned pool deploys exactly as the mix pool it was planned from."""
    plan = _plan_for_mix()
    for p in plan.pools:
        mix_pool = MIX.pool(p.pool)
        assert PoolDeploy.from_pool_plan(p) == PoolDeploy.from_pool(mix_pool, p.replicas)
        assert serve_command(p) == serve_command(mix_pool)


def test_plan_engine_unknown_setting_is_an_error() -> None:
    """An engine setting deploy cannot translate is an error naming it, never dropped."""
    plan = _plan_for_mix()
    p = plan.pools[0].model_copy(update={"engine": {**plan.pools[0].engine, "swap_space": 4}})
    with pytest.raises(ConfigError, match="swap_space"):
        PoolDeploy.from_pool_plan(p)


def test_cli_shell_prints_one_command_per_pool(tmp_path: Path) -> None:
    """`capplan deploy PLAN.json` prints each pool's comment and shell-quoted command."""
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(_plan_for_mix().to_json())
    res = CliRunner().invoke(main, ["deploy", str(plan_path),
                                    "--traffic", str(ROOT / "examples/production-mix.yaml")])
    assert res.exit_code == 0, res.output
    commands = [line for line in res.output.splitlines() if line.startswith("vllm serve ")]
    assert len(commands) == len(MIX.pools)
    for line, p in zip(commands, MIX.pools, strict=True):
        assert shlex.split(line) == serve_command(p)
    assert "# pool interactive: 5 replica(s)" in res.output


def test_cli_k8s_writes_one_file_per_pool(tmp_path: Path) -> None:
    """`--format k8s --out DIR` writes one manifest per pool with the plan's replicas."""
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(_plan_for_mix().to_json())
    out = tmp_path / "k8s"
    res = CliRunner().invoke(main, ["deploy", str(plan_path), "--format", "k8s",
                                    "--out", str(out)])
    assert res.exit_code == 0, res.output
    files = sorted(out.glob("*.yaml"))
    assert [f.name for f in files] == sorted(f"vllm-{p.name}.yaml" for p in MIX.pools)
    for f in files:
        dep, _ = list(yaml.safe_load_all(f.read_text()))
        assert dep["spec"]["replicas"] == REPLICAS[dep["metadata"]["name"].removeprefix("vllm-")]


def test_cli_bad_plan_is_one_line(tmp_path: Path) -> None:
    """A missing or malformed plan is one error line naming the file, exit code 2."""
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    for path in (bad, tmp_path / "missing.json"):
        res = CliRunner().invoke(main, ["deploy", str(path)])
        assert res.exit_code == 2
        assert str(path) in res.output and "Traceback" not in res.output


@pytest.mark.parametrize(("option", "value", "says"), [
    ("--namespace", "Bad NS!", "'Bad NS!' is not a Kubernetes namespace"),
    ("--namespace", "prod-", "'prod-' is not a Kubernetes namespace"),
    ("--namespace", "x" * 64, "is not a Kubernetes namespace"),
    ("--image", "", "'' is not a container image"),
    ("--image", "vllm/vllm-openai: v0.26.0", "is not a container image"),
])
def test_cli_k8s_options_are_checked(tmp_path: Path, option: str, value: str, says: str) -> None:
    """Rule: bad input is one line naming the option and the fix. A namespace that is not a
    DNS-1123 label, or an empty image, is refused rather than written into the manifests."""
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(_plan_for_mix().to_json())
    out = tmp_path / "k8s"
    res = CliRunner().invoke(main, ["deploy", str(plan_path), "--format", "k8s", option, value,
                                    "--out", str(out)])
    assert res.exit_code == 2
    assert res.output.startswith(f"error: {option}: ") and says in res.output
    assert res.output.count("\n") == 1 and not out.exists()
    with pytest.raises(ConfigError, match=option):
        k8s_deployment(MIX.pools[0], **{option.removeprefix("--"): value})
    ok = CliRunner().invoke(main, ["deploy", str(plan_path), "--format", "k8s",
                                   "--namespace", "serving-2"])
    assert ok.exit_code == 0 and "namespace: serving-2" in ok.output


def test_cli_unknown_model_names_the_plan_and_writes_nothing(tmp_path: Path) -> None:
    """A plan pool with a model capplan does not know is one line naming the plan file and
    the field; no pool's file is written (nothing half-written)."""
    plan = _plan_for_mix()
    pools = list(plan.pools)
    pools[-1] = pools[-1].model_copy(update={"model": "llama-9b"})
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(plan.model_copy(update={"pools": pools}).to_json())
    out = tmp_path / "sh"
    res = CliRunner().invoke(main, ["deploy", str(plan_path), "--out", str(out)])
    assert res.exit_code == 2
    assert f"{plan_path}: pools.{len(pools) - 1}.model: " in res.output
    assert "unknown model 'llama-9b'" in res.output and not out.exists()


def test_replicas_get_the_routing_the_plan_was_sized_behind() -> None:
    """A pool of several replicas is told what must spread its requests (a Service balances
    connections, not requests); the golden plan (test_solve.py) pins the router in the JSON."""
    pool = Pool(name="v", model="llama-3.1-8b", precision="bf16")
    one = PoolDeploy.from_pool(pool, 1)
    assert not any(n.startswith("routing:") for n in serve_notes(one))
    many = PoolDeploy.from_pool(pool, 4)
    (note,) = [n for n in serve_notes(many) if n.startswith("routing:")]
    assert "4 replicas" in note and "fewest unfinished" in note and "Service" in note
    rr = PoolDeploy.from_pool(pool.model_copy(update={"router": "round_robin"}), 4)
    assert any("in turn" in n for n in serve_notes(rr))
    assert "# NOTE: routing:" in k8s_deployment(many)


@pytest.mark.parametrize(("mix", "says"), [
    ("examples/chat-only.yaml", "pool 'interactive' of the plan is not in the mix"),
])
def test_cli_refuses_a_mix_the_plan_was_not_sized_for(tmp_path: Path, mix: str,
                                                      says: str) -> None:
    """`deploy --traffic` takes engine settings from the mix, so it must be the plan's mix:
    another one is refused, naming it, as `report` and `validate plan` refuse it (deploy
    printed the plan's pools with the other mix's settings)."""
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(_plan_for_mix().to_json())
    res = CliRunner().invoke(main, ["deploy", str(plan_path), "--traffic", str(ROOT / mix)])
    assert res.exit_code == 2, res.output
    assert res.output.startswith(f"error: {ROOT / mix}: {says}; give the traffic mix")


def test_cli_refuses_a_mix_that_fixes_other_settings(tmp_path: Path) -> None:
    """The same mix with a pool's precision changed is not the plan's either."""
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(_plan_for_mix().to_json())
    text = (ROOT / "examples/production-mix.yaml").read_text()
    other = tmp_path / "mix.yaml"
    other.write_text(text.replace("precision: bf16", "precision: fp8", 1))
    assert other.read_text() != text
    res = CliRunner().invoke(main, ["deploy", str(plan_path), "--traffic", str(other)])
    assert res.exit_code == 2, res.output
    assert "precision is 'bf16' in the plan and 'fp8' in the mix" in res.output
