"""What scripts/gpu_next.sh queues for the next lease can run there: a call that starts a GPU
host costs minutes of a session's 30, so a queue line naming a plan or an engine folder that
is not in the tree, or a validation job of an engine no suite holds, must fail here first."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = (ROOT / "scripts" / "gpu_next.sh").read_text()


def test_every_queue_line_names_a_plan_and_an_engine_in_the_tree() -> None:
    queues = re.findall(r"QUEUE0=(\S+)", SCRIPT)
    assert len(queues) <= 2, "a calibration queue for each GPU (H200, H100) at most"
    for q in queues:
        lines = [ln for ln in (ROOT / q).read_text().splitlines()
                 if ln.strip() and not ln.startswith("#")]
        assert lines, f"{q}: nothing queued"
        for ln in lines:
            name, min_s, args = ln.split("|")
            assert re.fullmatch(r"[a-z0-9.\-_]+", name) and float(min_s) > 0, ln
            argv = shlex.split(args)
            model = ROOT / argv[argv.index("--model") + 1]
            assert (model / "config.json").is_file(), f"{q}: {name}: no engine at {model}"
            if "--plan" in argv:
                plan = json.loads((ROOT / argv[argv.index("--plan") + 1]).read_text())
                assert [p for p in plan["points"] if not p.get("warmup")], f"{q}: {name}"


def test_every_validation_job_is_an_engine_of_the_next_suites() -> None:
    engines = {e["name"] for gpu in ("h200", "h100") for e in yaml.safe_load(
        (ROOT / "validation" / f"{gpu}-next.yaml").read_text())["engines"]}
    lanes = [lane.strip('"').split() for lane in re.findall(r'LANE0=("[^"]*"|\S+)', SCRIPT)]
    assert len(lanes) == 2 and all(lanes), lanes  # each GPU's lane runs one job or more
    jobs = [re.fullmatch(r"/tmp/keep/(\S+)\.json", j) for lane in lanes for j in lane]
    assert all(jobs), lanes
    assert {j.group(1) for j in jobs if j} <= engines, (lanes, engines)
