"""Write notebooks/*.ipynb from the cells below, executed so their outputs can be read.

    python scripts/make_notebooks.py             # write and execute (needs nbclient)
    python scripts/make_notebooks.py --no-run    # write without outputs

The notebooks are generated so that their source stays reviewable as Python here;
tests/test_notebooks.py runs them with nbclient, so an API change that breaks one fails CI.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"

# Runs from notebooks/ (nbclient's working directory) or the repository root.
_SETUP = """\
import os
import sys
from pathlib import Path

import polars as pl

ROOT = Path.cwd() if (Path.cwd() / "examples").is_dir() else Path.cwd().parent
os.chdir(ROOT)  # model specs and calibration profiles are found from the repository root
pl.Config.set_tbl_cols(12)
pl.Config.set_tbl_width_chars(140);"""

WHAT_IF: list[tuple[str, str]] = [
    ("md", """\
# What if? Precision, speculative decoding and pool layout

A what-if study on `examples/production-mix.yaml` with the profiles shipped under
`calibration/` (H200, vLLM 0.26.0, Llama 3.1 8B in bf16, fp8 and bf16 with a draft model).
Each question changes one thing in the traffic mix and asks `size_mix` for the fewest
replicas that still meet every SLO.

`quick=True` sizes from short simulations so the notebook runs in well under a minute; its
answers are rough (use `capplan size` without `--quick` for a plan you deploy)."""),
    ("code", _SETUP),
    ("code", """\
from capplan.mix import load_mix
from capplan.sim.run import simulate
from capplan.solve.options import size_mix, with_pool

mix = load_mix("examples/production-mix.yaml")


def sized(mix, pools, label):
    \"\"\"One row per pool: the fewest replicas meeting its SLOs (quick sizing, seed 0).\"\"\"
    plan = size_mix(mix, quick=True, advice=False, pools=pools, seed=0)
    return pl.DataFrame([
        {"variant": label, "pool": p.pool, "precision": p.precision, "replicas": p.replicas,
         "gpus": p.gpus, "binding": f"{p.binding_workload} {p.binding_slo}",
         "usd_per_month": round(p.cost.usd_per_month), "profile": p.profile}
        for p in plan.pools
    ])


[(p.name, str(p.precision), p.engine.speculative) for p in mix.pools]"""),
    ("md", """\
## 1. Precision: the interactive pool in bf16 or fp8

fp8 weights halve the weight memory (more KV cache per replica) and speed up the
memory-bound decode steps, if the fp8 kernels are fast at these batch sizes: the measured
profiles decide. First the latency at a fixed replica count, then the sizing."""),
    ("code", """\
interactive = mix.pool("interactive")
fp8 = with_pool(mix, interactive.model_copy(update={"precision": "fp8"}))

latency = pl.concat([
    simulate(m, "interactive", 4, duration_s=20, seed=0).to_polars()
    .select("name", "ttft_p99_s", "itl_p99_s", "slo_met")
    .with_columns(pl.lit(label).alias("precision"))
    for m, label in ((mix, "bf16"), (fp8, "fp8"))
])
latency"""),
    ("code", """\
precision = pl.concat([
    sized(mix, ["interactive"], "bf16"),
    sized(fp8, ["interactive"], "fp8"),
])
precision"""),
    ("md", """\
## 2. Speculative decoding for the batch workload

The batch pool runs a Llama 3.2 1B draft model with k = 4 speculative tokens. Its only SLO
is end to end, so what matters is throughput per GPU: does the draft pay for itself?

The simulator prices the draft model's steps as calibrated, with every draft rejected
(dummy weights). Served with 70 % of its drafts accepted (vLLM's synthetic rejection
sampler), the real engine ran those steps 16–64 % slower than priced and the pool's E2E
p99 27–30 % over the prediction: on the H200 this draft model did not pay for itself
(`docs/validation.md`, "Speculative decoding with its drafts accepted"). Acceptance was not
the cause: the draft model's own pass, bound by its launches, ran that slow accepting
nothing too, and its speed moves with the host's ("The draft model's slow steps")."""),
    ("code", """\
batch = mix.pool("batch")
no_spec = with_pool(
    mix, batch.model_copy(update={"engine": batch.engine.model_copy(update={"speculative": None})})
)
spec = pl.concat([
    sized(mix, ["batch"], "draft model, k=4"),
    sized(no_spec, ["batch"], "no speculation"),
])
spec"""),
    ("md", """\
## 3. One pool or two for the interactive workloads

chat has short prompts; rag and agent have ~3,600-token prompts whose prefill chunks share
steps with chat's decodes. Splitting them into two pools isolates chat from long prefills
but gives up pooling. Which needs fewer GPUs?"""),
    ("code", """\
chat_pool = interactive.model_copy(update={"name": "chat"})
long_pool = interactive.model_copy(update={"name": "long-prompts"})
split = mix.model_copy(update={
    "pools": [chat_pool, long_pool, *[p for p in mix.pools if p.name != "interactive"]],
    "workloads": [
        w.model_copy(update={"pool": "chat" if w.name == "chat" else "long-prompts"})
        if w.pool == "interactive" else w
        for w in mix.workloads
    ],
})
layout = pl.concat([
    sized(mix, ["interactive"], "one pool"),
    sized(split, ["chat", "long-prompts"], "split"),
])
layout.group_by("variant", maintain_order=True).agg(
    pl.col("gpus").sum(), pl.col("usd_per_month").sum(), pl.col("pool")
)"""),
    ("md", """\
## 4. The vision pool's inter-token SLO and the encoder

Gemma 4's vision encoder runs eagerly in the step that schedules a picture's first chunk,
and every decode in that step waits for it: a pass of 34.0 ms for one picture on the H200,
measured in the engine's own worker, and the step around it, measured whole beside its text
twin (`docs/calibration.md`, "The vision encoder" and "A picture's step"). Once such steps
are more than 1 % of the inter-token gaps, ITL p99 counts them, so the replicas the vision
pool needs turn on how tight its ITL p99 limit is, not on throughput."""),
    ("code", """\
vision = mix.pool("vision")
itl = pl.concat([
    simulate(mix, "vision", n, duration_s=60, seed=0).to_polars()
    .select("name", "ttft_p99_s", "itl_p50_s", "itl_p99_s")
    .with_columns(pl.lit(n).alias("replicas"))
    for n in (6, 8, 9)
])
itl"""),
    ("md", """\
The p99 is whether more than 1 % of the gaps carry such a step, so the router matters:
least-outstanding routing (the default) sends a picture to the replica with the fewest
decodes to stall. Behind round robin, or for one replica taking a random ninth of the load:"""),
    ("code", """\
round_robin = with_pool(mix, vision.model_copy(update={"router": "round_robin"}))
one = mix.model_copy(update={"workloads": [
    w.model_copy(update={"arrival": w.arrival.model_copy(update={"rate_rps": 10 / 9})})
    if w.name == "vision" else w for w in mix.workloads]})
routers = pl.concat([
    simulate(m, "vision", n, seed=0).to_polars().select("name", "itl_p99_s")
    .with_columns(pl.lit(label).alias("router"), pl.lit(n).alias("replicas"))
    for m, n, label in ((mix, 9, "least-outstanding"), (round_robin, 9, "round robin"),
                        (round_robin, 10, "round robin"), (one, 1, "a ninth of the load"))
])
routers"""),
    ("md", """\
Measured whole, a step that encodes a picture took ~35-60 or ~75-145 ms more than its text
twin, in spells (`docs/calibration.md`, "A picture's step"): the engine core's CPU runs slow in
spells, and the picture's step, its most CPU-bound, shows it most. The profile keeps the 480
steps the encoder engine measured on six leases (`encoder_step_draws_s`) and the simulator
draws one for each such step. A host whose engine core ran slow more often
(`docs/validation.md`, the nineteenth and twenty-first sessions') would need more: the same
simulation with every picture's step priced longer:"""),
    ("code", """\
from capplan.modelspec import load_model_spec
from capplan.profiles import resolve_profile

prof = resolve_profile(vision, load_model_spec(vision.model))


def around(extra_s):
    \"\"\"The vision profile with every picture's step `extra_s` longer than measured.\"\"\"
    step = prof.step
    return prof.model_copy(update={"step": step.model_copy(update={
        "encoder_step_s": step.encoder_step_s + extra_s,
        "encoder_step_draws_s": [d + extra_s for d in step.encoder_step_draws_s],
        "encoder_slow_above_s": step.encoder_slow_above_s + extra_s})})


stall = pl.concat([
    simulate(mix, "vision", n, seed=0, profile=around(extra)).to_polars()
    .select("name", "itl_p99_s", "slo_met")
    .with_columns(pl.lit(extra * 1e3).alias("extra_ms"), pl.lit(n).alias("replicas"))
    for extra in (0.0, 0.025, 0.05) for n in (9, 10)
])
stall"""),
    ("code", """\
def with_itl(mix, limit_s):
    \"\"\"The mix with the vision workload's ITL p99 limit at `limit_s`.\"\"\"
    wls = [w.model_copy(update={"slo": w.slo.model_validate(
               {"ttft_p99_s": 1.0, "itl_p99_s": limit_s})}) if w.name == "vision" else w
           for w in mix.workloads]
    return mix.model_copy(update={"workloads": wls})


encoder = pl.concat([sized(with_itl(mix, limit), ["vision"], f"ITL p99 <= {limit * 1e3:g} ms")
                     for limit in (0.05, 0.075, 0.1)])
encoder"""),
    ("md", """\
## Summary

Every variant side by side. Numbers come from quick sizing on short simulations with the
measured profiles; confirm the one you pick with a full `capplan size`."""),
    ("code", """\
summary = pl.concat([precision, spec, layout, encoder])
assert (summary["gpus"] > 0).all()
summary"""),
]

TRACE_TO_PLAN: list[tuple[str, str]] = [
    ("md", """\
# From a request log to a plan

`examples/requests.csv` is a recorded request log (one row per request: arrival time,
prompt and output tokens, prefix group). This walk-through fits a traffic mix to it,
simulates that mix, and sizes a pool for it, all through the Python API. The same steps on
the command line:

```
capplan traffic from-trace examples/requests.csv --out traffic.yaml
capplan size --traffic traffic.yaml --quick
```"""),
    ("code", _SETUP),
    ("code", """\
requests = pl.read_csv("examples/requests.csv")
print(f"{requests.height} requests over {requests['arrival_s'].max():.0f} s")
requests.describe()"""),
    ("md", """\
## 1. Fit a traffic mix

`fit_trace` fits the arrival process (Poisson or bursty gamma), the prompt and output length
distributions, and writes them as a traffic mix. The SLOs are ours to give."""),
    ("code", """\
from capplan.tracefit import fit_trace, to_yaml

mix = fit_trace("examples/requests.csv", slo={"ttft_p99_s": 0.5, "itl_p99_s": 0.05})
print(to_yaml(mix)[:1200])"""),
    ("md", """\
## 2. Simulate it

One H200 replica of Llama 3.1 8B in bf16, 60 simulated seconds."""),
    ("code", """\
from capplan.sim.run import simulate

result = simulate(mix, "default", 1, duration_s=60, seed=0)
result.to_polars().select(
    "name", "requests", "completed", "ttft_p50_s", "ttft_p99_s", "itl_p99_s", "slo_met"
)"""),
    ("code", """\
# Per-request rows: the latency distribution behind the percentiles.
result.requests().select(pl.col("ttft_s").quantile(q).alias(f"ttft_p{q * 100:g}")
                         for q in (0.5, 0.9, 0.99))"""),
    ("md", """\
## 3. Size it

`size_mix` searches for the fewest replicas meeting every SLO. The recorded traffic fits on
one GPU, so we also ask what the same traffic needs at 4x and 8x its rate (`growth`)."""),
    ("code", """\
from capplan.solve.options import size_mix

plans = {g: size_mix(mix, quick=True, growth=g, seed=0) for g in (1, 4, 8)}
plans[1].to_polars().select("pool", "gpus", "precision", "workload", "slo", "limit_s",
                            "value_s", "met")"""),
    ("code", """\
growth = pl.DataFrame([
    {"growth": g, "rate_rps": round(mix.workloads[0].arrival.rate_rps * g, 2), "gpus": p.gpus,
     "binding": f"{p.pools[0].binding_workload} {p.pools[0].binding_slo}",
     "usd_per_month": round(p.usd_per_month)}
    for g, p in plans.items()
])
assert growth["gpus"].is_sorted(), "GPUs must not fall as traffic grows"
growth"""),
    ("md", """\
Next: `capplan report plan.json --out report.html` turns a plan into a page to forward, and
`capplan deploy plan.json` prints the `vllm serve` command for each pool."""),
]


def build(cells: list[tuple[str, str]]) -> nbformat.NotebookNode:
    nb = new_notebook(
        cells=[new_markdown_cell(src) if kind == "md" else new_code_cell(src)
               for kind, src in cells],
        metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
            "language_info": {"name": "python"},
        },
    )
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i}"  # stable ids: regenerating gives the same bytes
    return nb


def main(argv: list[str]) -> None:
    NOTEBOOKS.mkdir(exist_ok=True)
    for name, cells in (("what-if", WHAT_IF), ("trace-to-plan", TRACE_TO_PLAN)):
        path = NOTEBOOKS / f"{name}.ipynb"
        nb = build(cells)
        if "--no-run" not in argv:
            from nbclient import NotebookClient

            NotebookClient(nb, kernel_name="python3", timeout=120, record_timing=False,
                           resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
        nbformat.validate(nb)
        nbformat.write(nb, path)
        print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
