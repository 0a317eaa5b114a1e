"""`capplan calibrate` on a machine without a GPU: bad input gives one clear line and an
exit code, a failing engine keeps the points already measured, and raw output refits."""

from __future__ import annotations

import json
import lzma
import shutil
import sys
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from capplan.calibrate import cli as ccli
from capplan.calibrate import store
from capplan.cli import main
from capplan.errors import CalibrationError, ConfigError
from capplan.hardware import Precision
from capplan.modelspec import load_model_spec
from capplan.profile import Profile, StepModel
from capplan.steptime import StepTimer

RAW = store.CALIBRATION_DIR / "_raw"


def _run(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(main, ["calibrate", *args])
    return res.exit_code, res.output


def test_unknown_model_is_one_line() -> None:
    """An unknown model spec names the option, the spec file and the known ones."""
    code, out = _run("--model", "no-such-model", "--dry-run")
    assert code == 2 and "unknown model 'no-such-model'" in out and "Traceback" not in out
    assert out.startswith("error: --model: ")


def test_unsupported_precision() -> None:
    code, out = _run("--model", "llama-3.1-8b", "--precision", "int3", "--dry-run")
    assert code == 2 and "unsupported precision 'int3'" in out


def test_tensor_parallel_is_refused() -> None:
    code, out = _run("--model", "llama-3.1-8b", "--tp", "2", "--dry-run")
    assert code == 2 and "tensor parallel" in out


def test_no_vllm_is_a_calibration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without vLLM the command stops before doing anything, with exit code 4."""
    monkeypatch.setattr(ccli.importlib.util, "find_spec", lambda name: None)
    code, out = _run("--model", "llama-3.1-8b")
    assert code == 4 and "vLLM is not installed" in out


def test_dry_run_lists_engines() -> None:
    """One timed engine per precision and k; KV-only engines for the other utilisations."""
    code, out = _run("--model", "llama-3.1-8b", "--precision", "bf16,fp8", "--spec-tokens",
                     "0,2", "--dry-run")
    assert code == 0
    assert out.split() == ["llama-3.1-8b--bf16", "llama-3.1-8b--bf16-draft_model2",
                           "llama-3.1-8b--fp8", "llama-3.1-8b--fp8-draft_model2",
                           "llama-3.1-8b--bf16--u85", "(KV", "only)",
                           "llama-3.1-8b--bf16--u95", "(KV", "only)"]


def test_engine_failure_keeps_measured_points(monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    """An engine that dies (here: out of memory) is reported in one line; the raw samples
    already written stay, and the next run resumes from them."""
    fake = tmp_path / "runner.py"
    fake.write_text(
        "import sys\n"
        "out = sys.argv[sys.argv.index('--out') + 1]\n"
        "open(out, 'a').write('{\"kind\": \"point_done\", \"point\": \"p1\"}\\n')\n"
        "print('capplan-runner: out of memory at point p2', file=sys.stderr)\n"
        "sys.exit(4)\n")
    monkeypatch.setattr(ccli, "RUNNER", fake)
    monkeypatch.setattr(ccli.importlib.util, "find_spec", lambda name: object())
    code, out = _run("--model", "llama-3.1-8b", "--gpu-memory-utilization", "0.90",
                     "--out", str(tmp_path), "--budget-s", "1")
    assert code == 4 and "out of memory at point p2" in out and "points kept" in out
    raw = tmp_path / "_raw" / "llama-3.1-8b--bf16.jsonl"
    assert "p1" in raw.read_text()
    assert (tmp_path / "_raw" / "rc.txt").read_text().startswith("llama-3.1-8b--bf16 rc=4")


def test_incomplete_point_is_dropped_complete_ones_kept(tmp_path: Path) -> None:
    """Reading raw output after a crash keeps every complete point and drops the cut one."""
    src = RAW / "qwen3-32b--bf16.jsonl.xz"
    lines = lzma.decompress(src.read_bytes()).decode().splitlines()
    steps = [json.loads(ln) for ln in lines[:5] if '"step"' in ln]
    cut = [json.dumps({**r, "point": "cut"}) for r in steps]  # a point that never finished
    path = tmp_path / "x.jsonl"
    path.write_text("\n".join([*lines, *cut, cut[-1][:20]]))
    full = store.read_runner_jsonl(src)
    kept = store.read_runner_jsonl(path)
    assert "cut" not in kept["point"].to_list()
    assert len(kept) == len(full)


def test_refit_from_raw_reproduces_shipped(tmp_path: Path) -> None:
    """`--from-raw` rebuilds a shipped profile from the raw runner output, coefficient for
    coefficient: its main run and its second (`--r2`), fitted together, its prefix-cache
    engine's run (`--cache`), which gives the shared-prefix saving, its graph scan
    (`--graphs`), which gives the decode-only steps' own terms, and the model's core times
    (`core-launch/`, from a serving engine's core trace)."""
    raw = tmp_path / "raw"
    raw.mkdir()
    for f in [*RAW.glob("qwen3-32b--bf16.*"), *RAW.glob("qwen3-32b--bf16--r2.*"),
              *RAW.glob("qwen3-32b--bf16--cache.*"), *RAW.glob("qwen3-32b--bf16--graphs.*")]:
        shutil.copy(f, raw)
    (raw / "core-launch").mkdir()
    shutil.copy(RAW / "core-launch" / "qwen3-32b.json", raw / "core-launch")
    (raw / "rc.txt").write_text("qwen3-32b--bf16 rc=0 s=171\n")
    code, out = _run("--from-raw", str(raw), "--out", str(tmp_path / "cal"))
    assert code == 0, out
    new = json.loads((tmp_path / "cal/h200/vllm-0.26.0/qwen3-32b/bf16/profile.json").read_text())
    old = json.loads((store.CALIBRATION_DIR / "h200/vllm-0.26.0/qwen3-32b/bf16/profile.json")
                     .read_text())
    # a field added since the shipped file was written reads as its default
    new["step"], old["step"] = (StepModel.model_validate(p["step"]).model_dump()
                                for p in (new, old))
    offsets = new["step"].pop("graph_offset_s"), old["step"].pop("graph_offset_s")
    # a BF16 profile takes no lone-prompt offsets (calibrate/build.py)
    assert new["step"].pop("eager_offset_s") == old["step"].pop("eager_offset_s") == {}
    assert new["step"] == pytest.approx(old["step"], rel=1e-9)
    assert offsets[0] == pytest.approx(offsets[1], rel=1e-9, abs=1e-9)
    assert len(offsets[0]) == 35 and new["step"]["graph_ctx_s"] > 0
    assert new["step"]["shared_ctx_saving"] > 0 and new["step"]["core_piecewise_s"] > 0
    assert new["fit"] == old["fit"]


def test_refit_refuses_another_gpus_runs_and_an_empty_folder(tmp_path: Path) -> None:
    """The H100's raw runs refitted without `--gpu h100` are refused before anything is
    written (they went over the H200's profiles), and so is a folder with no run to fit (it
    printed nothing and exited 0)."""
    raw = tmp_path / "raw"
    raw.mkdir()
    for f in (RAW / "h100").glob("qwen3-32b--awq.*"):
        shutil.copy(f, raw)
    out = tmp_path / "cal"
    code, text = _run("--from-raw", str(raw), "--out", str(out))
    assert code == 4 and not out.exists(), text
    assert "NVIDIA H100 80GB HBM3, not an H200; pass --gpu h100" in text
    assert len(text.strip().splitlines()) == 1
    code, text = _run("--from-raw", str(raw), "--out", str(out), "--gpu", "h100")
    assert code == 0 and (out / "h100/vllm-0.26.0/qwen3-32b/awq/profile.json").exists(), text
    empty = tmp_path / "empty"
    empty.mkdir()
    code, text = _run("--from-raw", str(empty), "--out", str(out))
    assert code == 4 and "no measured run to fit" in text


def test_runner_is_plain_python() -> None:
    """The GPU driver imports only vllm, numpy and the standard library."""
    text = (Path(ccli.__file__).with_name("runner.py")).read_text()
    imports = {ln.split()[1].split(".")[0] for ln in text.splitlines()
               if ln.strip().startswith(("import ", "from ")) and not ln.startswith("    #")}
    assert imports <= {"argparse", "json", "os", "subprocess", "sys", "time", "numpy",
                       "torch", "vllm", *sys.stdlib_module_names}


def test_emit_queue_for_the_gpu_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The queue names each engine, a start-up allowance and runner arguments with a plan;
    4-bit precisions get a config.json carrying their quantization_config."""
    monkeypatch.chdir(tmp_path)
    code, out = _run("--model", "qwen3-32b", "--precision", "awq", "--gpu-memory-utilization",
                     "0.90", "--out", str(tmp_path), "--emit-queue", str(tmp_path / "q.txt"))
    assert code == 0, out
    name, min_s, args = (tmp_path / "q.txt").read_text().strip().split("|")
    assert name == "qwen3-32b--awq" and 100 < float(min_s) < 200
    assert "--plan _plans/qwen3-32b--awq.json" in args and "--out" not in args
    cfg = json.loads((tmp_path / "_engines/qwen3-32b-awq/config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "awq"
    # another GPU's plans go to their own folder: the H200's stored plan is left as it was
    before = (tmp_path / "_plans/qwen3-32b--awq.json").read_text()
    code, out = _run("--model", "qwen3-32b", "--precision", "awq", "--gpu", "h100",
                     "--graph-scan", "--gpu-memory-utilization", "0.90", "--out", str(tmp_path),
                     "--emit-queue", str(tmp_path / "q100.txt"), "--budget-s", "30")
    assert code == 0, out
    assert (tmp_path / "_plans/qwen3-32b--awq.json").read_text() == before
    assert not (tmp_path / "_plans/qwen3-32b--awq--graphs.json").exists()
    lines = (tmp_path / "q100.txt").read_text().splitlines()
    assert all("--plan _plans/h100/qwen3-32b--awq" in ln for ln in lines), lines
    assert (tmp_path / "_plans/h100/qwen3-32b--awq--graphs.json").is_file()


def test_queue_allows_a_start_as_long_as_the_longest_measured(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A queued engine's MIN_S covers the longest start measured for engines of its model
    and speculative method (a cold compile), not only the weights' estimate; engines of
    another method or model do not count."""
    monkeypatch.chdir(tmp_path)
    raw = tmp_path / "_raw"
    raw.mkdir()
    for name, start in (("gemma-4-31b--fp8--u85", 240.0), ("gemma-4-31b--fp8-mtp2", 300.0),
                        ("qwen3-32b--fp8", 900.0)):
        (raw / f"{name}.meta.json").write_text(json.dumps({"engine_start_s": start}))

    def min_s(*args: str) -> float:
        code, out = _run("--model", "gemma-4-31b", "--precision", "fp8", *args, "--out",
                         str(tmp_path), "--emit-queue", str(tmp_path / "q.txt"))
        assert code == 0, out
        lines = (tmp_path / "q.txt").read_text().splitlines()
        return float(next(x for x in lines if x.startswith(("gemma-4-31b--fp8-mtp4|",
                                                            "gemma-4-31b--fp8--u95|")))
                     .split("|")[1])

    # a KV-only engine: its start alone; a timed one: its start plus the measuring budget
    assert min_s("--gpu-memory-utilization", "0.95") == pytest.approx(1.15 * 240, abs=1)
    assert min_s("--spec-method", "mtp", "--spec-tokens", "4") == pytest.approx(
        1.15 * 300 + 60, abs=1)
    # another GPU's starts are its own (_raw/<gpu>): the H200's do not count for an H100
    (raw / "h100").mkdir()
    (raw / "h100" / "gemma-4-31b--fp8--u85.meta.json").write_text(
        json.dumps({"engine_start_s": 100.0}))
    weights = 60 + 1.2 * load_model_spec("gemma-4-31b").weight_bytes(Precision("fp8")) / 1e9
    assert min_s("--gpu-memory-utilization", "0.95", "--gpu", "h100") == pytest.approx(
        max(weights, 1.15 * 100), abs=1)


def test_prefix_cache_engine_times_cache_hits_and_is_not_fitted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--prefix-cache` adds an engine with prefix caching on whose plan holds only the
    cache points; `--from-raw` leaves such a run out of the profiles."""
    from capplan.calibrate.build import groups

    monkeypatch.chdir(tmp_path)
    code, out = _run("--model", "llama-3.1-8b", "--precision", "bf16", "--prefix-cache",
                     "--gpu-memory-utilization", "0.90", "--out", str(tmp_path),
                     "--emit-queue", str(tmp_path / "q.txt"))
    assert code == 0, out
    lines = [ln.split("|") for ln in (tmp_path / "q.txt").read_text().splitlines()]
    assert [n for n, _, _ in lines] == ["llama-3.1-8b--bf16", "llama-3.1-8b--bf16--cache"]
    assert "--prefix-caching" in lines[1][2] and "--prefix-caching" not in lines[0][2]
    plan = json.loads((tmp_path / "_plans/llama-3.1-8b--bf16--cache.json").read_text())
    kinds = {p["kind"] for p in plan["points"] if not p.get("warmup")}
    assert kinds == {"cached", "shared", "decode"}
    for name in ("m--bf16", "m--bf16--cache"):
        (tmp_path / f"{name}.meta.json").write_text(json.dumps({"kv": {}}))
        (tmp_path / f"{name}.jsonl").write_text("")
    assert [(g.main, len(g.metas)) for g in groups(tmp_path).values()] == [("m--bf16", 1)]


def test_multimodal_engines_run_text_only_plus_one_with_images() -> None:
    """Gemma 4 has a vision encoder: every engine runs text-only except one KV-only engine
    at 0.90 that keeps the encoder's reservation; the model's hf_overrides go to vLLM."""
    jobs = ccli.plan_jobs("gemma-4-31b", [ccli.Precision.BF16], [0], "draft_model", None,
                          "auto", [0.85, 0.90, 0.95], 1)
    names = {j.name: j for j in jobs}
    assert set(names) == {"gemma-4-31b--bf16", "gemma-4-31b--bf16--u85",
                          "gemma-4-31b--bf16--u95", "gemma-4-31b--bf16--img"}
    img = names.pop("gemma-4-31b--bf16--img")
    assert img.kv_only and img.limit_images is None
    assert all(j.limit_images == 0 for j in names.values())
    args = names["gemma-4-31b--bf16"].runner_args("m", "p.json", "o", "meta", 60)
    assert args[args.index("--limit-images") + 1] == "0"
    assert json.loads(args[args.index("--hf-overrides") + 1]) == {
        "text_config": {"global_head_dim": 512, "num_global_key_value_heads": 4}}
    text = ccli.plan_jobs("llama-3.1-8b", [ccli.Precision.BF16], [0], "draft_model", None,
                          "auto", [0.90], 1)
    assert [j.name for j in text] == ["llama-3.1-8b--bf16"] and text[0].limit_images is None


def test_a_repeat_with_the_encoder_scan_repeats_the_encoder_engine_too() -> None:
    """`--repeat N --encoder-scan` starts the timed engines and the encoder engines as run
    N (`--rN--encoder`: its picture steps join the profile's draws); a model without a
    vision encoder refuses the scan, repeated or not."""
    jobs = ccli.plan_jobs("gemma-4-31b", [ccli.Precision.FP8], [0], "draft_model", None,
                          "auto", [0.85, 0.90, 0.95], 1, repeat=4, encoder_scan=True)
    assert [j.name for j in jobs] == ["gemma-4-31b--fp8--r4", "gemma-4-31b--fp8--r4--encoder"]
    assert jobs[1].encoder_scan and jobs[1].limit_images is None
    for repeat in (0, 2):
        with pytest.raises(ConfigError, match="no vision encoder"):
            ccli.plan_jobs("llama-3.1-8b", [ccli.Precision.BF16], [0], "draft_model", None,
                           "auto", [0.90], 1, repeat=repeat, encoder_scan=True)


def test_image_reservation_is_the_kv_difference_at_one_utilisation() -> None:
    from capplan.calibrate.build import _NAME, image_reservation

    def meta(u: float, tokens: int) -> dict:
        return {"kv": {"gpu_memory_utilization": u, "kv_tokens": tokens}}

    text = [meta(0.90, 500_000), meta(0.85, 450_000)]
    assert image_reservation(text, [meta(0.90, 470_000)]) == 30_000
    assert image_reservation(text, []) is None
    assert image_reservation(text, [meta(0.95, 470_000)]) is None  # no text engine there
    m = _NAME.match("gemma-4-31b--bf16--img")
    assert m and (m["model"], m["key"], m["u"], m["img"]) == ("gemma-4-31b", "bf16", None, "--img")
    m = _NAME.match("qwen3-32b--fp8--u85")
    assert m and (m["key"], m["u"], m["img"]) == ("fp8", "85", None)


def test_sliding_window_kv_capacity_is_vllms_own_token_count() -> None:
    """With several KV cache groups (Gemma 4's sliding-window layers), capacity is vLLM's
    own token count (get_kv_cache_capacity), not blocks x block size, and the utilisations
    derived from the engine's memory profile keep its tokens per block."""
    from capplan.calibrate import store

    kv = {"gpu_memory_utilization": 0.9, "kv_tokens": 427136, "block_size": 16,
          "num_gpu_blocks": 26696, "kv_tensor_bytes": 69981962240,
          "available_kv_bytes": 69983805440, "kv_cache_groups": 6, "vllm_kv_tokens": 135225}
    meta = {"kv": kv, "versions": {"gpu_total_bytes": 150109880320}}
    pts = {p["gpu_memory_utilization"]: p for p in store.kv_points([meta], (0.85, 0.90, 0.95))}
    assert pts[0.90]["tokens"] == 135225 and pts[0.90]["derived"] == 0.0
    per_block = kv["kv_tensor_bytes"] / kv["num_gpu_blocks"]
    blocks = (kv["available_kv_bytes"] + 0.05 * 150109880320) // per_block
    assert pts[0.95]["tokens"] == pytest.approx(blocks * 135225 / 26696, abs=1)
    assert pts[0.85]["tokens"] < 135225 < pts[0.95]["tokens"]
    one_group = {**kv, "kv_cache_groups": 1}
    del one_group["vllm_kv_tokens"]
    assert store.kv_tokens(one_group) == 427136


def test_decode_floors_per_attention_kind() -> None:
    """The floor on each attention kind's per-context-token decode cost counts its own
    layers' KV bytes: the full-attention layers' over the whole context, the sliding
    layers' within their window; a model of one kind has one floor."""
    from capplan.calibrate.build import _context_kv_bytes

    hybrid = {"kv_cache_groups": 6, "kv_tensor_bytes": 1, "kv_tokens": 1}
    # Gemma 4 31B: 10 full layers x K and V x 4 heads x 512 x 2 bytes; 50 sliding layers x
    # K and V x 16 heads x 256 x 2 bytes
    assert _context_kv_bytes("gemma-4-31b", hybrid, "auto") == (10 * 2 * 4 * 512 * 2,
                                                                 50 * 2 * 16 * 256 * 2)
    assert _context_kv_bytes("gemma-4-31b", hybrid, "fp8") == (10 * 2 * 4 * 512,
                                                                50 * 2 * 16 * 256)
    llama = {"kv_cache_groups": 1, "kv_tensor_bytes": 131072 * 1000, "kv_tokens": 1000}
    assert _context_kv_bytes("llama-3.1-8b", llama, "auto") == (131072, 0.0)


def test_speculative_jobs_find_their_drafter() -> None:
    """Without --spec-model: Gemma 4's MTP engines load its drafter folder, Llama's
    draft-model engines capplan's Llama 3.2 1B; a model with MTP layers of its own gets no
    folder."""
    def drafter(model: str, method: str) -> str | None:
        job = ccli.plan_jobs(model, [ccli.Precision.FP8], [4], method, None, "auto", [0.90], 1)[0]
        assert job.key == f"fp8-{method}4"
        return job.spec_model

    assert drafter("gemma-4-31b", "mtp") == "models/gemma-4-31b-assistant"
    assert drafter("llama-3.1-8b", "draft_model") == "models/llama-3.2-1b"
    assert drafter("qwen3-32b", "mtp") is None


def test_speculative_graph_scan_batches_land_on_its_graph_sizes() -> None:
    """Under speculative decoding a decode-only step of B requests runs B (1 + k) tokens:
    the graph scan's batches fill each of vLLM's graph sizes for that k, once each (up to
    max_num_seqs requests)."""
    from capplan.calibrate.sweep import graph_points
    from capplan.steptime import cudagraph_capture_sizes

    for k in (0, 2, 4):
        pts = [p for p in graph_points(256, 8192, k) if p["context"] == 128]
        sizes = [s for s in cudagraph_capture_sizes(256, 8192, k) if s // (1 + k) <= 256]
        assert [p["batch"] * (1 + k) for p in pts] == sizes


def test_mixlen_pairs_read_as_much_kv_as_their_twins() -> None:
    """Each batch of unequal lengths follows a twin of one length with as many requests and
    (to a token a request) the same context summed: what the step model prices alike."""
    from capplan.calibrate.sweep import mixlen_points

    pts = [p for p in mixlen_points() if p["kind"] == "decode"]
    for twin, mix in zip(pts[::2], pts[1::2], strict=True):
        assert twin["batch"] == mix["batch"] and "groups" in mix and "groups" not in twin
        summed = sum(n * c for n, c in mix["groups"])
        assert 0 <= summed - twin["batch"] * twin["context"] < twin["batch"]
    mixed = [p for p in mixlen_points() if p["kind"] == "mixed"]
    assert len({p["batch"] * p["context"] for p in mixed}) == 1 < len(mixed)


def test_encoder_scan_engine_allows_images_and_times_only_the_encoder() -> None:
    """`--encoder-scan` adds one engine per timed one (k = 0), images allowed, whose plan
    holds encoder points (1-8 pictures of the default size, then one of each other size)
    and picture points, each beside its text-only twin after a warm-up of its shape; a
    model without a vision encoder is refused in one line."""
    from capplan.calibrate.build import _NAME

    jobs = ccli.plan_jobs("gemma-4-31b", [ccli.Precision.FP8], [0, 2], "mtp", None, "auto",
                          [0.90], 1, encoder_scan=True)
    enc = [j for j in jobs if j.encoder_scan]
    assert [j.name for j in enc] == ["gemma-4-31b--fp8--encoder"]
    args = enc[0].runner_args("m", "p.json", "o", "meta", 60)
    assert "--limit-images" not in args and "--kv-only" not in args
    plan = ccli._plan(enc[0], 60)
    points = plan["points"]
    assert {p["kind"] for p in points} == {"encoder", "picture"}
    pictures = [p for p in points if p["kind"] == "picture" and not p.get("warmup")]
    assert [(p["prompt"], p["batch"], p["images"]) for p in pictures] == [
        (580, 0, 1), (580, 0, 0), (580, 16, 1), (580, 16, 0), (400, 8, 1), (400, 8, 0)]
    assert {p["image_tokens"] for p in pictures} == {280}
    warm = [i for i, p in enumerate(points) if p.get("warmup")]
    assert len(warm) == 3
    for i in warm:  # each shape's warm-up comes just before its pair
        shape = (points[i]["prompt"], points[i]["batch"])
        assert [(p["prompt"], p["batch"], p.get("warmup")) for p in points[i + 1:i + 3]] == \
            [(*shape, None)] * 2
    points = [p for p in points if p["kind"] == "encoder"]
    assert [(p["images"], p["image_tokens"], p.get("built", False)) for p in points] == [
        (1, 280, False), (2, 280, False), (4, 280, False), (8, 280, False),
        (1, 70, True), (1, 140, True), (1, 560, True), (1, 1120, True)]
    m = _NAME.match("gemma-4-31b--fp8--encoder")
    assert m and (m["model"], m["key"], m["encoder"]) == ("gemma-4-31b", "fp8", "--encoder")
    with pytest.raises(ConfigError, match="no vision encoder"):
        ccli.plan_jobs("llama-3.1-8b", [ccli.Precision.BF16], [0], "draft_model", None,
                       "auto", [0.90], 1, encoder_scan=True)


def _encoder_run(raw: Path, name: str, floor_ms: float, us_per_token: float,
                 ns_per_token2: float) -> None:
    """An encoder scan's raw output as runner.py writes it (sweep.encoder_points): each
    picture costs `us_per_token` an image token and `ns_per_token2` a token squared, a pass
    at least `floor_ms`; the passes of a point spread by +-2 %."""
    lines = []
    for images, tokens in ((1, 280), (2, 280), (4, 280), (8, 280),
                           (1, 70), (1, 140), (1, 560), (1, 1120)):
        pid = f"encoder-i{images}-t{tokens}"
        work = images * (us_per_token * 1e-3 * tokens + ns_per_token2 * 1e-6 * tokens**2)
        wall = max(floor_ms, work) / 1e3
        for rep in range(5):
            lines.append({"kind": "encoder", "point": pid, "rep": rep, "images": images,
                          "image_tokens": tokens, "gpu_s": wall * 0.98, "launch_s": 2e-3,
                          "wall_s": wall * (1 + 0.01 * (rep - 2)), "tokens_out": images * tokens,
                          "inputs": "vllm-dummy", "pixel_values_shape": None})
        lines.append({"kind": "point_done", "point": pid, "steps": 5, "point_s": 1.0})
    (raw / f"{name}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (raw / f"{name}.meta.json").write_text(json.dumps({"kv": {"kv_tokens": 1}}))


def test_encoder_scan_prices_a_pass_and_serves_every_precision(tmp_path: Path) -> None:
    """The fit recovers a pass's floor, its cost an image token and a token squared from
    the points' median passes; the profile of another precision of the same model takes
    the same scan (the vision tower is not quantized), and one of another model none."""
    from capplan.calibrate.build import Group, encoder_time

    _encoder_run(tmp_path, "gemma-4-31b--fp8--encoder", 37.0, 66.0, 40.0)
    enc, note = encoder_time(tmp_path, Group("gemma-4-31b", "awq"))
    assert enc is not None and enc["run"] == "gemma-4-31b--fp8--encoder"
    assert enc["encoder_floor_s"] == pytest.approx(37e-3, rel=0.02)
    assert enc["encoder_token_s"] == pytest.approx(66e-6, rel=0.05)
    assert enc["encoder_token2_s"] == pytest.approx(40e-9, rel=0.1)
    for p in enc["points"]:  # every point priced as measured
        assert p["priced_ms"] == pytest.approx(p["wall_ms"], rel=0.02)
    assert "gemma-4-31b--fp8--encoder" in note and "one picture of 280" in note
    assert encoder_time(tmp_path, Group("qwen3-32b", "fp8")) == (None, "")


def _picture_steps(raw: Path, name: str, picture_ms: float | list[float],
                   twin_ms: float) -> None:
    """Picture points appended to an encoder run as runner.py writes them: each encoding
    step `picture_ms` (or the four steps' each), its twin's prefill step `twin_ms`, decode
    steps 12 ms, stamped by the GPU clock with the engine idle between steps."""
    lines, t = [], 0.0
    pics = picture_ms if isinstance(picture_ms, list) else [picture_ms] * 4
    for pid, enc, ms in (("warmup-picture-p580-b0", 280, [500.0] * 4),
                         ("picture-p580-i1", 280, pics), ("picture-p580-i0", 0, [twin_ms] * 4)):
        for rep in range(4):
            for step, (n, took) in enumerate(((580, ms[rep]), (0, 12.0))):
                rec = {"kind": "step", "point": pid, "step": 2 * rep + step, "t_sched0": t,
                       "t_sched1": t, "t_done": t + 1.0, "gpu_t0": t, "gpu_t1": t + took / 1e3,
                       "tokens": n or 1, "seqs": 1, "decode_seqs": 0 if n else 1,
                       "decode_ctx": 0 if n else 580, "spec_tokens": 0, "drafting_seqs": 0,
                       "prefill_seqs": 1 if n else 0, "prefill_tokens": n, "max_ctx": 581,
                       "chunks": [[n, 0]] if n else []}
                if n and enc:
                    rec["encoder_tokens"] = enc
                lines.append(rec)
                t += 2.0
        lines.append({"kind": "point_done", "point": pid, "steps": 8, "point_s": 1.0})
    with (raw / f"{name}.jsonl").open("a") as f:
        f.write("".join(json.dumps(x) + "\n" for x in lines))


def test_picture_points_price_what_a_step_that_encodes_costs_beyond_the_pass(
        tmp_path: Path) -> None:
    """A picture step less its text twin's, less the scan's pass, is the profile's
    encoder_step_s, and a step that encodes pays it beside the pass; a scan without picture
    points gives none (the profile keeps 0)."""
    from capplan.calibrate.build import Group, encoder_time

    _encoder_run(tmp_path, "gemma-4-31b--fp8--encoder", 37.0, 66.0, 40.0)
    enc, _ = encoder_time(tmp_path, Group("gemma-4-31b", "fp8"))
    assert enc is not None and "encoder_step_s" not in enc
    _picture_steps(tmp_path, "gemma-4-31b--fp8--encoder", picture_ms=160.0, twin_ms=60.0)
    enc, note = encoder_time(tmp_path, Group("gemma-4-31b", "fp8"))
    assert enc is not None
    (pt,) = enc["picture_points"]
    assert (pt["point"], pt["twin"], pt["steps"]) == ("picture-p580-i1", "picture-p580-i0", 4)
    assert pt["pass_ms"] == pytest.approx(37.0, rel=0.02)
    assert enc["encoder_step_s"] == pytest.approx((160.0 - 60.0 - 37.0) / 1e3, rel=0.02)
    assert enc["encoder_step_draws_s"] == pytest.approx([63e-3] * 4, rel=0.02)
    assert "a step that encodes one 63" in note


def test_picture_points_keep_every_step_for_the_simulator_to_draw(tmp_path: Path) -> None:
    """A picture's step is not one figure (on the H200 ~35-60 or ~75-145 ms beyond its twin, in
    spells): the profile keeps each measured step beyond twin and pass, sorted, and their
    median as encoder_step_s."""
    from capplan.calibrate.build import Group, encoder_time

    _encoder_run(tmp_path, "gemma-4-31b--fp8--encoder", 37.0, 66.0, 40.0)
    _picture_steps(tmp_path, "gemma-4-31b--fp8--encoder", picture_ms=[140.0, 190.0, 137.0, 192.0],
                   twin_ms=60.0)
    enc, note = encoder_time(tmp_path, Group("gemma-4-31b", "fp8"))
    assert enc is not None
    pass_ms = enc["picture_points"][0]["pass_ms"]
    assert [d * 1e3 for d in enc["encoder_step_draws_s"]] == pytest.approx(
        [ms - 60.0 - pass_ms for ms in (137.0, 140.0, 190.0, 192.0)], abs=0.02)
    assert enc["encoder_step_s"] * 1e3 == pytest.approx((140.0 + 190.0) / 2 - 60.0 - pass_ms,
                                                        abs=0.02)
    assert "drawn a step at a time from its 4 steps" in note
    # fast, slow, fast, slow, 4 s apart: the split between 140 and 190 ms, each spell 4 s
    assert enc["encoder_slow_above_s"] * 1e3 == pytest.approx(165.0 - 60.0 - pass_ms, abs=0.02)
    assert (enc["encoder_slow_spell_s"], enc["encoder_fast_spell_s"]) == pytest.approx((4.0, 4.0))
    assert "2 of them" in note and "slow spells of 4.00 s" in note


def test_spells_are_split_where_the_sample_splits_and_timed_as_they_end() -> None:
    """scans.slow_above splits a two-speed sample between its speeds; scans.spell_lengths is
    each state's time between observations over the times it ended, skipping gaps of
    SPELL_GAP_S or more, and 0, 0 where a state never ended."""
    from capplan.calibrate import scans

    assert scans.slow_above([0.01, 0.012, 0.011, 0.05, 0.052, 0.009]) == pytest.approx(0.031)
    seq = [(0.0, 0.0), (1.0, 0.1), (2.0, 0.1), (3.0, 0.0), (4.0, 0.0), (5.0, 0.1)]
    slow, fast = scans.spell_lengths([seq], 0.05)  # slow 2 s, ended once; fast 3 s, twice
    assert (slow, fast) == pytest.approx((2.0, 1.5))
    far = [(0.0, 0.0), (1.0, 0.1), (2.0, 0.1), (3.0, 0.0), (50.0, 0.0), (51.0, 0.1),
           (52.0, 0.0)]  # 3 -> 50 s says nothing: slow 3 s over 2 ends, fast 2 s over 2
    assert scans.spell_lengths([far], 0.05) == pytest.approx((1.5, 1.0))
    assert scans.spell_lengths([[(0.0, 0.0), (1.0, 0.0)]], 0.05) == (0.0, 0.0)


def test_every_encoder_run_of_an_engine_counts(tmp_path: Path) -> None:
    """An engine's repeat encoder runs (`--rN--encoder`) join its first: the pass is fitted
    to each point's quickest run (a run whose lone picture took a slow spell's 60 ms is
    not the pass), every run's picture steps are pooled against their own twins, and
    another precision of the model takes the same."""
    from capplan.calibrate.build import Group, encoder_time

    _encoder_run(tmp_path, "gemma-4-31b--fp8--encoder", 60.0, 66.0, 40.0)
    _picture_steps(tmp_path, "gemma-4-31b--fp8--encoder", picture_ms=160.0, twin_ms=60.0)
    _encoder_run(tmp_path, "gemma-4-31b--fp8--r2--encoder", 37.0, 66.0, 40.0)
    _picture_steps(tmp_path, "gemma-4-31b--fp8--r2--encoder", picture_ms=110.0, twin_ms=50.0)
    for key in ("fp8", "awq"):
        enc, note = encoder_time(tmp_path, Group("gemma-4-31b", key))
        assert enc is not None
        assert enc["runs"] == ["gemma-4-31b--fp8--encoder", "gemma-4-31b--fp8--r2--encoder"]
        assert enc["encoder_floor_s"] == pytest.approx(37e-3, rel=0.02)
        assert [d * 1e3 for d in enc["encoder_step_draws_s"]] == pytest.approx(
            [23.0] * 4 + [63.0] * 4, abs=1.0)
        assert "from its 8 steps" in note


def test_encoder_scan_refuses_a_run_that_cannot_separate_its_terms(tmp_path: Path) -> None:
    """Pictures of one size cannot tell the per-token term from the per-token-squared one."""
    from capplan.calibrate import scans

    _encoder_run(tmp_path, "x--fp8--encoder", 37.0, 66.0, 40.0)
    df = store.read_encoder_jsonl(tmp_path / "x--fp8--encoder.jsonl")
    with pytest.raises(CalibrationError, match="2 sizes"):
        scans.encoder_scan(df.filter(pl.col("image_tokens") == 280))


def test_a_step_pays_the_encoder_pass_of_its_pictures() -> None:
    """StepTimer.encoder_pass_s: a lone small picture pays the floor; pictures of one size
    pay per token and per token squared a picture, so one big picture costs more than as
    many tokens in small ones; a step adds the pass to its own time."""
    shipped = Profile.load(store.CALIBRATION_DIR / "h200" / "vllm-0.26.0" / "gemma-4-31b"
                           / "fp8" / "profile.json")
    step = shipped.step.model_copy(update={"encoder_token_s": 66e-6, "encoder_token2_s": 40e-9,
                                           "encoder_floor_s": 37e-3, "encoder_step_s": 0.0})
    t = StepTimer(shipped.model_copy(update={"step": step}), max_num_seqs=256,
                  max_num_batched_tokens=8192)
    assert t.encoder_pass_s(70, 1) == pytest.approx(37e-3)
    assert t.encoder_pass_s(8 * 280, 8) == pytest.approx(8 * (66e-6 * 280 + 40e-9 * 280**2))
    assert t.encoder_pass_s(1120, 1) > t.encoder_pass_s(1120, 4)
    plain = t.step_time_s(512, 1, 512 * 256, 0)
    assert t.step_time_s(512, 1, 512 * 256, 0, 280, encoder_images=1) == pytest.approx(
        plain + 37e-3)
    around = StepTimer(shipped.model_copy(update={"step": step.model_copy(
        update={"encoder_step_s": 60e-3})}), max_num_seqs=256, max_num_batched_tokens=8192)
    assert around.step_time_s(512, 1, 512 * 256, 0, 280, encoder_images=1) == pytest.approx(
        plain + 97e-3)
    assert around.step_time_s(512, 1, 512 * 256, 0) == pytest.approx(plain)
    assert around.step_time_s(512, 1, 512 * 256, 0, 280, encoder_images=1,  # one drawn
                              encoder_step_s=5e-3) == pytest.approx(plain + 42e-3)
    # within the largest CUDA graph the core's time is its piecewise launch, and with a
    # picture the encoder's too: vLLM runs it eagerly inside execute_model
    _, core = around.step_times(400, 1, 400 * 200, 0)
    work, launch = around.step_times(400, 1, 400 * 200, 0, 280, encoder_images=1,
                                     encoder_step_s=5e-3)
    assert core == shipped.step.core_piecewise_s > 0
    assert launch == pytest.approx(core + 42e-3) and launch < work


def test_a_measured_encoder_is_not_replaced_by_the_analytic_one() -> None:
    """profiles._with_encoder supplies only what calibration did not measure, and keeps
    the profile's own analytic terms beside the ones it adds."""
    from capplan.pool import Pool
    from capplan.profile import Profile
    from capplan.profiles import _with_encoder

    pool = Pool(name="v", model="gemma-4-31b", gpu="h200", precision="fp8")
    spec = ccli.load_model_spec("gemma-4-31b")
    shipped = Profile.load(store.CALIBRATION_DIR / "h200" / "vllm-0.26.0" / "gemma-4-31b"
                           / "fp8" / "profile.json")
    text_only = _with_encoder(shipped.model_copy(update={"step": shipped.step.model_copy(
        update={"encoder_token_s": 0.0})}), pool, spec, None)
    assert text_only.step.encoder_token_s > 0
    assert "vision encoder" in text_only.provenance.analytic_terms
    measured = shipped.model_copy(update={
        "step": shipped.step.model_copy(update={"encoder_token_s": 20e-6}),
        "provenance": shipped.provenance.model_copy(update={"analytic_terms": ("x",)})})
    out = _with_encoder(measured, pool, spec, None)
    assert out.step.encoder_token_s == 20e-6
    assert "vision encoder" not in out.provenance.analytic_terms
    # the measured FP8 profile has its image reservation: nothing to supply
    assert out is measured
    bf16 = measured.model_copy(update={"kv": measured.kv.model_copy(
        update={"image_reservation_tokens": 0.0, "image_reservation_blocks": 0.0})})
    out = _with_encoder(bf16, pool, spec, None)
    assert out.step.encoder_token_s == 20e-6
    assert out.provenance.analytic_terms == ("x", "image KV reservation")


def test_the_core_spread_scales_the_cores_time_not_a_pictures() -> None:
    """StepTimer.step_times' launch_factor (simulation.core_spread) scales the core's own
    time, within the largest CUDA graph and past it, but not the encoder's pass and the
    picture's drawn step, whose spread the draws carry; the GPU's work is not scaled."""
    shipped = Profile.load(store.CALIBRATION_DIR / "h200" / "vllm-0.26.0" / "gemma-4-31b"
                           / "fp8" / "profile.json")
    t = StepTimer(shipped, max_num_seqs=256, max_num_batched_tokens=8192)
    for tokens in (400, 600):  # piecewise, and past the largest graph
        work, launch = t.step_times(tokens, 1, tokens**2 / 2, 0, 280, encoder_step_s=0.05)
        work2, launch2 = t.step_times(tokens, 1, tokens**2 / 2, 0, 280, encoder_step_s=0.05,
                                      launch_factor=2.0)
        encoder = t.encoder_pass_s(280, 1) + 0.05
        assert work2 == work and launch2 - encoder == pytest.approx(2 * (launch - encoder))


def test_drain_scan_engine_traces_its_points_and_is_not_fitted(tmp_path: Path) -> None:
    """`--drain-scan` adds one engine per timed one (k = 0) whose plan holds the drain
    points and whose runner traces each of them after the plan; `--from-raw` leaves its run
    out of the profiles, and its queue line allows for the traced pass."""
    from capplan.calibrate.build import groups
    from capplan.calibrate.sweep import drain_points

    jobs = ccli.plan_jobs("llama-3.1-8b", [ccli.Precision.BF16], [0, 2], "draft_model", None,
                          "auto", [0.90], 1, drain_scan=True)
    drain = [j for j in jobs if j.drain_scan]
    assert [j.name for j in drain] == ["llama-3.1-8b--bf16--drain"]
    args = drain[0].runner_args("m", "p.json", "o", "meta", 60)
    ids = [p["id"] for p in drain_points()]
    assert args[args.index("--trace-points") + 1].split(",") == ids[:2] == [
        "decode-b128-c512", "drain-b128-c512"]
    assert "--trace-core" in args  # what names the call a drain's launch waits in
    plan = ccli._plan(drain[0], 60)
    assert [p["id"] for p in plan["points"] if not p.get("warmup")] == ids
    plain = next(j for j in jobs if j.name == "llama-3.1-8b--bf16")
    assert not {"--trace-points", "--trace-core"} & set(
        plain.runner_args("m", "p.json", "o", "meta", 60))
    lines = {ln.split("|")[0]: float(ln.split("|")[1])
             for ln in (ccli.queue_line(j, tmp_path, 60) for j in (plain, drain[0]))}
    assert lines["llama-3.1-8b--bf16--drain"] == pytest.approx(lines["llama-3.1-8b--bf16"] + 60)
    for name in ("m--bf16", "m--bf16--drain"):
        (tmp_path / f"{name}.meta.json").write_text(json.dumps({"kv": {}}))
        (tmp_path / f"{name}.jsonl").write_text("")
    assert [(g.main, len(g.metas)) for g in groups(tmp_path).values()] == [("m--bf16", 1)]
