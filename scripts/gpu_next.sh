#!/usr/bin/env bash
# gpu_next.sh DEADLINE_S - the next lease's work, whichever GPU it brings: the last call of
# scripts/gpu_slim.sh's plan ends with `bash scripts/gpu_next.sh DEADLINE_S`, carrying
# validation/_jobs as `capplan validate emit validation/h{200,100}-next.yaml --out
# validation/_jobs` wrote it. Sent again on the same host, it resumes (gpu_session.sh).
#
# Queued by the thirty-eighth session (whose leases, two H100s and an H200, ran both GPUs'
# queues of then), the forty-second and the forty-eighth:
#   H200: the near-saturation Poisson rows of Llama-3.1-8B BF16 on one more lease, and
#         Qwen3-32B FP8's Poisson chat step- and core-traced (queued by the forty-second
#         session: the H200's Qwen3-32B has no graph-less core time yet;
#         validation/h200-next.yaml), then Llama-3.1-8B FP8 measured a fourth time
#         (calibration/_plans/queue-s38.txt);
#         (The forty-eighth session put Qwen3-32B FP8 serving lone prompts first,
#         qwen3-32b-fp8-h200-lone, and its calibration engine's lone-prompt scan,
#         calibration/_plans/queue-s48.txt, before the rest.)
#   H100: Qwen3-32B FP8 serving lone prompts of every size, one at a time and at 1.5 a
#         second (qwen3-32b-fp8-h100-lone, validation/h100-next.yaml: about 290 s with its
#         engine's start), then the same model's lone prompts at 44 token counts in the
#         calibration engine (calibration/_plans/h100/queue-s48.txt: stored as
#         qwen3-32b--fp8--r8, its steps join the fit; a call of its own after the other's),
#         both queued by the forty-eighth session.
# The forty-ninth session, its device time mostly spent on calls that found no machine, put
# both calibration scans first (the shape of a prompt step's cost by its token count is what
# the next model term needs) and the lone-prompt serving engines after them.
# The fifty-first session's H100 lease ran the H100's scan and lone engine (and the same scan
# on Qwen3-32B AWQ and Llama-3.1-8B FP8 and BF16) and queued Llama-3.1-8B FP8 serving lone
# prompts (llama-3.1-8b-fp8-h100-lone, validation/h100-next.yaml) for the next H100.
# The fifty-second session's H100 lease ran it (and calibration/_plans/h100/queue-s52.txt)
# and queued the same engine again (llama-3.1-8b-fp8-h100-lone2): whether its ITL tail and
# its launch speed belong to the host; before it, Qwen3-32B NVFP4's first H100 runs
# (calibration/_plans/h100/queue-s52b.txt: its main run and graph scan), so that an H100 pool
# in NVFP4 sizes on a measured profile. The fifty-third session's ran both
# (calibration/_plans/h100/queue-s53.txt; the main run reached 25 of its 43 points in its
# budget) and queued the rest of that plan and its whole graph scan (queue-s53b.txt), then the
# token budget's first serving rows between 512 and 8,192: examples/which-gpu.yaml's H100
# pool at a 1,024-token budget (qwen3-32b-fp8-h100-budget1k: the plan's advice says 2 H100s
# where 8,192 needs 4) and examples/token-budget.yaml's RAG prompts on both budgets
# (llama-3.1-8b-fp8-h100-budget1k, -budget8k); then Qwen3-32B NVFP4's first serving rows
# (qwen3-32b-nvfp4-h100), all in validation/h100-next.yaml. On the H100 the validation
# engines run first (they test plans' decisions), the queue after them. On an H200 the scan
# still runs first, then the token budget's twins on the H200 (llama-3.1-8b-fp8-budget1k,
# -budget8k, validation/h200-next.yaml), then the engines queued before. A call sent again on
# the same host goes on where the last stopped.
# The fifty-fourth session's H100 lease ran those four validation engines (not the queue) and
# queued Qwen3-32B NVFP4 serving again (qwen3-32b-nvfp4-h100-r2): whether its decode tail is
# the host's; then the calibration queue, now calibration/_plans/h100/queue-s54.txt: Llama-3.1-8B
# FP8's decodes at long contexts (its serving engines with ~6,000-token prompts decoded ~7 %
# over the profile's price), then queue-s53b.txt's two runs, unchanged.
# The fifty-fifth session's H100 lease ran all of that (the NVFP4 tail was the host's; the
# Llama decodes' 7 % was FlashAttention's last wave, now priced: src/capplan/tiles.py) and
# queued the tile rule served where it decides (llama-3.1-8b-fp8-h100-tiles: ~8,000-token
# prompts at 10, 16 and 17 users, the prediction recorded), then Qwen3-32B FP8's mixlen scan
# (calibration/_plans/h100/queue-s55b.txt). A second lease of that session ran the Llama
# engine (all 18 figures within target) and queued the same test on Qwen3-32B FP8
# (qwen3-32b-fp8-h100-tiles, prediction recorded) before the mixlen scan. On an H200 it put
# the same test on the H200's Llama-3.1-8B FP8 (llama-3.1-8b-fp8-h200-tiles: tile_rho 1.6
# there) at the head of the serving engines, after the scan.
# The fifty-sixth session's H100 lease (a third host) ran both (Qwen3-32B FP8's ITL p50 at
# 10, 16 and 17 users 20.4, 22.8, 27.3 ms against 20.2, 22.8, 28.1 predicted) and queued the
# token budget's RAG rows again on another host than the fifty-fourth's
# (llama-3.1-8b-fp8-h100-budget1k-r2, -budget8k-r2): at 1,024 tokens the second host ran much
# faster, its steps past the largest CUDA graph the host's launches. It queued the 1,024 row
# once more with the engine core traced (llama-3.1-8b-fp8-h100-budget1k-t, prediction
# recorded), which a third lease, come with too little time, did not run.
# The fifty-seventh session's H100 lease (a fifth host) ran it and queued the 2,048-token
# budget that examples/token-budget.yaml picks, on the same RAG traffic, core-traced
# (llama-3.1-8b-fp8-h100-budget2k-t), then the 1,024 row traced again on the same host
# (llama-3.1-8b-fp8-h100-budget1k-t2), both predictions recorded; a second lease (a sixth
# host) ran both and queued the one budget of examples/token-budget.yaml's H100 pool not yet
# served, 4,096, which the plan rejects at 3 prompts a second (llama-3.1-8b-fp8-h100-budget4k-t).
# The fifty-eighth session put the lone-prompt scan on the H200's Llama-3.1-8B BF16 and FP8
# ahead of Qwen3-32B FP8's (calibration/_plans/queue-s58.txt: its three runs): the H200's Llama
# profiles price a lone 2,048-token prompt 12 % over what the engine served. Its H100 lease (a
# host no session had had) ran the 4,096-token row and queued the 2,048-token one, the plan's
# closest to its SLO, on another host (llama-3.1-8b-fp8-h100-budget2k-t2, prediction recorded);
# a second H100 lease ran it and queued the same row on a third host (-budget2k-t3).
# The fifty-ninth session's H100 lease (a host no session had had) ran it and queued the
# 8,192-token row of the same plan core-traced (llama-3.1-8b-fp8-h100-budget8k-t, prediction
# recorded); a second H100 lease (another new host) ran it and queued Qwen3-32B FP8 at the
# same 2,048-token budget (qwen3-32b-fp8-h100-budget2k, prediction recorded), which a third
# lease started but had no time left to measure. No H200 came, so the H200 queue stands as
# the fifty-eighth left it.
# The sixtieth session's H100 lease (a host no session had had) ran it (ITL p99 132.3 ms
# against 147.4) and queued the same row core-traced (qwen3-32b-fp8-h100-budget2k-t,
# prediction recorded).
# A second H100 lease (another new host) ran it (ITL p99 139.9 ms) and queued the same
# traffic at a 4,096-token budget (qwen3-32b-fp8-h100-budget4k, prediction recorded), after the
# H100's FP8 profiles took the lone-prompt scan's price at a full row's count (eager_offset_s).
# The sixty-first session's H200 lease (the first H200 since the fifty-eighth queued them) ran
# queue-s58.txt's three lone-prompt scans (stored as r30 and r3; the H200's FP8 profiles now take
# eager_offset_s from them) and three serving engines (llama-3.1-8b-fp8-h200-tiles,
# llama-3.1-8b-fp8-budget1k, llama-3.1-8b-bf16-lease2). The H200 queue is now the serving
# engines left: Qwen3-32B FP8's core-traced Poisson chat first (its refitted profile has no
# floor under a graph-less step, and no serving trace of the core's time on one), then its lone
# prompts (the profile its new scan refitted, served), then the 8,192-token RAG twin.
# The sixty-second session's runners time the garbage collector (runner.py gc_launch_s,
# coretrace.py gc spans); its one late H100 call ran a core scan that says the collector is not
# what holds the slow launches (calibration/_raw/h100/logs-s62), so the queues are as they were.
# The sixty-fourth session's H100 lease (a host no session had had) ran qwen3-32b-fp8-h100-budget4k
# (ITL p99 202.2 ms against 200.8 recorded) and queued the same row core-traced
# (qwen3-32b-fp8-h100-budget4k-t, prediction recorded): a slow host, whose core's time on a
# graph-less step the median traced host's does not price. No H200 came; its queue stands.
set -u
deadline=${1:?DEADLINE_S}
mkdir -p /tmp/keep && cp validation/_jobs/*.json /tmp/keep/
if nvidia-smi -L | grep -q H200; then
  LANE0_FIRST=validate QUEUE0= \
    LANE0="/tmp/keep/qwen3-32b-fp8-h200-t.json /tmp/keep/qwen3-32b-fp8-h200-lone.json /tmp/keep/llama-3.1-8b-fp8-budget8k.json" \
    bash scripts/gpu_session.sh "$deadline"
else
  LANE0_FIRST=validate QUEUE0= \
    LANE0="/tmp/keep/qwen3-32b-fp8-h100-budget4k-t.json" \
    bash scripts/gpu_session.sh "$deadline"
fi
